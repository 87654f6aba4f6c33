"""A bounded LRU of per-message token counts.

Clients re-send the whole conversation every turn; caching counts by a key of each message's
canonical bytes (:func:`~.canonical.cache_key`) makes a new turn cost only its new messages.
The bound keeps a long-running proxy's memory flat; the lock keeps it correct if the edge
counts in a thread pool.  :meth:`CountCache.get_many` / :meth:`CountCache.put_many` serve a
whole request under one lock acquisition.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence


class CountCache:
    """LRU mapping ``key -> token count`` with hit/miss counters for metrics."""

    def __init__(self, maxsize: int = 65_536) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self._maxsize = maxsize
        self._data: OrderedDict[Hashable, int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> int | None:
        """The cached count for ``key`` (marking it recently used), or ``None``."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def get_many(self, keys: Sequence[Hashable]) -> list[int | None]:
        """:meth:`get` for every key, under one lock acquisition."""
        with self._lock:
            data = self._data
            lookup = data.get
            touch = data.move_to_end
            out = [lookup(key) for key in keys]
            hits = 0
            for key, value in zip(keys, out, strict=True):
                if value is not None:
                    touch(key)
                    hits += 1
            self.hits += hits
            self.misses += len(out) - hits
            return out

    def put(self, key: Hashable, value: int) -> None:
        """Store a count, evicting the least recently used entry beyond the bound."""
        if self._maxsize == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self._maxsize:
                self._data.popitem(last=False)

    def put_many(self, items: Sequence[tuple[Hashable, int]]) -> None:
        """:meth:`put` for every ``(key, count)`` pair in order, under one lock acquisition."""
        if self._maxsize == 0 or not items:
            return
        with self._lock:
            data = self._data
            for key, value in items:
                data[key] = value
                data.move_to_end(key)
            while len(data) > self._maxsize:
                data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = 0
            self.misses = 0
