"""What a draft did, as values: a group's state, the change counters, a savepoint.

They are the parts of a :class:`~.draft.Draft` that leave it: the pipeline diffs the counters
per strategy for its report, :mod:`.strategies._support.churn` holds a savepoint to undo a strategy
whose saving was too small, and strategies read a group's state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from .chat_messages import Message
from .view import ConversationView, MessageStats


class GroupState(Enum):
    """What the draft currently does with a group."""

    KEPT = "kept"
    DROPPED = "dropped"
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class ChangeCounters:
    """Cumulative counts of what a draft did; the pipeline diffs them per strategy."""

    groups_dropped: int = 0
    groups_replaced: int = 0
    messages_removed: int = 0
    messages_edited: int = 0
    messages_inserted: int = 0

    @property
    def groups_affected(self) -> int:
        """Groups dropped or replaced."""
        return self.groups_dropped + self.groups_replaced

    @property
    def messages_affected(self) -> int:
        """Messages removed, edited or inserted."""
        return self.messages_removed + self.messages_edited + self.messages_inserted

    def plus(self, **deltas: int) -> ChangeCounters:
        """These counts with ``deltas`` (field name -> amount) added."""
        return replace(self, **{name: getattr(self, name) + n for name, n in deltas.items()})

    def __sub__(self, other: ChangeCounters) -> ChangeCounters:
        return ChangeCounters(
            self.groups_dropped - other.groups_dropped,
            self.groups_replaced - other.groups_replaced,
            self.messages_removed - other.messages_removed,
            self.messages_edited - other.messages_edited,
            self.messages_inserted - other.messages_inserted,
        )


@dataclass(frozen=True, slots=True)
class Savepoint:
    """A committed draft's state, to return to with :meth:`Draft.rollback`."""

    view: ConversationView
    pending: tuple[list[Message], list[MessageStats]] | None
    message_tokens: int
    message_count: int
    counters: ChangeCounters
    changed: bool
    pins: tuple[tuple[int, Message], ...]
    paid: int
    ledger: object = None
    """The ledger's state (:meth:`~.ledger.state.DraftLedger.snapshot`), when the run keeps one."""
