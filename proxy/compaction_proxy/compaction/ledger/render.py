"""The ledger message's text: rendered compactly and stably, and parsed back.

::

    <ledger>
    Verbatim from the compacted turns:
    Rules:
    - Never push to main.
    Statements:
    FACT:
    - The production database is Postgres 15.
    - The deadline is 2027-08-09.
    Files:
    edit_file:
    - src/app/db.py [recall id r…]
    - src/app/models.py
    </ledger>

Sections in a fixed order, items oldest first, one line each, nothing that changes unless an
item does (no counts, no timestamps), so a run that adds nothing forwards the same bytes.
In the statements, the lines the user opened with an upper-case label (``FACT: ...``) are
listed under that label, once, after the section's other statements: a session's facts, goals
and preferences often share a handful of labels, and the label said once per group leaves room
for more of them (the line is still the user's, label and all, when parsed back). The files
are listed under the tool that touched them the same way (a loop reads and edits dozens).
Rules are never regrouped: each is forwarded on its line exactly as the user wrote it.
:func:`parse` gives back the items :func:`render` wrote (``render(parse(t)) == t``): the next
fold merges into the ledger from the forwarded text, and a checkpoint, which stores messages,
carries it as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..marks import original_mark
from .items import Item, Section, display_order, join_group, split_group

LEDGER_PREFIX = "<ledger>"
"""The exact opening of the ledger message (the view recognises it, :mod:`..view`)."""

LEDGER_CLOSE = "</ledger>"
"""The exact end of the ledger message."""

LEDGER_HEADER = "Verbatim from the compacted turns:"
"""The line under the opening tag: tells the model what the block is, in few tokens (the
block is on every request of a long session)."""

_EARLIER_HEADERS = (
    "Kept verbatim from the compacted part of this conversation (a summary may omit it):",
)
"""Headers earlier versions wrote: a ledger a client sends back with one is still the proxy's
(parsed, merged, and rewritten with :data:`LEDGER_HEADER` only when an item changes)."""

_SECTIONS = {f"{section.value}:": section for section in Section}
_RECALL = re.compile(r"^(.*) \[recall id (r[a-z2-7]{11})\]$")
_GROUP_LINE: dict[Section, re.Pattern[str]] = {
    Section.STATEMENTS: re.compile(r"^([A-Z][A-Z0-9]*(?:[ _/-][A-Z0-9]+){0,3}):$"),
    Section.FILES: re.compile(r"^([A-Za-z0-9_.-]{1,64}):$"),
}


def render_line(item: Item) -> str:
    """One item's line (without its newline); under its group, without the group's part."""
    split = split_group(item)
    return _line(split[1] if split is not None else item.text, item.recall)


def _line(text: str, recall: str | None) -> str:
    return f"- {text}{original_mark(recall) if recall else ''}"


def render(items: Sequence[Item]) -> str:
    """The ledger message's text for ``items`` (in their :func:`~.items.display_order`: by
    section, and in the statements and files each group's lines under it, after the rest)."""
    lines = [LEDGER_PREFIX, LEDGER_HEADER]
    section: Section | None = None
    label: str | None = None
    for item in display_order(items):
        if item.section is not section:
            section, label = item.section, None
            lines.append(f"{section.value}:")
        split = split_group(item)
        if split is not None and split[0] != label:
            label = split[0]
            lines.append(f"{label}:")
        lines.append(_line(split[1] if split is not None else item.text, item.recall))
    lines.append(LEDGER_CLOSE)
    return "\n".join(lines)


def _header(text: str) -> str | None:
    """The header ``text`` opens with, when it is in the ledger's exact wrapper."""
    if not text.endswith(f"\n{LEDGER_CLOSE}"):
        return None
    for header in (LEDGER_HEADER, *_EARLIER_HEADERS):
        if text.startswith(f"{LEDGER_PREFIX}\n{header}\n"):
            return header
    return None


def is_ledger(text: object) -> bool:
    """True for a text in the ledger's exact wrapper (opening tag, header, closing tag)."""
    return isinstance(text, str) and _header(text) is not None


def parse(text: str) -> list[Item]:
    """The items of a ledger text :func:`render` wrote (lines it did not write are skipped)."""
    header = _header(text)
    if header is None:
        return []
    body = text[len(LEDGER_PREFIX) + len(header) + 2 : -len(LEDGER_CLOSE) - 1]
    items: list[Item] = []
    section: Section | None = None
    group: str | None = None
    for line in body.split("\n"):
        grouping = _GROUP_LINE.get(section) if section is not None else None
        heading = grouping.match(line) if grouping is not None else None
        if line in _SECTIONS:
            section, group = _SECTIONS[line], None
        elif section is not None and heading is not None:
            group = heading.group(1)
        elif section is not None and line.startswith("- "):
            found = _RECALL.match(line[2:])
            text, recall = (found.group(1), found.group(2)) if found else (line[2:], None)
            if group is not None:
                text = join_group(section, group, text)
            items.append(Item(section, text, recall))
    return items
