"""What a draft does for recall at each of its decision points (``compaction.recall``).

With recall on, a :class:`~.draft.Draft` marks and archives where it decides, so no strategy
has to (see "Recall marks" in docs/compaction.md): an edit's copy gets `` [recall id r…]``
naming the original it replaced (archived), a replacement or a paid message (a summary) the
span mark naming what it stands for, and a dropped group's messages are archived.  An edit that
gives the current message again, or whose marked copy is not smaller in tokens, is not made,
so a strategy never pays tokens for a mark.  The previews give what would be recorded, for a
strategy that measures before it decides; nothing is final until :meth:`DraftRecall.archived`,
computed from what the output lacks (:mod:`.archiving`, :mod:`.marks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .archive import Archived, RecallIds
from .archiving import ArchiveLog
from .chat_messages import Message
from .marks import marked, original_mark
from .view import MessageStats

__all__ = ["DraftRecall"]


class DraftRecall:
    """The recall side of one draft over ``inputs`` (the request's messages), its ids made
    with ``ids`` (the archive namespace's key)."""

    def __init__(self, inputs: Sequence[Message], ids: RecallIds) -> None:
        self._log = ArchiveLog(inputs, ids)

    def edit(
        self,
        current: Message,
        current_tokens: int,
        message: Message,
        measure: Callable[[Message], MessageStats],
        *,
        record: bool = True,
    ) -> tuple[Message, MessageStats] | None:
        """``message`` marked as the edit of ``current`` (``current_tokens`` long) with its
        stats (``measure``: the draft's count), or ``None`` when the edit is not to be made;
        ``record``: archive ``current``."""
        recall_id = self._log.edit_id(current)
        new = marked(message, original_mark(recall_id))
        if new == current:
            return None
        stats = measure(new)
        if stats.token_count >= current_tokens:
            return None
        if record:
            self._log.edited(current, new, recall_id)
        return new, stats

    def id_of(self, message: Message) -> str:
        """The id recall finds ``message`` under once it is folded (a stub: the original's)."""
        return self._log.edit_id(message)

    def drop(self, members: Sequence[Message]) -> None:
        """A group of ``members`` (their current forms) was dropped: archive them; the next
        paid message's span takes in their ids."""
        self._log.removed(members, loose=True)

    def replace(self, members: Sequence[Message], messages: Sequence[Message]) -> list[Message]:
        """A group of ``members`` is replaced by ``messages``: archive the members; returns the
        replacement with the span mark of what it stands for."""
        ids, anchor = self._log.removed(members, loose=False)
        return self._log.replaced(messages, ids, anchor)

    def paid(self, messages: Sequence[Message]) -> list[Message]:
        """Messages inserted with ``paid_by``, marked with the span of what was dropped before
        them since the last commit."""
        return self._log.paid(messages)

    def preview_paid(self, message: Message, members: Iterable[Message]) -> Message:
        """``message`` as :meth:`paid` would mark it once ``members`` are dropped (nothing
        recorded)."""
        ids = self._log.members(members)
        return self._log.span_marked(message, ids) if ids else message

    def settle(self) -> None:
        """The draft committed or rolled back: drops no longer wait for a summary."""
        self._log.settle()

    def archived(self, output: Sequence[Message]) -> Archived | None:
        """What the run archived, given its final ``output`` (``None``: nothing)."""
        return self._log.result(output)
