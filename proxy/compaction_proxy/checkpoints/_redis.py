"""Checkpoints in Redis, shared by every replica of the proxy.

* Keys ``cp:{namespace}:{key}`` with ``EX`` TTLs; lookup is one ``MGET`` over all candidates.
* Single-flight across replicas: ``SET lock:{name} token NX PX ttl``; waiters poll with a
  growing delay until ``wait_seconds``; release runs a compare-and-delete script so a holder
  whose lease expired never deletes the next holder's lock.
* A Redis that is down or unreachable must not stall requests: connect and socket timeouts are
  short, redis-py's own retries are limited to one immediate retry (which reconnects a pooled
  connection after a Redis restart), and every operation is also bounded by ``op_timeout``
  and by what is left of the request's store budget (:mod:`._deadline`). Any backend error
  becomes :class:`StoreUnavailable`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ._contract import Checkpoint, Foreign, StoreUnavailable, log_foreign, ttl_at_least_one
from ._deadline import bounded
from ._decoded import pick_longest
from ._leases import polled_lock

T = TypeVar("T")

log = logging.getLogger("compaction_proxy.stores")

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

# Deletes each KEYS[i] only while it still holds ARGV[i]: a foreign value read by a lookup,
# not a valid checkpoint another replica wrote under the same key since.
_DELETE_IF_UNCHANGED_SCRIPT = """
local deleted = 0
for i, key in ipairs(KEYS) do
    if redis.call('get', key) == ARGV[i] then
        deleted = deleted + redis.call('del', key)
    end
end
return deleted
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
        self.foreign_values = 0
        """Foreign values met by lookups (and deleted); see :mod:`._contract`."""

    def _key(self, namespace: str, key: str) -> str:
        return f"{KEY_PREFIX}{namespace}:{key}"

    async def _call(self, command: Callable[[], Awaitable[T]]) -> T:
        """Runs ``command()`` (built only once the budget allows the call)."""
        try:
            async with bounded(self._op_timeout):
                return await command()
        except (RedisError, OSError, TimeoutError) as exc:
            # The message never repeats the URL: it may carry a password.
            raise StoreUnavailable(f"redis store: {type(exc).__name__}") from exc

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        if not keys:
            return None
        values: list[Any] = await self._call(
            lambda: self._client.mget([self._key(namespace, k) for k in keys])
        )
        found = {key: value for key, value in zip(keys, values, strict=True) if value is not None}
        picked = pick_longest(keys, found)
        if picked.foreign:
            await self._drop_foreign(namespace, picked.foreign)
        return picked.hit

    async def _drop_foreign(self, namespace: str, foreign: tuple[Foreign, ...]) -> None:
        self.foreign_values += len(foreign)
        log_foreign(self.name, namespace, foreign)
        # MGET answers bytes; anything else could not have come from Redis.
        pairs = [(i.key, i.value) for i in foreign if isinstance(i.value, bytes | str)]
        keys = [self._key(namespace, key) for key, _ in pairs]
        values = [value for _, value in pairs]
        try:
            await self._call(
                lambda: self._client.eval(_DELETE_IF_UNCHANGED_SCRIPT, len(keys), *keys, *values)
            )
        except StoreUnavailable as exc:  # the next lookup tries again
            log.warning("foreign values not deleted: %s", exc)

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        data = checkpoint.to_bytes()
        await self._call(
            lambda: self._client.set(
                self._key(namespace, key), data, ex=ttl_at_least_one(ttl_seconds)
            )
        )

    async def delete(self, namespace: str, key: str) -> bool:
        deleted = await self._call(lambda: self._client.delete(self._key(namespace, key)))
        return bool(deleted)

    async def ping(self) -> None:
        await self._call(self._client.ping)

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        key = LOCK_PREFIX + name
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl_seconds * 1000))

        async def acquire() -> bool:
            return bool(await self._call(lambda: self._client.set(key, token, nx=True, px=ttl_ms)))

        async def release() -> object:
            return await self._call(lambda: self._client.eval(_RELEASE_SCRIPT, 1, key, token))

        return polled_lock(
            acquire,
            release,
            wait_seconds,
            poll_seconds=LOCK_POLL_SECONDS,
            poll_max_seconds=LOCK_POLL_MAX_SECONDS,
        )

    async def close(self) -> None:
        with suppress(RedisError, OSError):
            await self._client.aclose()
