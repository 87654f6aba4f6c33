"""Single-flight leases: in process for the memory store, polled for the shared ones.

A lease is a lock with an owner token and an expiry: a holder that hangs loses it after its
TTL, like the Redis lock, so a stuck summarizer call cannot block a prefix forever. In one
process waiters wake on release and otherwise re-check at the expiry, never busy-poll; the
stores shared across replicas (SQLite, Redis) poll with a growing delay (:func:`polled_lock`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

from ._contract import StoreUnavailable


class LeaseTable:
    """Named leases inside one event loop."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}
        self._released: dict[str, asyncio.Event] = {}

    def _try_acquire(self, name: str, ttl_seconds: float) -> str | None:
        now = time.monotonic()
        held = self._held.get(name)
        if held is not None and held[1] > now:
            return None
        token = uuid.uuid4().hex
        self._held[name] = (token, now + ttl_seconds)
        return token

    def _release(self, name: str, token: str) -> None:
        held = self._held.get(name)
        if held is not None and held[0] == token:
            del self._held[name]
            event = self._released.pop(name, None)
            if event is not None:
                event.set()

    @asynccontextmanager
    async def lock(self, name: str, ttl_seconds: float, wait_seconds: float) -> AsyncIterator[bool]:
        """True when acquired, False when ``wait_seconds`` passed first."""
        deadline = time.monotonic() + max(wait_seconds, 0.0)
        token = self._try_acquire(name, ttl_seconds)
        while token is None:
            now = time.monotonic()
            if now >= deadline:
                break
            held = self._held.get(name)
            expires = held[1] if held is not None else now
            event = self._released.setdefault(name, asyncio.Event())
            with suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(min(deadline, expires) - now, 0.001))
            token = self._try_acquire(name, ttl_seconds)
        try:
            yield token is not None
        finally:
            if token is not None:
                self._release(name, token)


@asynccontextmanager
async def polled_lock(
    acquire: Callable[[], Awaitable[bool]],
    release: Callable[[], Awaitable[object]],
    wait_seconds: float,
    *,
    poll_seconds: float,
    poll_max_seconds: float,
) -> AsyncIterator[bool]:
    """A store's lock (``CheckpointStore.lock``) from its two atomic steps.

    ``acquire`` is retried, with a delay doubling from ``poll_seconds`` up to
    ``poll_max_seconds``, until it succeeds or ``wait_seconds`` passed; True when acquired.
    ``release`` runs only for a lock this caller holds, and a store that fails it is ignored:
    the lock expires after its TTL.
    """
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    delay = poll_seconds
    acquired = await acquire()
    while not acquired and time.monotonic() < deadline:
        await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(delay * 2, poll_max_seconds)
        acquired = await acquire()
    try:
        yield acquired
    finally:
        if acquired:
            with suppress(StoreUnavailable):
                await release()
