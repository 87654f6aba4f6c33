"""Checkpoints the store would not take, held in this process until it takes them again.

A checkpoint holds what was paid for: a summary. When the store refuses the write (a full
disk, a quota, a Redis out of memory, or a store that is down altogether), dropping it means
the next request of the conversation finds no checkpoint, compacts afresh and pays the
summarizer again: on a full disk, nearly one summarizer call per request. So a refused
checkpoint is held here, under exactly the key the store would have had (namespace and chain
hash: the namespace holds the credential, the tenant and the request's scope, so nothing
crosses a conversation's boundary), and :class:`~._lookup.Checkpoints` reads it beside the
store.

Bounded by the bytes held (:data:`DEFAULT_MAX_BYTES`, least recently used out) and by the
checkpoint's TTL; one process only (replicas do not see each other's), lost on restart: the
store remains the place checkpoints live.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ._contract import Checkpoint, ttl_at_least_one
from ._decoded import live_payloads, pick_longest

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Stored bytes held at most (a 500k-token session's checkpoint is about 2 MB)."""


class HeldCheckpoints:
    """A bounded, expiring map of (namespace, key) -> checkpoint bytes."""

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        self._namespaces: dict[str, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Stored bytes held."""
        return self._bytes

    def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> bool:
        """Holds ``checkpoint``; False when it is larger than the whole bound."""
        data = checkpoint.to_bytes()
        if len(data) > self.max_bytes:
            return False
        self._drop((namespace, key))
        expires = self._clock() + ttl_at_least_one(ttl_seconds)
        self._entries[(namespace, key)] = (expires, data)
        self._namespaces[namespace] = self._namespaces.get(namespace, 0) + 1
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def find_longest(self, namespace: str, keys: Sequence[str]) -> tuple[int, Checkpoint] | None:
        """The longest held checkpoint among ``keys`` (1-based count, as the stores answer)."""
        if namespace not in self._namespaces:
            return None  # the usual case, and the hot path's: nothing held for it
        found = live_payloads(self._entries, namespace, keys, self._clock(), self._drop)
        picked = pick_longest(keys, found)
        for foreign in picked.foreign:  # never ours to hold; gone
            self._drop((namespace, foreign.key))
        hit = picked.hit
        if hit is not None:
            self._entries.move_to_end((namespace, keys[hit[0] - 1]))
        return hit

    def _drop(self, item: tuple[str, str]) -> None:
        entry = self._entries.pop(item, None)
        if entry is None:
            return
        self._bytes -= len(entry[1])
        namespace = item[0]
        left = self._namespaces[namespace] - 1
        if left:
            self._namespaces[namespace] = left
        else:
            del self._namespaces[namespace]
