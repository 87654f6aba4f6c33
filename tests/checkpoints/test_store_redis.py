"""Redis specifics: key layout, one round trip, and behaviour when Redis is down or hangs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from compaction_proxy.checkpoints import RedisStore, StoreUnavailable
from tests.checkpoints.test_store_contract import chain, checkpoint
from tests.support.redis_server import RedisServer


def fast_store(url: str) -> RedisStore:
    """Short timeouts, so tests of a dead Redis finish quickly."""
    return RedisStore(url, socket_timeout=0.5, connect_timeout=0.5, op_timeout=1.0)


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def test_key_layout_and_ttl(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.put("tenant:model:v1", "abc123", checkpoint("x"), 120)
    with redis.Redis.from_url(redis_url) as client:
        assert client.exists("cp:tenant:model:v1:abc123")
        assert 0 < client.ttl("cp:tenant:model:v1:abc123") <= 120
    await store.close()


async def test_find_longest_is_one_mget(redis_url: str) -> None:
    store = RedisStore(redis_url)
    keys = chain(300)
    for i in (2, 150, 299):
        await store.put("ns", keys[i - 1], checkpoint(str(i)), 3600)
    await store.ping()  # connections established (handshakes done) before counting
    counter = redis.Redis.from_url(redis_url)
    before = _command_calls(counter)
    hit = await store.find_longest("ns", keys)
    after = _command_calls(counter)
    counter.close()
    assert hit is not None and hit[0] == 299
    changed = {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] != before.get(name, 0)
    }
    changed.pop("info", None)  # the counting itself
    assert changed == {"mget": 1}
    await store.close()


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but never listening: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_redis_down_at_start(dead_port: int) -> None:
    store = fast_store(f"redis://127.0.0.1:{dead_port}/0")

    async def every_call_fails() -> None:
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.find_longest("ns", chain(3))
        with pytest.raises(StoreUnavailable):
            await store.put("ns", "k", checkpoint("x"), 60)
        with pytest.raises(StoreUnavailable):
            async with store.lock("l", 1, 0.2):
                pass

    await asyncio.wait_for(every_call_fails(), 30)  # a bound, not a latency: no call hangs
    await store.close()


async def test_redis_that_never_answers_does_not_hang() -> None:
    # Accepts connections (via the backlog) but never replies.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        store = fast_store(f"redis://127.0.0.1:{sock.getsockname()[1]}/0")
        # Nothing but the store's own timeouts can end this call (the bound stops a hang).
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.find_longest("ns", chain(3)), 30)
        await store.close()


async def test_redis_killed_mid_run_then_back(own_redis: RedisServer) -> None:
    store = fast_store(own_redis.url)
    keys = chain(4)
    await store.put("ns", keys[2], checkpoint("before"), 3600)
    assert await store.find_longest("ns", keys) is not None
    port = own_redis.port
    own_redis.stop()

    async def every_call_fails() -> None:
        with pytest.raises(StoreUnavailable):
            await store.find_longest("ns", keys)
        with pytest.raises(StoreUnavailable):
            await store.put("ns", keys[3], checkpoint("during"), 3600)
        with pytest.raises(StoreUnavailable):
            await store.ping()

    await asyncio.wait_for(every_call_fails(), 30)  # a bound, not a latency: no call hangs
    # Back on the same port (empty, persistence is off): the same store recovers.
    own_redis.start(port=port)
    await store.ping()
    assert await store.find_longest("ns", keys) is None
    await store.put("ns", keys[3], checkpoint("after"), 3600)
    hit = await store.find_longest("ns", keys)
    assert hit is not None and hit[0] == 4
    await store.close()


async def test_error_messages_never_show_the_password(dead_port: int) -> None:
    store = fast_store(f"redis://user:s3cr3t-pw@127.0.0.1:{dead_port}/0")
    with pytest.raises(StoreUnavailable) as caught:
        await store.ping()
    assert "s3cr3t-pw" not in str(caught.value)
    await store.close()


async def test_concurrent_lookups_share_the_pool(redis_url: str) -> None:
    store = RedisStore(redis_url)
    keys = chain(50)
    await store.put("ns", keys[49], checkpoint("x"), 3600)
    hits = await asyncio.gather(*(store.find_longest("ns", keys) for _ in range(100)))
    assert all(h is not None and h[0] == 50 for h in hits)
    await store.close()
