"""What a summary of a folded span is checked against (issue 30 item 3's input).

:func:`span_strings` gives, for the messages a summary strategy folded, the exact strings the
ledger takes from them (each as ``(section, string)``) and their rules: what a summary that
kept everything would hold.  Pure, deterministic and bounded like the extraction it uses
(:mod:`.extract`); the ledger carries these strings whatever the summary kept, so the check
only counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..chat_messages import Message
from .extract import extract
from .items import COMMAND_ARROW, Item, Section

__all__ = ["check_section", "exact_string", "span_strings"]


def check_section(section: Section) -> str:
    """The name the summary check counts ``section`` under (``files``, ``open``...): lower
    case, one word, the labels its header and metric use."""
    return section.value.split()[0].lower()


def exact_string(item: Item) -> str:
    """The part of ``item`` a summary would have to hold verbatim: a command without its
    verdict, a path without the tool that named it, a number with its unit and what it
    measures, anything else as it is."""
    if item.section is Section.COMMANDS:
        return item.text.partition(COMMAND_ARROW)[0]
    if item.section is Section.FILES and item.text.endswith(")"):
        return item.text.rsplit(" (", 1)[0]
    return item.text


def span_strings(
    messages: Sequence[Message],
) -> tuple[list[tuple[str, str]], list[str]]:
    """The folded span's ledger items as ``(check_section, exact string)`` pairs, in the order
    extraction found them and each once, and its rules (verbatim), for ``messages``: the
    current forms of the folded groups' messages, oldest first."""
    items: list[tuple[str, str]] = []
    rules: list[str] = []
    seen: set[tuple[str, str]] = set()
    found, _ = extract(messages, _no_recall)  # together: a call meets its result
    for item in found:
        if item.section is Section.RULES:
            if item.text not in rules:
                rules.append(item.text)
            continue
        pair = (check_section(item.section), exact_string(item))
        if pair not in seen:
            seen.add(pair)
            items.append(pair)
    return items, rules


def _no_recall(message: Message) -> None:
    return None
