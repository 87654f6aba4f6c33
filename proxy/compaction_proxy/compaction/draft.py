"""The working state strategies act on.

A :class:`Draft` sits over a :class:`~.view.ConversationView` and records decisions instead of
building new lists: per group *kept*, *dropped* or *replaced* by new messages; per message an
edited copy (e.g. a trimmed tool result that keeps its ``tool_call_id`` and other fields); and
synthetic messages inserted before a position (a summary right after the system prompt).
Totals (tokens, messages, groups, live turns, tool-call groups) are kept incrementally
(:mod:`.draft_totals`), so a strategy can re-check its target after every step in O(1).

The draft enforces the invariants: system groups, the proxy's ledger, the newest user message and
the newest step ("Groups and invariants" in compaction_proxy/compaction/README.md) are protected
(touching them
raises :class:`ProtectedGroupError`); decisions are per whole group (invariant 3).

*Pinned* groups (a summary, the user messages carried beside it) are protected the same way for
the rest of a run (:mod:`.draft_pins`); strategies skip them.  Messages a strategy paid for (a
summary) are recorded in :attr:`paid`.  :meth:`savepoint` and :meth:`rollback` undo a
committed strategy whose saving was too small (:mod:`.strategies._support.churn`).  With
``recall``, the draft marks and archives at its decision points (:mod:`.draft_recall`); an edit
recall refuses is not made (:meth:`edit` returns ``False``).  With a :attr:`ledger`, it hands the
ledger what each decision folds (:mod:`.ledger.state`), and counts the ledger's growth in
:attr:`prompt_tokens`.

:meth:`project` renders the output: original relative order, a replaced group's messages at the
group's first position, inserted messages before their position.  :meth:`commit` re-bases the
draft on its own projection (re-grouping it lazily, on the first use of anything that depends on
the groups, reusing every known count) so the next strategy sees an ordinary view.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .archive import Archived, RecallIds
from .budget import Budget, Calibration
from .canonical import canonical_bytes
from .changes import ChangeCounters, GroupState, Savepoint
from .chat_messages import Message, has_tool_calls, role_of
from .draft_pins import Pins
from .draft_recall import DraftRecall
from .draft_totals import Totals
from .errors import CompactionProxyError
from .ledger.state import DraftLedger
from .projection import edited_view, grouping_key, project
from .tokens import Tokenizer
from .triggers import Metrics
from .view import (
    DEFAULT_SUMMARY_MARKER,
    ConversationView,
    Group,
    GroupKind,
    MessageStats,
    SummaryMarker,
    build_view,
)

__all__ = ["ChangeCounters", "Draft", "GroupState", "ProtectedGroupError", "Savepoint"]


class ProtectedGroupError(CompactionProxyError, RuntimeError):
    """A strategy tried to change a protected group (a bug in the strategy)."""


class Draft:
    """Mutable compaction state over an immutable view; see the module docstring."""

    def __init__(
        self,
        view: ConversationView,
        *,
        tokenizer: Tokenizer,
        budget: Budget,
        tools_tokens: int = 0,
        calibration: Calibration | None = None,
        summary_marker: SummaryMarker | None = DEFAULT_SUMMARY_MARKER,
        recall: RecallIds | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.budget = budget
        self.tools_tokens = tools_tokens
        self.calibration = calibration or Calibration()
        self.summary_marker = summary_marker
        self.original = view
        self._changed = False
        self._counters = ChangeCounters()
        self._pending: tuple[list[Message], list[MessageStats]] | None = None
        self._pins = Pins()
        self.paid: list[tuple[str, Message]] = []
        """(strategy name, message) for every message a strategy paid for (a summary)."""
        self._recall = DraftRecall(view.messages, recall) if recall is not None else None
        self.ledger: DraftLedger | None = None
        self._reset(view)

    # ------------------------------------------------------------------ state
    @property
    def view(self) -> ConversationView:
        """The current view (re-grouped on first use after a structural :meth:`commit`)."""
        if self._pending is not None:
            self._materialize()
        return self._view

    def _materialize(self) -> None:
        """Build the view a structural :meth:`commit` deferred, and re-base on it."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        messages, stats = pending
        self._reset(
            build_view(
                messages, self.tokenizer, summary_marker=self.summary_marker, known_stats=stats
            )
        )

    def _reset(self, view: ConversationView) -> None:
        self._view = view
        groups = view.groups
        self._state = [GroupState.KEPT] * len(groups)
        self._protected = [view.is_protected(g) for g in groups]
        self._pinned = self._pins.flags(view)
        self._replacements: dict[int, tuple[list[Message], list[MessageStats]]] = {}
        self._edits: dict[int, tuple[Message, MessageStats]] = {}
        self._inserts: dict[int, list[tuple[Message, MessageStats]]] = {}
        self._dirty = False
        self._structural = False
        self._totals = Totals(view, self._state, self._pinned)

    @property
    def changed(self) -> bool:
        """True once any decision was recorded (committed or not)."""
        return self._changed or self._dirty

    @property
    def counters(self) -> ChangeCounters:
        """Cumulative change counters (for reports)."""
        return self._counters

    @property
    def groups(self) -> tuple[Group, ...]:
        """The current view's groups, oldest first."""
        return self.view.groups

    def state(self, group: Group | int) -> GroupState:
        """The decision recorded for ``group``."""
        if self._pending is not None:
            self._materialize()
        return self._state[_index(group)]

    def is_kept(self, group: Group | int) -> bool:
        """True if the group is still kept as it is (possibly with edited messages)."""
        if self._pending is not None:
            self._materialize()
        return self._state[_index(group)] is GroupState.KEPT

    def is_protected(self, group: Group | int) -> bool:
        """True for system groups, the newest user message, the newest step and pinned groups:
        what no strategy may drop, replace or edit."""
        if self._pending is not None:
            self._materialize()
        index = _index(group)
        return self._protected[index] or self._pinned[index]

    def is_fixed(self, group: Group | int) -> bool:
        """True for what the invariants protect (system groups, the newest user message, the
        newest step); pins aside."""
        if self._pending is not None:
            self._materialize()
        return self._protected[_index(group)]

    def is_pinned(self, group: Group | int) -> bool:
        """True for a group pinned for this run (a summary, a carried user message)."""
        if self._pending is not None:
            self._materialize()
        return self._pinned[_index(group)]

    def pin(self, messages: Sequence[Message]) -> None:
        """Pin the groups holding ``messages`` (by identity) for the rest of the run."""
        if not messages:
            return
        if self._pending is not None:
            self._materialize()
        self._pins.add(messages)
        self._repin()

    def unpin(self, kind: GroupKind) -> list[Group]:
        """Release every pinned group of ``kind`` (the pipeline, for the budget); returns them."""
        released = self.pinned_groups(kind)
        self._pins.release(self._view.messages[m] for g in released for m in g.members)
        self._repin()
        return released

    def pinned_groups(self, kind: GroupKind | None = None) -> list[Group]:
        """Kept pinned groups (of ``kind``), oldest first."""
        if self._pending is not None:
            self._materialize()
        return [
            g
            for g in self._view.groups
            if self._pinned[g.index]
            and self._state[g.index] is GroupState.KEPT
            and (kind is None or g.kind is kind)
        ]

    def _repin(self) -> None:
        self._pinned = self._pins.flags(self._view)
        self._totals.count_turns(self._view.groups, self._state, self._pinned)

    def group_tokens(self, group: Group | int) -> int:
        """Current tokens of a kept group (after edits)."""
        if self._pending is not None:
            self._materialize()
        return self._totals.group_tokens[_index(group)]

    def message(self, index: int) -> Message:
        """The current form of message ``index`` (its edit, if any)."""
        if self._pending is not None:
            self._materialize()
        edit = self._edits.get(index)
        return edit[0] if edit is not None else self._view.messages[index]

    def message_stats(self, index: int) -> MessageStats:
        """The current stats of message ``index`` (its edit's, if any)."""
        if self._pending is not None:
            self._materialize()
        edit = self._edits.get(index)
        return edit[1] if edit is not None else self._view.stats[index]

    def removable(self, kinds: frozenset[GroupKind] | None = None) -> Iterator[Group]:
        """Kept, unprotected groups, oldest first (optionally of the given kinds).

        Safe to use while dropping: the state of each group is read when it is reached.
        """
        if self._pending is not None:
            self._materialize()
        for group in self._view.groups:
            if (
                self._state[group.index] is GroupState.KEPT
                and not self._protected[group.index]
                and not self._pinned[group.index]
                and (kinds is None or group.kind in kinds)
            ):
                yield group

    # ------------------------------------------------------------------ totals
    @property
    def message_tokens(self) -> int:
        """Raw tokens of the kept messages (no tools, no priming)."""
        return self._totals.message_tokens

    @property
    def prompt_tokens(self) -> int:
        """Raw prompt tokens: messages + tools schema + reply priming."""
        ledger = self.ledger.extra_tokens() if self.ledger is not None else 0
        return (
            self._totals.message_tokens + self.tools_tokens + self.tokenizer.reply_priming + ledger
        )

    @property
    def message_count(self) -> int:
        """Messages the projection would contain (a ledger not yet placed aside)."""
        return self._totals.message_count

    def metrics(self) -> Metrics:
        """A snapshot for triggers/targets; tokens are calibrated."""
        if self._pending is not None:
            self._materialize()
        totals = self._totals
        return Metrics(
            tokens=self.calibration.apply(self.prompt_tokens),
            messages=totals.message_count,
            groups=totals.group_count,
            turns=totals.live_turns,
            tool_call_groups=totals.tool_call_groups,
            budget=self.budget.limit,
            overflow_messages=self.overflow_messages,
        )

    def over_budget(self) -> bool:
        """True while the calibrated prompt does not fit the budget."""
        return self.calibration.apply(self.prompt_tokens) > self.budget.limit

    def overflow_messages(self) -> int:
        """Messages an oldest-first drop of removable groups needs to fit the budget.

        LibreChat's ``messagesToRefine``; when even dropping everything removable would not
        fit, it is the count of all removable messages.
        """
        if self._pending is not None:
            self._materialize()
        return self._totals.overflow_messages(
            self.removable(), self.prompt_tokens, self.calibration, self.budget.limit
        )

    # ------------------------------------------------------------------ decisions
    def measure(self, message: Message) -> MessageStats:
        """Bytes and tokens of a new message (counted through the tokenizer's cache)."""
        data = canonical_bytes(message)
        return MessageStats(len(data), self.tokenizer.count_message(message, data))

    def _require_editable(self, index: int, action: str, *, release: bool = False) -> Group:
        if self._pending is not None:
            self._materialize()
        group = self._view.groups[index]
        if self._protected[index]:
            raise ProtectedGroupError(f"cannot {action} protected {group.kind} group {index}")
        if self._pinned[index] and not release:
            raise ProtectedGroupError(f"cannot {action} pinned {group.kind} group {index}")
        if self._state[index] is not GroupState.KEPT:
            raise ProtectedGroupError(
                f"cannot {action} group {index}: already {self._state[index].value}"
            )
        return group

    def _mark(self, *, structural: bool = True) -> None:
        self._dirty = True
        self._changed = True
        self._structural = self._structural or structural

    def drop(self, group: Group | int, *, release: bool = False) -> None:
        """Remove a whole group (all its messages, wherever they sit).

        ``release``: the group may be pinned (a summary folded into a new one).
        """
        target = self._require_editable(_index(group), "drop", release=release)
        if self.ledger is not None and target.kind is not GroupKind.SUMMARY:
            self.ledger.fold(self._current(target))  # what it held, before it goes
        if self._recall is not None:
            self._recall.drop(self._current(target))
        self._totals.remove(target, self._pinned)
        self._state[target.index] = GroupState.DROPPED
        self._counters = self._counters.plus(
            groups_dropped=1, messages_removed=self._totals.group_messages[target.index]
        )
        self._mark()

    def replace(self, group: Group | int, messages: Sequence[Message]) -> None:
        """Collapse a group into ``messages``, placed at the group's first position.

        An empty sequence is the same as :meth:`drop`.
        """
        if not messages:
            self.drop(group)
            return
        target = self._require_editable(_index(group), "replace")
        if self.ledger is not None:
            self.ledger.fold(self._current(target))
        if self._recall is not None:
            messages = self._recall.replace(self._current(target), messages)
        stats = [self.measure(m) for m in messages]
        self._totals.remove(target, self._pinned)
        self._state[target.index] = GroupState.REPLACED
        self._replacements[target.index] = (list(messages), stats)
        self._totals.add_replacement(target, stats, any(has_tool_calls(m) for m in messages))
        self._counters = self._counters.plus(
            groups_replaced=1,
            messages_removed=self._totals.group_messages[target.index],
            messages_inserted=len(messages),
        )
        self._mark()

    def edit(self, index: int, message: Message) -> bool:
        """Replace message ``index`` with an edited copy (the group stays whole and kept).

        Build the copy with ``{**draft.message(index), "content": ...}`` so unknown fields and
        pairing ids survive.  With recall on, the copy is marked and the message it replaces
        archived (:meth:`preview_edit` says what is recorded); returns whether the edit was
        made (always, with recall off).
        """
        group = self._require_editable(self.view.group_of[index], "edit")
        planned = self._planned_edit(index, message)
        if planned is None:
            return False
        message, stats = planned
        if self.ledger is not None:
            self.ledger.fold([self.message(index)])
        self._apply_edit(group, index, message, stats)
        self._mark(
            structural=grouping_key(message, self.summary_marker)
            != grouping_key(self.view.messages[index], self.summary_marker)
        )
        return True

    def preview_edit(self, index: int, message: Message) -> Message | None:
        """What :meth:`edit` would record for ``message`` (nothing recorded): the message itself
        with recall off; with recall on, the copy with its mark (`` [recall id r…]``), or
        ``None`` when the edit would not be made (:meth:`.DraftRecall.edit`).  For a strategy
        that plans its edits before making them (and measures what they free)."""
        planned = self._planned_edit(index, message, record=False)
        return None if planned is None else planned[0]

    def _planned_edit(
        self, index: int, message: Message, *, record: bool = True
    ) -> tuple[Message, MessageStats] | None:
        if self._recall is None:
            return message, self.measure(message)
        tokens = self.message_stats(index).token_count
        current = self.message(index)
        return self._recall.edit(current, tokens, message, self.measure, record=record)

    def _current(self, group: Group) -> list[Message]:
        """The current form of ``group``'s messages (their edits)."""
        return [self.message(m) for m in group.members]

    def _apply_edit(
        self, group: Group, index: int, message: Message, stats: MessageStats | None = None
    ) -> None:
        """Record ``message`` as the new form of message ``index`` and update the totals."""
        old = self._edits.get(index)
        old_tokens = old[1].token_count if old else self._view.stats[index].token_count
        stats = stats if stats is not None else self.measure(message)
        self._edits[index] = (message, stats)
        self._totals.edited(group.index, stats.token_count - old_tokens)
        if old is None:
            self._counters = self._counters.plus(messages_edited=1)

    def insert(
        self, position: int, messages: Sequence[Message], *, paid_by: str | None = None
    ) -> None:
        """Insert synthetic messages before message ``position`` (``len`` = at the end).

        Each inserted message counts as one group (a summary checkpoint) in the metrics.
        ``paid_by``: the strategy that paid for them (a summary): they are pinned for the rest
        of the run and recorded in :attr:`paid`.
        """
        if self._pending is not None:
            self._materialize()
        if not 0 <= position <= len(self.view.messages):
            raise IndexError(f"insert position {position} out of range")
        if position > self.view.insert_limit:
            raise ProtectedGroupError("cannot insert after the newest user message's first step")
        if paid_by is not None and self._recall is not None:
            messages = self._recall.paid(messages)
        entries = [(m, self.measure(m)) for m in messages]
        if paid_by is not None:
            self._pins.add(messages)
            self.paid.extend((paid_by, message) for message in messages)
        self._inserts.setdefault(position, []).extend(entries)
        self._totals.add_inserted(
            [s for _, s in entries], sum(1 for m, _ in entries if has_tool_calls(m))
        )
        self._counters = self._counters.plus(messages_inserted=len(entries))
        self._mark()

    def insert_after_system(
        self, messages: Sequence[Message], *, paid_by: str | None = None
    ) -> None:
        """Insert right after the leading system/developer messages (summary placement)."""
        self.insert(
            min(self.view.leading_system_end, self.view.tail_start), messages, paid_by=paid_by
        )

    def insert_after_task(self, messages: Sequence[Message], *, paid_by: str | None = None) -> None:
        """Insert right after the newest user message: "progress so far" in an agent loop (the
        task stays first; see "Agent loops" in compaction_proxy/compaction/README.md)."""
        self.insert(
            min(self.view.tail_start + 1, self.view.insert_limit), messages, paid_by=paid_by
        )

    def trim_newest(self, index: int, message: Message) -> bool:
        """Replace a tool result of a protected group: the pipeline's last resort, for a result
        too large to fit even when everything else is gone.  User and system text is never
        cut (anything but a ``tool``/``function`` message is refused).  Marked and archived
        as :meth:`edit` is; returns whether the trim was made."""
        if self._pending is not None:
            self._materialize()
        if role_of(self._view.messages[index]) not in ("tool", "function"):
            raise ProtectedGroupError("only tool results may be trimmed as a last resort")
        group = self._view.groups[self._view.group_of[index]]
        if self._state[group.index] is not GroupState.KEPT:
            raise ProtectedGroupError(
                f"cannot trim a message of a {self._state[group.index]} group"
            )
        planned = self._planned_edit(index, message)
        if planned is None:
            return False
        if self.ledger is not None:
            self.ledger.fold([self.message(index)])
        self._apply_edit(group, index, *planned)
        self._mark(structural=False)
        return True

    def rewrite_ledger(self, index: int, message: Message) -> None:
        """Put ``message`` in place of the ledger message ``index`` (:mod:`.ledger_run`)."""
        group = self._view.groups[self._view.group_of[index]]
        if group.kind is not GroupKind.LEDGER:
            raise ProtectedGroupError(f"message {index} is not the ledger")
        self._apply_edit(group, index, message)
        self._mark(structural=False)

    def preview_paid(self, message: Message, groups: Sequence[Group]) -> Message:
        """``message`` as :meth:`insert` with ``paid_by`` would record it once ``groups`` are
        dropped (by the same strategy run): with recall on, marked with the span of what they
        hold (a summary measured before the fold is made)."""
        if self._recall is None:
            return message
        return self._recall.preview_paid(message, (m for g in groups for m in self._current(g)))

    @property
    def recall(self) -> bool:
        """Whether this run archives what it removes and marks what stands for it."""
        return self._recall is not None

    def recall_id(self, message: Message) -> str | None:
        """The recall id that finds ``message`` (a stub's own, an original's; recall off: None)."""
        return self._recall.id_of(message) if self._recall is not None else None

    def archived(self) -> Archived | None:
        """What the run archived, from what its output lacks (``None``: recall off, or nothing
        archived); see compaction_proxy/compaction/archiving.py."""
        if self._recall is None or not self.changed:
            return None
        return self._recall.archived(self.project())

    # ------------------------------------------------------------------ output
    def project_with_stats(self) -> tuple[list[Message], list[MessageStats]]:
        """The output messages and their stats, in original relative order."""
        if self._pending is not None:
            return list(self._pending[0]), list(self._pending[1])
        return project(self._view, self._state, self._edits, self._replacements, self._inserts)

    def project(self) -> list[Message]:
        """The output message list (the input list's messages when nothing changed)."""
        if self._pending is not None:
            return list(self._pending[0])
        if not self._dirty:
            return list(self._view.messages)
        return self.project_with_stats()[0]

    def commit(self) -> None:
        """Re-base on the projection so later steps see an ordinary, re-grouped view.

        When only edits were made and none of them changed what grouping reads (role, call
        ids, result ids, names, the summary marker), the grouping is reused and only the
        edited groups' totals are recomputed.  Otherwise the projection is kept and grouped on
        first use (:meth:`_materialize`); the totals that need no grouping (message tokens and
        count) are set now, to exactly what the re-grouped view will give.
        """
        if self._recall is not None:
            self._recall.settle()
        if not self._dirty:
            return
        if not self._structural:
            self._reset(edited_view(self._view, self._edits))
            return
        messages, stats = self.project_with_stats()
        self._defer((messages, stats), sum(s.token_count for s in stats), len(messages))

    def _defer(
        self,
        pending: tuple[list[Message], list[MessageStats]],
        message_tokens: int,
        message_count: int,
    ) -> None:
        """Hold ``pending`` (an output and its stats) to be grouped on first use, with the
        totals that need no grouping."""
        self._pending = pending
        self._dirty = False
        self._structural = False
        self._replacements = {}
        self._edits = {}
        self._inserts = {}
        self._totals.message_tokens = message_tokens
        self._totals.message_count = message_count

    def savepoint(self) -> Savepoint:
        """The committed state, to :meth:`rollback` to (a strategy's work undone)."""
        if self._dirty:
            raise RuntimeError("savepoint of a draft with uncommitted decisions")
        return Savepoint(
            view=self._view,
            pending=self._pending,
            message_tokens=self._totals.message_tokens,
            message_count=self._totals.message_count,
            counters=self._counters,
            changed=self._changed,
            pins=self._pins.items(),
            paid=len(self.paid),
            ledger=self.ledger.snapshot() if self.ledger is not None else None,
        )

    def rollback(self, point: Savepoint) -> None:
        """Return to ``point`` (taken by :meth:`savepoint` on this draft), uncommitted
        decisions included."""
        self._pins = Pins(point.pins)
        del self.paid[point.paid :]
        if self.ledger is not None and point.ledger is not None:
            self.ledger.restore(point.ledger)  # type: ignore[arg-type]
        if self._recall is not None:
            self._recall.settle()
        self._counters = point.counters
        if point.pending is not None:
            self._defer(point.pending, point.message_tokens, point.message_count)
        else:
            self._pending = None
            self._reset(point.view)
        self._changed = point.changed


def _index(group: Group | int) -> int:
    return group if isinstance(group, int) else group.index
