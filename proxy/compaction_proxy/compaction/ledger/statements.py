"""Rules and statements from a user's text, verbatim (see "The ledger" in docs/compaction.md).

The unit is a labelled line (``HARD CONSTRAINT: ...``), a list item, or else a sentence, taken
as it was written: never paraphrased, only cut (with an ellipsis) past
:data:`~.patterns.UNIT_CHARS`.  A unit is a *rule* when it has the force of one (a rule word:
never, always, must, don't, only, make sure...; a rule-like label; an item of a numbered
list); else a *statement* when it carries a value the user gave (any other upper-case label
such as ``FACT:``; a preference, "I prefer..."; a path, URL, identifier, date, amount or
number with a unit).  Anything else (prose without a value) is left to the summary.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import patterns as p
from .items import Item, Section


def units(text: str) -> Iterator[tuple[str, bool]]:
    """The units of ``text`` and whether each is an item of a numbered list."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if p.LABEL.match(line) or p.LIST_ITEM.match(line):
            yield line, bool(p.NUMBERED_ITEM.match(line))
            continue
        for sentence in p.SENTENCE_END.split(line):
            if sentence.strip():
                yield sentence.strip(), False


def _cut(unit: str) -> str:
    if len(unit) <= p.UNIT_CHARS:
        return unit
    return unit[: p.UNIT_CHARS - 1].rstrip() + "…"


def _has_value(unit: str) -> bool:
    return any(
        pattern.search(unit)
        for pattern in (
            p.URL,
            p.PATH,
            p.HASH,
            p.UUID,
            p.VERSION,
            p.TICKET,
            p.BACKTICK,
            p.NUMBER,
            p.DATE,
            p.MONEY,
        )
    )


def classify(unit: str, numbered: bool) -> Section | None:
    """The section ``unit`` belongs in (rules, statements) or ``None`` (left to the summary)."""
    label = p.LABEL.match(unit)
    if label is not None and label.group(1) not in p.LOG_LEVELS:  # a pasted log line is no label
        return Section.RULES if p.RULE_LABEL.search(label.group(1)) else Section.STATEMENTS
    if numbered or p.RULE_WORDS.search(unit):
        return Section.RULES
    if p.PREFERENCE.search(unit) or _has_value(unit):
        return Section.STATEMENTS
    return None


def user_items(text: str, recall: str | None) -> list[Item]:
    """The rules and statements of one user message's ``text`` (already bounded)."""
    found: list[Item] = []
    for unit, numbered in units(text):
        section = classify(unit, numbered)
        if section is not None:
            found.append(Item(section, _cut(unit), recall))
    if len(found) > p.USER_UNITS:
        half = p.USER_UNITS // 2
        found = found[:half] + found[-half:]
    return found
