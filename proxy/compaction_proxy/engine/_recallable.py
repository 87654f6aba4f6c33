"""A conversation's archive as the flow keeps it (docs/recall.md): the keyed ids its
compaction names what it removes with, which ids it may recall, and its originals written to
the end user's archive.

The index travels in each checkpoint's meta (``INDEX_META``), so a request knows what its
conversation may recall from the one lookup it makes anyway; the originals live in rows of the
end user's namespace (compaction_proxy/checkpoints/_archive.py), named by ids keyed for that
namespace (compaction_proxy/checkpoints/_archive_key.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compaction_proxy.checkpoints import (
    Archive,
    Checkpoint,
    StoreUnavailable,
    confined,
    detached_budget,
    merged_index,
    unstored_ids,
)
from compaction_proxy.compaction import CompactionSettings, RecallIds
from compaction_proxy.compaction.archive import Archived

Index = list[list[Any]]
"""``[[id, bytes], ...]``, oldest first: a checkpoint's ``INDEX_META``."""


@dataclass(frozen=True, slots=True)
class Recallable:
    """What a request's conversation may recall: the end user's archive ``namespace`` and the
    ids of its ``index`` (the checkpoint's, with what this request archived), oldest first.
    The recall loop answers only these ids and their spans' members
    (compaction_proxy/engine/_recall_desk.py), never an id because some text names it."""

    namespace: str
    index: tuple[str, ...]


KEY_UNAVAILABLE = (
    "recall: the archive's key could not be read (store unavailable): this request was "
    "compacted without recall marks, nothing it removed was archived, no checkpoint was stored"
)


class ConversationArchive:
    """The flow's handle on the archive: ``archive`` None (no store) keeps nothing."""

    def __init__(
        self,
        archive: Archive | None,
        settings_for: Callable[[str], CompactionSettings],
        budget: float = 2.0,
    ) -> None:
        self.archive = archive
        self.settings_for = settings_for
        # The archive's writes get a store budget of their own (``store.request_budget`` of
        # wall time at its concurrency): a summary that folds thousands of messages must not
        # spend the budget the checkpoint write after it needs, nor be cut by the request's.
        self.budget = budget * (archive.concurrency if archive is not None else 1)

    def enabled(self, model: str) -> bool:
        """Whether ``model``'s compaction archives what it removes (``compaction.recall``)."""
        return self.settings_for(model).recall.enabled

    async def ids(self, model: str, namespace: str) -> tuple[RecallIds | None, str | None]:
        """The keyed ids ``model``'s compaction names what it removes with in the archive
        ``namespace``, and a warning when there are none though recall is on (the store's
        secret could not be read: the request is compacted without recall, never with ids
        anyone could compute). ``(None, None)``: recall is off. Without a store nothing is
        kept: the ids are keyed by the namespace alone."""
        if not self.enabled(model):
            return None, None
        if self.archive is None:
            return unstored_ids(namespace), None
        try:
            return await self.archive.recall_ids(namespace), None
        except StoreUnavailable:
            return None, KEY_UNAVAILABLE

    def index(
        self, model: str, checkpoint: Checkpoint | None, archived: Archived | None
    ) -> Index | None:
        """The conversation's index after a run (the checkpoint's it started from, with what
        the run archived), or None: recall is off for ``model``."""
        if self.archive is None or not self.enabled(model):
            return None
        previous = checkpoint.meta if checkpoint is not None else None
        held = confined(archived or Archived(), previous)
        return merged_index(previous, held, self.archive.max_bytes)

    @staticmethod
    def recallable(namespace: str, index: Index | None) -> Recallable | None:
        if not index:
            return None
        return Recallable(namespace, tuple(str(entry[0]) for entry in index))

    async def keep(
        self, namespace: str, archived: Archived, checkpoint: Checkpoint | None
    ) -> str | None:
        """A run's originals, kept in the end user's archive ``namespace`` (a failure is a
        warning text), its spans cut to what the conversation held (``checkpoint``: the one
        the run started from)."""
        if self.archive is None or not archived:
            return None
        previous = checkpoint.meta if checkpoint is not None else None
        with detached_budget(self.budget):
            return await self.archive.keep(namespace, confined(archived, previous))
