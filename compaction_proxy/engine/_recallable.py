"""A conversation's archive as the flow keeps it (docs/recall.md): which ids it may recall,
and its originals written to the tenant's archive.

The index travels in each checkpoint's meta (``INDEX_META``), so a request knows what its
conversation may recall from the one lookup it makes anyway; the originals live in rows of the
tenant's namespace (compaction_proxy/checkpoints/_archive.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compaction_proxy.checkpoints import (
    Archive,
    Checkpoint,
    archive_namespace,
    detached_budget,
    merged_index,
)
from compaction_proxy.compaction import CompactionSettings
from compaction_proxy.compaction.archive import Archived

Index = list[list[Any]]
"""``[[id, bytes], ...]``, oldest first: a checkpoint's ``INDEX_META``."""


@dataclass(frozen=True, slots=True)
class Recallable:
    """What a request's conversation may recall: the tenant's archive ``namespace`` and the
    ids of its ``index`` (the checkpoint's, with what this request archived), oldest first.
    The recall loop answers only these ids, the ids the forwarded messages mark, and their
    spans' members (compaction_proxy/engine/_recall_desk.py)."""

    namespace: str
    index: tuple[str, ...]


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

    def index(
        self, model: str, checkpoint: Checkpoint | None, archived: Archived | None
    ) -> Index | None:
        """The conversation's index after a run (the checkpoint's it started from, with what
        the run archived), or None: recall is off for ``model``."""
        if self.archive is None or not self.settings_for(model).recall.enabled:
            return None
        previous = checkpoint.meta if checkpoint is not None else None
        return merged_index(previous, archived or Archived(), self.archive.max_bytes)

    @staticmethod
    def recallable(
        credential: str | None, tenant: str | None, index: Index | None
    ) -> Recallable | None:
        if not index:
            return None
        ids = tuple(str(entry[0]) for entry in index)
        return Recallable(archive_namespace(credential, tenant), ids)

    async def keep(
        self, credential: str | None, tenant: str | None, archived: Archived
    ) -> str | None:
        """A run's originals, kept in the tenant's archive (a failure is a warning text)."""
        if self.archive is None or not archived:
            return None
        with detached_budget(self.budget):
            return await self.archive.keep(archive_namespace(credential, tenant), archived)
