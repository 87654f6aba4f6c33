"""The ledger of one compaction run, kept by the draft at its decision points.

A :class:`~..draft.Draft` with a :class:`DraftLedger` hands it every group it drops or replaces
and every message it edits, in their current form, before the change (:meth:`DraftLedger.fold`):
the items are extracted there (:mod:`.extract`), merged into the ledger the request came with
(parsed back from its message, :mod:`.render`), and the block's tokens are kept as the header's
plus each item line's, counted once (:meth:`DraftLedger.extra_tokens`: what the block adds to
the prompt beyond the ledger message already in it).  So the block is counted inside every
target a strategy checks while it folds, and a rollback of the draft restores the ledger with it
(:meth:`snapshot`, :meth:`restore`).

Bounded by ``share`` of the budget: past it, items are left out, artifacts first, then
statements, least-referenced and oldest first.  Pinned items (the rules, and the statements
the user flagged with a label such as ``FACT:``: :attr:`~.items.Item.pinned`) are the user's
own words: the share neither counts nor drops them (only the pipeline's last release does,
:meth:`release`).  What is left out is counted (:attr:`left_out`); its original
was folded like the rest, so with recall on it is in the archive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..chat_messages import Message
from ..tokens import Tokenizer
from .extract import RecallOf, extract
from .items import Item, Ledger, LedgerState, Section, label_of
from .render import parse, render, render_line

__all__ = ["DraftLedger", "LedgerSnapshot"]

LedgerSnapshot = tuple[LedgerState, bool, int, int]
"""A ledger as values: its items, whether it changed, and the counts left out and released."""


class DraftLedger:
    """See the module docstring.  ``existing``: the ledger message the request carries (or
    ``None``) and its tokens; ``role``: the role a new ledger message takes (the summary
    placement's); ``recall_of``: the recall id of a folded message (``None``: recall off)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        share: float,
        budget: int,
        role: str = "user",
        existing: tuple[Message, int] | None = None,
        recall_of: RecallOf | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.role = role
        self.limit = math.floor(share * budget)
        self.existing = existing
        self._recall_of: RecallOf = recall_of or _no_recall
        content = existing[0].get("content") if existing is not None else None
        self._ledger = Ledger(tuple(parse(content)) if isinstance(content, str) else ())
        self._base = existing[1] if existing is not None else 0
        self._costs: dict[str, int] = {}
        self._header = self._count_message(render([]))
        self._all, self._loose = _Tally(), _Tally()
        self._recount()
        self.changed = False
        self.left_out = 0
        self.released = 0
        self._gone: list[tuple[Item, tuple[int, int]]] = []

    # ------------------------------------------------------------------ tokens
    def _count_message(self, text: str) -> int:
        return self._tokenizer.count_message({"role": self.role, "content": text})

    def _cost(self, line: str) -> int:
        cost = self._costs.get(line)
        if cost is None:
            cost = self._costs[line] = self._tokenizer.count_text(line) + 1
        return cost

    def tokens(self, *, pinned: bool = True) -> int:
        """The block's tokens as rendered now (header + one count per line; 0 when empty);
        without ``pinned``: the part the share bounds (the pinned items' lines left out).
        Kept as running sums (:class:`_Tally`), so a strategy's target check costs O(1)."""
        return self._all.tokens(self._header) if pinned else self._loose.tokens(self._header)

    def _count(self, item: Item, sign: int) -> None:
        """Count ``item`` in (``sign`` 1) or out (-1) of the running sums."""
        cost = self._cost(render_line(item))
        heading = self._cost(f"{item.section.value}:")
        label = label_of(item)
        group = (item.section, label, self._cost(f"{label}:")) if label is not None else None
        self._all.count(item.section, cost, heading, sign, group)
        if not item.pinned:
            self._loose.count(item.section, cost, heading, sign, group)

    def _recount(self) -> None:
        self._all, self._loose = _Tally(), _Tally()
        for item in self._ledger.entries():
            self._count(item, 1)

    def _add(self, item: Item) -> bool:
        changed, old = self._ledger.add(item)
        if old is not None:
            self._count(old, -1)
        if changed:
            self._count(item, 1)
        return changed

    def _remove(self, item: Item) -> tuple[int, int] | None:
        place = self._ledger.remove(item)
        self._count(item, -1)
        return place

    def _put_back(self, item: Item, place: tuple[int, int]) -> None:
        self._ledger.put_back(item, place)
        self._count(item, 1)

    def extra_tokens(self) -> int:
        """What the block adds to the prompt beyond the ledger message already in it."""
        return self.tokens() - self._base if self.changed else 0

    # ------------------------------------------------------------------ decisions
    def fold(self, members: Sequence[Message]) -> None:
        """A group of ``members`` (their current forms) is being folded: merge its items."""
        items, closed = extract(members, self._recall_of)
        changed = False
        for item in items:
            changed = self._add(item) or changed
        for key in closed:
            gone = self._ledger.done(key)
            if gone is not None:
                self._count(gone, -1)
                changed = True
        if changed:
            self.changed = True
            self._bound()

    def _bound(self) -> None:
        """Leave items out while the artifacts and statements are over the share (the pinned
        ones, rules and flagged statements, are neither left out by the share nor counted)."""
        if self.tokens(pinned=False) <= self.limit:
            return
        for item in self._ledger.release_order():
            self._remove(item)
            self.left_out += 1
            if self.tokens(pinned=False) <= self.limit:
                return

    def release(self, over: Callable[[], bool], *, pinned: bool) -> int:
        """Leave items out (artifacts, statements; with ``pinned`` then the flagged statements
        and the rules) while ``over()`` holds: the pipeline's release when the budget cannot be
        met otherwise; returns how many went."""
        gone = 0
        for item in self._ledger.release_order(pinned=pinned):
            if not over():
                break
            place = self._remove(item)
            if place is not None:
                self._gone.append((item, place))
            self.changed = True
            gone += 1
        self.released += gone
        return gone

    def refill(self, over: Callable[[], bool]) -> int:
        """Put back the released items that fit after all (``over()`` false with one back),
        the last released, the most valued, first: a release goes one item at a time, so the
        last one often freed more than was needed, and a smaller item still fits in what it
        left.  Each comes back at its old place; returns how many came back."""
        back, kept = 0, []
        for item, place in reversed(self._gone):
            self._put_back(item, place)
            if over():
                self._remove(item)
                kept.append((item, place))
            else:
                back += 1
        self._gone = kept[::-1]
        self.released -= back
        return back

    # ------------------------------------------------------------------ output
    def items(self) -> list[Item]:
        return self._ledger.items()

    def message(self) -> Message | None:
        """The ledger message to forward (``None``: no items); the existing one when nothing
        changed, or when its text is what the items render to."""
        items = self._ledger.items()
        if not items:
            return None
        text = render(items)
        if self.existing is not None and self.existing[0].get("content") == text:
            return self.existing[0]
        role = self.existing[0].get("role", self.role) if self.existing else self.role
        return {"role": role, "content": text}

    def empty_message(self) -> Message:
        """The ledger message with no item left (every one released)."""
        role = self.existing[0].get("role", self.role) if self.existing else self.role
        return {"role": role, "content": render([])}

    def snapshot(self) -> LedgerSnapshot:
        return (self._ledger.state(), self.changed, self.left_out, self.released)

    def restore(self, snapshot: LedgerSnapshot) -> None:
        state, self.changed, self.left_out, self.released = snapshot
        self._gone = []
        self._ledger = Ledger.from_state(state)
        self._recount()


class _Tally:
    """Running sums of a set of item lines: their tokens, and per section and per label how
    many (a section's heading, and a label's line, is counted while it has one)."""

    __slots__ = ("headings", "lines", "members")

    def __init__(self) -> None:
        self.lines = 0
        self.headings = 0
        self.members: dict[object, int] = {}

    def count(
        self,
        section: Section,
        cost: int,
        heading: int,
        sign: int,
        group: tuple[Section, str, int] | None = None,
    ) -> None:
        """Count a line of ``cost`` in (``sign`` 1) or out (-1): in ``section`` (whose heading
        costs ``heading``) and, for a labelled line, in ``group`` (section, label, the label
        line's cost)."""
        self.lines += sign * cost
        self._member(section, heading, sign)
        if group is not None:
            self._member(group[:2], group[2], sign)

    def _member(self, key: object, heading: int, sign: int) -> None:
        before = self.members.get(key, 0)
        after = before + sign
        self.members[key] = after
        if before == 0 and after > 0:
            self.headings += heading
        elif before > 0 and after == 0:
            self.headings -= heading

    def tokens(self, header: int) -> int:
        return header + self.headings + self.lines if self.lines else 0


def _no_recall(message: Message) -> str | None:
    return None
