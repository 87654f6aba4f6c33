"""An in-memory checkpoint store: a bounded LRU with TTLs, for one process and for tests.

Checkpoints are kept as their serialized bytes, like the other backends: a caller that mutates
a returned checkpoint's dicts cannot change what the next request reads, and memory use is what
the data costs, not Python object overhead.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from ._contract import Checkpoint, Foreign, log_foreign, ttl_at_least_one
from ._decoded import pick_longest
from ._leases import LeaseTable


class MemoryStore:
    """Least recently used entries go first once ``max_entries`` is reached."""

    name = "memory"

    def __init__(self, max_entries: int = 10_000) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._max_entries = max(1, max_entries)
        self._leases = LeaseTable()
        self.foreign_values = 0
        """Foreign values met by lookups (and deleted); see :mod:`._contract`."""

    def __len__(self) -> int:
        return len(self._entries)

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        now = time.monotonic()
        found: dict[str, bytes] = {}
        for key in keys:
            entry = self._entries.get((namespace, key))
            if entry is None:
                continue
            if entry[0] <= now:
                del self._entries[(namespace, key)]
                continue
            found[key] = entry[1]
        picked = pick_longest(keys, found)
        if picked.foreign:
            self._drop_foreign(namespace, picked.foreign)
        hit = picked.hit
        if hit is not None:
            self._entries.move_to_end((namespace, keys[hit[0] - 1]))
        return hit

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        expires = time.monotonic() + ttl_at_least_one(ttl_seconds)
        self._entries[(namespace, key)] = (expires, checkpoint.to_bytes())
        self._entries.move_to_end((namespace, key))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def delete(self, namespace: str, key: str) -> bool:
        return self._entries.pop((namespace, key), None) is not None

    def _drop_foreign(self, namespace: str, foreign: tuple[Foreign, ...]) -> None:
        self.foreign_values += len(foreign)
        log_foreign(self.name, namespace, foreign)
        for item in foreign:
            entry = self._entries.get((namespace, item.key))
            if entry is not None and entry[1] == item.value:
                del self._entries[(namespace, item.key)]

    async def ping(self) -> None:
        return None

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        return self._leases.lock(name, ttl_seconds, wait_seconds)

    async def close(self) -> None:
        self._entries.clear()
