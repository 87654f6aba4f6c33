"""An in-memory checkpoint store: a bounded LRU with TTLs, for one process and for tests.

Checkpoints are kept as their serialized bytes, like the other backends: a caller that mutates
a returned checkpoint's dicts cannot change what the next request reads, and memory use is what
the data costs, not Python object overhead.

The bound is a number of entries (``store.max_entries``) and, optionally, their bytes: the
recall archive gets a store of its own bounded by bytes (``store.archive_max_mb``,
:func:`~._factory.make_archive_store`), so its many rows never evict a checkpoint.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from ._contract import Checkpoint, Foreign, log_foreign, ttl_at_least_one
from ._decoded import live_payloads, pick_longest
from ._leases import LeaseTable

ENTRY_OVERHEAD = 200
"""Bytes an entry costs besides its value (its key, the table's slot), for ``max_bytes``."""


class MemoryStore:
    """Least recently used entries go first once ``max_entries`` is reached, or their bytes
    pass ``max_bytes`` (None: no byte bound)."""

    name = "memory"

    def __init__(self, max_entries: int = 10_000, max_bytes: int | None = None) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._max_entries = max(1, max_entries)
        self._max_bytes = None if max_bytes is None else max(1, max_bytes)
        self._bytes = 0
        self._leases = LeaseTable()
        self.foreign_values = 0
        """Foreign values met by lookups (and deleted); see :mod:`._contract`."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """What the entries weigh against ``max_bytes``: their values and a fixed overhead
        each."""
        return self._bytes

    def _remove(self, item: tuple[str, str]) -> None:
        entry = self._entries.pop(item, None)
        if entry is not None:
            self._bytes -= _weight(item, entry[1])

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        found = live_payloads(self._entries, namespace, keys, time.monotonic(), self._remove)
        picked = pick_longest(keys, found)
        if picked.foreign:
            self._drop_foreign(namespace, picked.foreign)
        hit = picked.hit
        if hit is not None:
            self._entries.move_to_end((namespace, keys[hit[0] - 1]))
        return hit

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        expires = time.monotonic() + ttl_at_least_one(ttl_seconds)
        item = (namespace, key)
        value = checkpoint.to_bytes()
        self._remove(item)
        self._entries[item] = (expires, value)
        self._bytes += _weight(item, value)
        limit = self._max_bytes
        # An entry heavier than the whole bound goes too: the bound holds, always.
        while len(self._entries) > self._max_entries or (limit is not None and self._bytes > limit):
            oldest = next(iter(self._entries))
            self._remove(oldest)

    async def delete(self, namespace: str, key: str) -> bool:
        found = (namespace, key) in self._entries
        self._remove((namespace, key))
        return found

    def _drop_foreign(self, namespace: str, foreign: tuple[Foreign, ...]) -> None:
        self.foreign_values += len(foreign)
        log_foreign(self.name, namespace, foreign)
        for item in foreign:
            entry = self._entries.get((namespace, item.key))
            if entry is not None and entry[1] == item.value:
                self._remove((namespace, item.key))

    async def ping(self) -> None:
        return None

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        return self._leases.lock(name, ttl_seconds, wait_seconds)

    async def close(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _weight(item: tuple[str, str], value: bytes) -> int:
    return len(value) + len(item[0]) + len(item[1]) + ENTRY_OVERHEAD
