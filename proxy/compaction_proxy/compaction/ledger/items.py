"""The ledger's items and how they merge across folds (see "The ledger" in docs/compaction.md).

An item is one exact string the compacted part of a conversation held (a rule the user stated,
a path, a command and its verdict...), in one of the fixed :class:`Section` s.  Its *key* is a
function of its section and text alone (:func:`item_key`), so a ledger parsed back from the
forwarded text merges exactly as the one that wrote it: the same key is the same item (kept
once), and a newer text under the same key supersedes the older (``X = v`` for the same ``X``,
a command run again, a rule restated with other values).  A number is its own key: the same
label may measure another subject (one module's p99, then another's), and a value measured
again is a before and an after the agent compares, so both are kept (the share bounds them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from .patterns import LABEL, LOG_LEVELS

__all__ = ["ARTIFACTS", "Item", "Ledger", "Section", "item_key"]


class Section(StrEnum):
    """The ledger's sections, in the order they are rendered."""

    RULES = "Rules"
    STATEMENTS = "Statements"
    FILES = "Files"
    COMMANDS = "Commands"
    ERRORS = "Errors"
    URLS = "URLs"
    IDENTIFIERS = "Identifiers"
    NUMBERS = "Numbers"
    OPEN = "Open work"


_RANK = {section: rank for rank, section in enumerate(Section)}

ARTIFACTS = frozenset(Section) - {Section.RULES, Section.STATEMENTS}
"""What the share bound drops first (then statements; pinned items never by the bound)."""

COMMAND_ARROW = " -> "
"""Between a command and its verdict in a Commands item."""

_VALUE = re.compile(r"(?<![\w./-])[-+$€£]?\d[\w.,:/-]*")
_ASSIGN = re.compile(r"^`?([A-Za-z_][\w.\-/]*)`?\s*(?:=|:=|\bis\b|\bset to\b|\bnow\b)\s*\S")
_SPACE = re.compile(r"\s+")
_OPEN_MARKER = re.compile(
    r"^\s*(?:[-*]\s*)?(?:todo|next steps?|next|still need to|remaining|done|fixed|completed|"
    r"finished)\b[:\s-]*",
    re.IGNORECASE,
)


def _masked(text: str) -> str:
    """``text`` with its values (a token that starts with a digit where a word starts:
    numbers, dates, amounts, versions) masked, lower-case: what a restated rule or a
    re-measured number has in common with the older one.  Names are not masked, digits and
    all: "use `black`" and "use `ruff`", ``RULE-45`` and ``RULE-46``, ``keep-1.csv`` and
    ``keep-2.csv`` are two rules each."""
    return _SPACE.sub(" ", _VALUE.sub("#", text)).strip().lower()


def item_key(section: Section, text: str) -> str:
    """The normalised key items of ``section`` are deduplicated and superseded by."""
    if section is Section.COMMANDS:
        return _SPACE.sub(" ", text.partition(COMMAND_ARROW)[0]).strip()
    if section is Section.IDENTIFIERS:
        found = _ASSIGN.match(text)
        return "=" + found.group(1) if found else text
    if section is Section.OPEN:
        text = _OPEN_MARKER.sub("", text)
    if section is Section.NUMBERS:
        return _SPACE.sub(" ", text).strip()
    if section in (Section.RULES, Section.STATEMENTS, Section.OPEN):
        masked = _masked(text)
        return masked if masked.strip("# ") else text
    if section is Section.FILES:
        return text.rsplit(" (", 1)[0] if text.endswith(")") else text
    return text


@dataclass(frozen=True, slots=True)
class Item:
    """One exact string: its section, its text (one line), the recall id of the original it
    came from (when recall is on), and its key (:func:`item_key`)."""

    section: Section
    text: str
    recall: str | None = None

    @property
    def key(self) -> str:
        return item_key(self.section, self.text)

    @property
    def pinned(self) -> bool:
        """A rule, or a statement the user flagged with a label (``FACT: ...``): the user's
        own words, which the share neither counts nor drops (they go last, with the rules)."""
        return self.section is Section.RULES or (
            self.section is Section.STATEMENTS and flagged(self.text)
        )


_OPENING_LABEL = re.compile(r"^([A-Z][A-Z0-9]*(?:[ _/-][A-Z0-9]+){0,3}): (?=\S)")
_TOOL_SUFFIX = re.compile(r"(?<=\S) \(([A-Za-z0-9_.-]{1,64})\)$")
_HEADINGS = frozenset(section.value for section in Section)


def split_group(item: Item) -> tuple[str, str] | None:
    """(the group ``item`` is listed under, its line's text without it), or ``None``: a
    statement's opening ``LABEL: `` (not a log level), a file's closing `` (tool)``. No other
    section is grouped: a rule is forwarded on its line exactly as the user wrote it."""
    if item.section is Section.STATEMENTS:
        found = _OPENING_LABEL.match(item.text)
        if found is None or found.group(1) in LOG_LEVELS:
            return None
        return found.group(1), item.text[found.end() :]
    if item.section is Section.FILES:
        found = _TOOL_SUFFIX.search(item.text)
        if found is None or found.group(1) in _HEADINGS:
            return None
        return found.group(1), item.text[: found.start()]
    return None


def join_group(section: Section, group: str, rest: str) -> str:
    """The item text :func:`split_group` split into ``group`` and ``rest``."""
    return f"{group}: {rest}" if section is Section.STATEMENTS else f"{rest} ({group})"


def label_of(item: Item) -> str | None:
    """The group ``item`` is listed under (:func:`split_group`), or ``None``."""
    split = split_group(item)
    return split[0] if split is not None else None


def display_order(items: Sequence[Item]) -> list[Item]:
    """``items`` as the ledger lists them: each run of one section with its unlabelled items
    first, then each group's items (groups in the order of their first item, as
    :func:`split_group` says); otherwise in the order given."""
    out: list[Item] = []
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and items[end].section is items[start].section:
            end += 1
        groups: dict[str, list[Item]] = {}
        for item in items[start:end]:
            label = label_of(item)
            if label is None:
                out.append(item)
            else:
                groups.setdefault(label, []).append(item)
        for members in groups.values():
            out += members
        start = end
    return out


def flagged(text: str) -> bool:
    """True for a line that starts with an upper-case label the user flags it with (not a log
    level: a pasted ``INFO: ...`` line is not the user's)."""
    found = LABEL.match(text)
    return found is not None and found.group(1) not in LOG_LEVELS


@dataclass(slots=True)
class _Entry:
    item: Item
    order: int
    refs: int


LedgerState = tuple[tuple[tuple[Section, str], Item, int, int], ...]
"""A ledger as values (for a draft's savepoint): per entry its key, item, order and refs."""


class Ledger:
    """The items of one conversation's ledger, merged as folds add to it.

    ``add`` dedupes by (section, key), supersedes an older text under the same key (the item
    moves to the newest position: it was just seen), and counts references (an item seen again
    is referenced once more: least-referenced items go first under the share bound).
    """

    __slots__ = ("_entries", "_next")

    def __init__(self, items: tuple[Item, ...] = ()) -> None:
        self._entries: dict[tuple[Section, str], _Entry] = {}
        self._next = 0
        for item in items:
            self.add(item)

    def add(self, item: Item) -> tuple[bool, Item | None]:
        """Merge ``item``; returns whether the rendered ledger changed, and the item it
        superseded (if any)."""
        key = (item.section, item.key)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(item, self._next, 1)
            self._next += 1
            return True, None
        entry.refs += 1
        if entry.item.text == item.text:
            return False, None
        old = entry.item
        entry.item = Item(item.section, item.text, item.recall or old.recall)
        entry.order = self._next
        self._next += 1
        return True, old

    def done(self, key: str) -> Item | None:
        """Remove the open-work item of ``key`` (it got done); returns it, if there was one."""
        entry = self._entries.pop((Section.OPEN, key), None)
        return entry.item if entry is not None else None

    def remove(self, item: Item) -> tuple[int, int] | None:
        """Leave ``item`` out (the share bound, a release); returns its place (order, refs),
        so :meth:`put_back` can restore it where it was."""
        entry = self._entries.pop((item.section, item.key), None)
        return (entry.order, entry.refs) if entry is not None else None

    def put_back(self, item: Item, place: tuple[int, int]) -> None:
        """Restore an item :meth:`remove` left out, at its old ``place``."""
        self._entries[(item.section, item.key)] = _Entry(item, *place)

    def items(self) -> list[Item]:
        """The items in rendering order: by section, oldest first within one (labelled lines
        under their label, :func:`display_order`)."""
        ranked = sorted(self._entries.values(), key=lambda e: (_RANK[e.item.section], e.order))
        return display_order([e.item for e in ranked])

    def entries(self) -> list[Item]:
        """The items in no particular order (cheaper than :meth:`items`)."""
        return [e.item for e in self._entries.values()]

    def release_order(self, *, pinned: bool = False) -> list[Item]:
        """The items the share bound (or a release) leaves out first: artifacts, then
        statements, each least-referenced and oldest first; with ``pinned`` then the flagged
        statements, then the rules (:attr:`Item.pinned`)."""
        tiers: list[tuple[frozenset[Section], bool]] = [
            (ARTIFACTS, False),
            (frozenset({Section.STATEMENTS}), False),
        ]
        if pinned:
            tiers += [(frozenset({Section.STATEMENTS}), True), (frozenset({Section.RULES}), True)]
        out: list[Item] = []
        for sections, tier_pinned in tiers:
            chosen = [
                e
                for e in self._entries.values()
                if e.item.section in sections and e.item.pinned is tier_pinned
            ]
            chosen.sort(key=lambda e: (e.refs, e.order))
            out.extend(e.item for e in chosen)
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def state(self) -> LedgerState:
        return tuple((k, e.item, e.order, e.refs) for k, e in self._entries.items())

    @classmethod
    def from_state(cls, state: LedgerState) -> Ledger:
        ledger = cls()
        for key, item, order, refs in state:
            ledger._entries[key] = _Entry(item, order, refs)
            ledger._next = max(ledger._next, order + 1)
        return ledger
