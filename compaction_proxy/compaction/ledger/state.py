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
statements, least-referenced and oldest first; rules never by the share (only the pipeline's
last release, :meth:`release`).  What is left out is counted (:attr:`left_out`); its original
was folded like the rest, so with recall on it is in the archive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..messages import Message
from ..tokens import Tokenizer
from .extract import RecallOf, extract
from .items import Item, Ledger, LedgerState, Section
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
        self.changed = False
        self.left_out = 0
        self.released = 0

    # ------------------------------------------------------------------ tokens
    def _count_message(self, text: str) -> int:
        return self._tokenizer.count_message({"role": self.role, "content": text})

    def _cost(self, line: str) -> int:
        cost = self._costs.get(line)
        if cost is None:
            cost = self._costs[line] = self._tokenizer.count_text(line) + 1
        return cost

    def tokens(self) -> int:
        """The block's tokens as rendered now (header + one count per line; 0 when empty)."""
        items = self._ledger.items()
        if not items:
            return 0
        total = self._header
        section: Section | None = None
        for item in items:
            if item.section is not section:
                section = item.section
                total += self._cost(f"{section.value}:")
            total += self._cost(render_line(item))
        return total

    def extra_tokens(self) -> int:
        """What the block adds to the prompt beyond the ledger message already in it."""
        return self.tokens() - self._base if self.changed else 0

    # ------------------------------------------------------------------ decisions
    def fold(self, members: Sequence[Message]) -> None:
        """A group of ``members`` (their current forms) is being folded: merge its items."""
        items, closed = extract(members, self._recall_of)
        changed = False
        for item in items:
            changed = self._ledger.add(item) or changed
        for key in closed:
            changed = self._ledger.done(key) or changed
        if changed:
            self.changed = True
            self._bound()

    def _bound(self) -> None:
        """Leave items out while the block is over its share (rules stay)."""
        if self.tokens() <= self.limit:
            return
        for item in self._ledger.release_order():
            self._ledger.remove(item)
            self.left_out += 1
            if self.tokens() <= self.limit:
                return

    def release(self, over: Callable[[], bool], *, rules: bool) -> int:
        """Leave items out (artifacts, statements, with ``rules`` then rules) while ``over()``
        holds: the pipeline's release when the budget cannot be met otherwise; returns how
        many went."""
        gone = 0
        for item in self._ledger.release_order(rules=rules):
            if not over():
                break
            if not rules and item.section is Section.RULES:
                break
            self._ledger.remove(item)
            self.changed = True
            gone += 1
        self.released += gone
        return gone

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
        self._ledger = Ledger.from_state(state)


def _no_recall(message: Message) -> str | None:
    return None
