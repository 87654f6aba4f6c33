"""What a checkpoint is and what every checkpoint store promises
(compaction_proxy/checkpoints/README.md, "The
store contract").

A checkpoint is what the pipeline made of a prefix ``m_1..m_i`` of the non-system messages,
stored under the prefix's chain hash ``h_i``. The edge asks once per request for the longest
stored prefix, so :meth:`CheckpointStore.find_longest` takes all candidate hashes and answers in
one round trip.

Failure model: a store is an optimisation, so its failure must never fail a request. Every
method raises :class:`StoreUnavailable` (and nothing else) for backend problems; the edge reads
that as "no checkpoint".

Foreign values: a row the proxy cannot trust (written by another program or an older format,
truncated, or holding messages no client could have sent) is never handed to the pipeline,
where it would break token counting and cost the request. Reading one is a miss; the store
counts it (``foreign_values``), deletes it, and keeps looking at shorter prefixes.

Index convention: ``keys[0]`` is ``h_1``; a hit on ``keys[j]`` is reported as ``i = j + 1``,
the number of non-system messages the checkpoint stands for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.compaction.validation import validate_messages

log = logging.getLogger("compaction_proxy.stores")

FORMAT_VERSION = 1
"""The ``"v"`` of the serialized form. Every row this proxy has ever written carries ``"v": 1``
(the field has been written since the first store), so the current format *is* version 1, and a
row without ``"v"`` (or with another value) was not written by this code: it is foreign."""


class StoreUnavailable(CompactionProxyError):
    """The store's backend could not be reached or failed; treat as "no checkpoint"."""


class ForeignValue(CompactionProxyError, ValueError):
    """A stored value that is not a checkpoint of this format; ``reason`` says why (no data)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"not a stored checkpoint: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The compacted form of a message prefix.

    ``messages``: the non-system messages that replace the prefix (summary message, kept and
    trimmed messages), as plain OpenAI dicts; empty for the values of :mod:`._keyvalue`
    (shared summaries, learned context windows), which are the ``meta`` alone. ``meta``:
    free-form facts for reports (strategies, tokens before/after, summary model);
    JSON-serializable.
    """

    messages: tuple[dict[str, Any], ...]
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """orjson bytes; the stored form in every backend."""
        return orjson.dumps(
            {
                "v": FORMAT_VERSION,
                "messages": list(self.messages),
                "created_at": self.created_at,
                "meta": self.meta,
            }
        )

    @classmethod
    def from_bytes(cls, data: object) -> Checkpoint:
        """Parses :meth:`to_bytes` output; :class:`ForeignValue` when it is not a checkpoint.

        The messages pass the same validator as a client's request (``validate_messages``):
        what the pipeline reads from the store must be what it would accept from a client.
        """
        if not isinstance(data, bytes | bytearray | memoryview | str):
            raise ForeignValue(f"a {type(data).__name__}, not bytes")
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ForeignValue("not JSON") from exc
        if not isinstance(raw, dict):
            raise ForeignValue("not an object")
        version = raw.get("v")
        if type(version) is not int or version != FORMAT_VERSION:
            raise ForeignValue("unknown format version")
        messages = raw.get("messages")
        if not isinstance(messages, list):
            raise ForeignValue("messages is not a list")
        created_at = raw.get("created_at")
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise ForeignValue("created_at is not a number")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise ForeignValue("meta is not an object")
        issue = check_messages(messages)
        if issue is not None:
            raise ForeignValue(issue)
        return cls(tuple(messages), float(created_at), meta)


def check_messages(messages: Sequence[object]) -> str | None:
    """Why ``messages`` cannot be a checkpoint's, or None. Empty is fine (meta-only records)."""
    if not messages:
        return None
    issue = validate_messages(list(messages))
    return None if issue is None else issue.message


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live: ``memory``, ``sqlite`` (default) or ``redis``."""

    name: str

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        """``(i, checkpoint)`` for the largest ``i`` whose key ``keys[i - 1]`` holds a live
        checkpoint, in one round trip; ``None`` when no key does.

        A foreign value (see the module docstring) is skipped, counted and deleted: a valid
        shorter prefix behind it is still found."""
        ...

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        """Stores (or replaces) the checkpoint for ``key``; it expires after ``ttl_seconds``."""
        ...

    async def delete(self, namespace: str, key: str) -> bool:
        """Removes the entry for ``key``; True when there was one (a missing key is no error)."""
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


@dataclass(frozen=True, slots=True)
class Foreign:
    """A foreign value met by a lookup: its key, the value as the backend returned it (a
    backend deletes the row only while it still holds exactly this, so a valid checkpoint
    written meanwhile survives) and why it was refused."""

    key: str
    value: object
    reason: str


def log_foreign(store: str, namespace: str, foreign: Sequence[Foreign]) -> None:
    """One warning per foreign value: which store, the key's start and why (never the data)."""
    for item in foreign:
        log.warning(
            "foreign value in the %s checkpoint store (namespace %.12s, key %.12s): %s; "
            "treated as a miss and deleted",
            store,
            namespace,
            item.key,
            item.reason,
        )


def ttl_at_least_one(ttl_seconds: float) -> int:
    """Backends reject a zero TTL; one second is the shortest life an entry gets."""
    return max(1, int(ttl_seconds))
