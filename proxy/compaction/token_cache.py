"""A bounded LRU of per-message token counts.

Clients re-send the whole conversation every turn; caching counts by a digest of each
message's canonical bytes makes a new turn cost only its new messages.  The bound keeps a
long-running proxy's memory flat; the lock keeps it correct if the edge counts in a thread pool.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class CountCache:
    """LRU mapping ``digest -> token count`` with hit/miss counters for metrics."""

    def __init__(self, maxsize: int = 65_536) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self._maxsize = maxsize
        self._data: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> int | None:
        """The cached count for ``key`` (marking it recently used), or ``None``."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: bytes, value: int) -> None:
        """Store a count, evicting the least recently used entry beyond the bound."""
        if self._maxsize == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self._maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = 0
            self.misses = 0
