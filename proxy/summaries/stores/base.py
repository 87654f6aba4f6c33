"""What a checkpoint is and what every checkpoint store promises (DESIGN §7).

A checkpoint is what the pipeline made of a prefix ``m_1..m_i`` of the non-system messages,
stored under the prefix's chain hash ``h_i``. The edge asks once per request for the longest
stored prefix, so :meth:`CheckpointStore.find_longest` takes all candidate hashes and answers in
one round trip.

Failure model: a store is an optimisation, so its failure must never fail a request. Every
method raises :class:`StoreUnavailable` (and nothing else) for backend problems; the edge reads
that as "no checkpoint".

Index convention: ``keys[0]`` is ``h_1``; a hit on ``keys[j]`` is reported as ``i = j + 1``,
the number of non-system messages the checkpoint stands for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson


class StoreUnavailable(Exception):
    """The store's backend could not be reached or failed; treat as "no checkpoint"."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The compacted form of a message prefix.

    ``messages``: the non-system messages that replace the prefix (summary message, kept and
    trimmed messages), as plain OpenAI dicts. ``meta``: free-form facts for reports (strategies,
    tokens before/after, summary model); JSON-serializable.
    """

    messages: tuple[dict[str, Any], ...]
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """orjson bytes; the stored form in every backend."""
        return orjson.dumps(
            {
                "v": 1,
                "messages": list(self.messages),
                "created_at": self.created_at,
                "meta": self.meta,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Checkpoint:
        """Parses :meth:`to_bytes` output; ``ValueError`` when it is not a checkpoint."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError("not a stored checkpoint") from exc
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("messages"), list)
            or not isinstance(raw.get("created_at"), int | float)
        ):
            raise ValueError("not a stored checkpoint")
        meta = raw.get("meta")
        return cls(
            tuple(raw["messages"]), float(raw["created_at"]), meta if isinstance(meta, dict) else {}
        )


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live: ``memory``, ``sqlite`` (default) or ``redis``."""

    name: str

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        """``(i, checkpoint)`` for the largest ``i`` whose key ``keys[i - 1]`` holds a live
        entry, in one round trip; ``None`` when no key does."""
        ...

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        """Stores (or replaces) the checkpoint for ``key``; it expires after ``ttl_seconds``."""
        ...

    async def ping(self) -> None:
        """Returns when the backend answers; raises :class:`StoreUnavailable` otherwise."""
        ...

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        """Single-flight: ``async with store.lock(name, ttl, wait) as acquired``.

        ``acquired`` is True when this caller holds the lock, False when ``wait_seconds``
        passed while someone else held it (the caller may re-check the store or go ahead).
        A holder that dies loses the lock after ``ttl_seconds``. Release is best-effort and
        never raises: an unreleased lock expires on its own.
        """
        ...

    async def close(self) -> None:
        """Releases connections and threads; the store is unusable afterwards."""
        ...


def pick_longest(
    keys: Sequence[str], found: Mapping[str, bytes | str]
) -> tuple[int, Checkpoint] | None:
    """The hit with the largest index among ``found`` (key -> stored bytes).

    An entry that does not parse (a foreign or corrupt value) is skipped, so one bad row costs
    a cache miss, not a failed request.
    """
    for index in range(len(keys) - 1, -1, -1):
        data = found.get(keys[index])
        if data is None:
            continue
        try:
            return index + 1, Checkpoint.from_bytes(data)
        except ValueError:
            continue
    return None


def ttl_at_least_one(ttl_seconds: float) -> int:
    """Backends reject a zero TTL; one second is the shortest life an entry gets."""
    return max(1, int(ttl_seconds))
