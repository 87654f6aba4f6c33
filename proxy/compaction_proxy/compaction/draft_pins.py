"""What a draft pinned for the rest of its run, by message identity.

*Pinned* groups are protected like the invariants' groups, but only by the run's own rule (see
"What compaction keeps" in compaction_proxy/compaction/README.md, and :mod:`.carry` for what is
pinned):
a summary checkpoint (one the run inserted, or one it started with) and the user messages
carried verbatim beside it.  Strategies skip them; only the summarization strategy folds a
pinned summary into its new one (``drop(..., release=True)``), and only the pipeline releases
pins, when the budget cannot be met otherwise (invariant 8).

A pin names a message object, not a position, and keeps it alive: it follows the message
through every commit's re-grouping, and a group is pinned while it holds a pinned message.
"""

from __future__ import annotations

from collections.abc import Iterable

from .chat_messages import Message
from .view import ConversationView

__all__ = ["Pins"]


class Pins:
    """The pinned messages of one run (``items``: as :meth:`items` gave them)."""

    __slots__ = ("_messages",)

    def __init__(self, items: Iterable[tuple[int, Message]] = ()) -> None:
        self._messages: dict[int, Message] = dict(items)  # id(message) -> message

    def add(self, messages: Iterable[Message]) -> None:
        """Pin ``messages``."""
        for message in messages:
            self._messages[id(message)] = message

    def release(self, messages: Iterable[Message]) -> None:
        """Unpin ``messages`` (those not pinned are ignored)."""
        for message in messages:
            self._messages.pop(id(message), None)

    def flags(self, view: ConversationView) -> list[bool]:
        """Per group of ``view``: whether it holds a pinned message."""
        pins = self._messages
        if not pins:
            return [False] * len(view.groups)
        return [any(id(view.messages[m]) in pins for m in g.members) for g in view.groups]

    def items(self) -> tuple[tuple[int, Message], ...]:
        """The pins as values (for a savepoint)."""
        return tuple(self._messages.items())
