"""Small JSON values by key, kept in the checkpoint store: learned context windows, summaries
shared across replicas.

What these callers need is ``get`` and ``put`` of one JSON object under a key with a TTL (and
when it was written), a lease (``lock``) to elect one writer across replicas, failing the way
every store fails (``StoreUnavailable``, which they read as "nothing stored"), and the store's
backend, breaker and time budget, so that replicas see the same values. :class:`StoredValues`
is that interface, over a :class:`CheckpointStore`: every backend is one already, so there is no
second implementation to abstract over.

The stored form is the checkpoint format with no messages and the value as its ``meta``
(``{"v": 1, "messages": [], "created_at": ..., "meta": value}``): rows written before this
interface existed read back unchanged, and a replica of an older version still reads what this
one writes while a rolling deploy shares one Redis. A row that is not one of them is foreign
and reads as a miss, as in every store (:mod:`._contract`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from ._contract import Checkpoint, CheckpointStore


@dataclass(frozen=True, slots=True)
class StoredValue:
    """A value read back, and when it was written (wall clock, as the writer's clock read)."""

    value: dict[str, Any]
    written_at: float


class StoredValues:
    """JSON objects by ``(namespace, key)`` in a checkpoint store (see the module docstring);
    every method may raise ``StoreUnavailable``."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    @property
    def name(self) -> str:
        """The backend's name, for log lines."""
        return self.store.name

    async def get(self, namespace: str, key: str) -> StoredValue | None:
        """The value stored under ``key``, or None (never stored, expired or foreign)."""
        found = await self.store.find_longest(namespace, [key])
        if found is None:
            return None
        record = found[1]
        return StoredValue(record.meta, record.created_at)

    async def put(
        self,
        namespace: str,
        key: str,
        value: Mapping[str, Any],
        ttl_seconds: int,
        *,
        written_at: float | None = None,
    ) -> None:
        """Stores (or replaces) ``value``; it expires after ``ttl_seconds``. ``written_at``:
        the writer's clock (default: ``time.time()``)."""
        when = time.time() if written_at is None else written_at
        record = Checkpoint(messages=(), created_at=when, meta=dict(value))
        await self.store.put(namespace, key, record, ttl_seconds)

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        """A lease across replicas, as :meth:`CheckpointStore.lock`."""
        return self.store.lock(name, ttl_seconds, wait_seconds)
