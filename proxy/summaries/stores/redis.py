"""Checkpoints in Redis, shared by every replica of the proxy.

* Keys ``cp:{namespace}:{key}`` with ``EX`` TTLs; lookup is one ``MGET`` over all candidates.
* Single-flight across replicas: ``SET lock:{name} token NX PX ttl``; waiters poll with a
  growing delay until ``wait_seconds``; release runs a compare-and-delete script so a holder
  whose lease expired never deletes the next holder's lock.
* A Redis that is down or unreachable must not stall requests: connect and socket timeouts are
  short, redis-py's own retries are limited to one immediate retry (which reconnects a pooled
  connection after a Redis restart), and every operation is also bounded by ``op_timeout``.
  Any backend error becomes :class:`StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .base import Checkpoint, StoreUnavailable, pick_longest, ttl_at_least_one

T = TypeVar("T")

KEY_PREFIX = "cp:"
LOCK_PREFIX = "lock:"
LOCK_POLL_SECONDS = 0.02
LOCK_POLL_MAX_SECONDS = 0.25

# Deletes the lock only if it still holds our token (atomic on the server).
_RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class RedisStore:
    """Checkpoints in the Redis at ``url`` (``redis://[user:password@]host:port/db``)."""

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        op_timeout: float = 3.0,
        max_connections: int = 64,
    ) -> None:
        self._url = url
        self._op_timeout = op_timeout
        # A blocking pool: under a burst, requests queue for a connection (bounded by
        # op_timeout) instead of failing with MaxConnectionsError.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=op_timeout,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 1),
            health_check_interval=30,
        )
        self._client: aioredis.Redis = aioredis.Redis.from_pool(pool)  # owns the pool

    def _key(self, namespace: str, key: str) -> str:
        return f"{KEY_PREFIX}{namespace}:{key}"

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._op_timeout):
                return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            # The message never repeats the URL: it may carry a password.
            raise StoreUnavailable(f"redis store: {type(exc).__name__}") from exc

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        if not keys:
            return None
        values: list[Any] = await self._call(
            self._client.mget([self._key(namespace, k) for k in keys])
        )
        found = {key: value for key, value in zip(keys, values, strict=True) if value is not None}
        return pick_longest(keys, found)

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        await self._call(
            self._client.set(
                self._key(namespace, key), checkpoint.to_bytes(), ex=ttl_at_least_one(ttl_seconds)
            )
        )

    async def ping(self) -> None:
        await self._call(self._client.ping())

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        return self._lock(name, ttl_seconds, wait_seconds)

    @asynccontextmanager
    async def _lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AsyncIterator[bool]:
        key = LOCK_PREFIX + name
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl_seconds * 1000))

        async def attempt() -> bool:
            return bool(await self._call(self._client.set(key, token, nx=True, px=ttl_ms)))

        deadline = time.monotonic() + max(wait_seconds, 0.0)
        delay = LOCK_POLL_SECONDS
        acquired = await attempt()
        while not acquired and time.monotonic() < deadline:
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, LOCK_POLL_MAX_SECONDS)
            acquired = await attempt()
        try:
            yield acquired
        finally:
            if acquired:
                with suppress(StoreUnavailable):  # the lock expires after its TTL
                    await self._call(self._client.eval(_RELEASE_SCRIPT, 1, key, token))

    async def close(self) -> None:
        with suppress(RedisError, OSError):
            await self._client.aclose()
