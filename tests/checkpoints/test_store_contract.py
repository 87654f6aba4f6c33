"""The checkpoint store contract, run against memory, sqlite and redis alike."""

from __future__ import annotations

import asyncio

from compaction_proxy.checkpoints import Checkpoint, CheckpointStore
from tests.checkpoints.conftest import StoreFactory

NS = "ns-a"


def checkpoint(tag: str, **meta: object) -> Checkpoint:
    return Checkpoint(
        messages=(
            {"role": "user", "content": f"<summary>\n{tag}\n</summary>"},
            {"role": "assistant", "content": "ok", "x_extra": {"kept": [1, 2]}},
        ),
        created_at=1_700_000_000.5,
        meta={"tag": tag, **meta},
    )


def chain(n: int, prefix: str = "h") -> list[str]:
    return [f"{prefix}{i:04x}" for i in range(1, n + 1)]


async def test_is_a_checkpoint_store(store_factory: StoreFactory) -> None:
    store = store_factory()
    assert isinstance(store, CheckpointStore)
    assert store.name in ("memory", "sqlite", "redis")
    await store.ping()


async def test_miss_on_empty_store_and_empty_keys(store_factory: StoreFactory) -> None:
    store = store_factory()
    assert await store.find_longest(NS, chain(5)) is None
    assert await store.find_longest(NS, []) is None


async def test_round_trip_keeps_messages_and_meta(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(3)
    stored = checkpoint("one", tokens_before=1000, strategies=["summarization"])
    await store.put(NS, keys[1], stored, 3600)
    hit = await store.find_longest(NS, keys)
    assert hit is not None
    index, found = hit
    assert index == 2  # keys[1] is h_2: the checkpoint stands for two messages
    assert found == stored


async def test_find_longest_picks_the_largest_index(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(40)
    for i in (3, 17, 25):
        await store.put(NS, keys[i - 1], checkpoint(f"at-{i}"), 3600)
    hit = await store.find_longest(NS, keys)
    assert hit is not None and hit[0] == 25 and hit[1].meta["tag"] == "at-25"
    # Only a prefix of the chain (an older request) finds the older checkpoint.
    hit = await store.find_longest(NS, keys[:20])
    assert hit is not None and hit[0] == 17


async def test_many_keys_beyond_one_sql_batch(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(1500)
    await store.put(NS, keys[10], checkpoint("early"), 3600)
    await store.put(NS, keys[1201], checkpoint("late"), 3600)
    hit = await store.find_longest(NS, keys)
    assert hit is not None and hit[0] == 1202


async def test_namespaces_are_isolated(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(4)
    await store.put("tenant-1", keys[3], checkpoint("t1"), 3600)
    assert await store.find_longest("tenant-2", keys) is None
    assert (await store.find_longest("tenant-1", keys)) is not None


async def test_put_replaces(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(2)
    await store.put(NS, keys[0], checkpoint("old"), 3600)
    await store.put(NS, keys[0], checkpoint("new"), 3600)
    hit = await store.find_longest(NS, keys)
    assert hit is not None and hit[1].meta["tag"] == "new"


async def test_ttl_expiry(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = chain(3)
    await store.put(NS, keys[0], checkpoint("long-lived"), 3600)
    await store.put(NS, keys[2], checkpoint("short-lived"), 1)
    hit = await store.find_longest(NS, keys)
    assert hit is not None and hit[0] == 3
    # Expiry is the backend's own clock (Redis's included), so poll, with a generous bound.
    async with asyncio.timeout(15):
        while (hit := await store.find_longest(NS, keys)) is not None and hit[0] == 3:
            await asyncio.sleep(0.05)
    assert hit is not None and hit[0] == 1  # the expired longer one no longer counts


async def test_two_instances_share_entries(store_factory: StoreFactory) -> None:
    """Two workers on one sqlite file, two replicas on one Redis."""
    first, second = store_factory(), store_factory()
    keys = chain(6)
    await first.put(NS, keys[4], checkpoint("from-first"), 3600)
    hit = await second.find_longest(NS, keys)
    assert hit is not None and hit[0] == 5 and hit[1].meta["tag"] == "from-first"


async def test_lock_single_flight(store_factory: StoreFactory) -> None:
    store = store_factory()
    other = store_factory()
    events: list[str] = []
    holding = asyncio.Event()

    async def holder() -> None:
        async with store.lock("prefix-1", ttl_seconds=10, wait_seconds=1) as acquired:
            assert acquired
            events.append("A acquired")
            holding.set()
            await asyncio.sleep(0.3)
            events.append("A releases")

    async def waiter() -> None:
        await holding.wait()
        async with other.lock("prefix-1", ttl_seconds=10, wait_seconds=5) as acquired:
            assert acquired  # B waited while A held it (the order below), then got it
            events.append("B acquired")

    await asyncio.gather(holder(), waiter())
    assert events == ["A acquired", "A releases", "B acquired"]


async def test_lock_wait_times_out(store_factory: StoreFactory) -> None:
    store = store_factory()
    other = store_factory()
    async with store.lock("prefix-2", ttl_seconds=10, wait_seconds=0) as first:
        assert first
        # Gives up after its wait (test_lock_single_flight shows it does wait); the generous
        # bound only stops a lock that would wait forever.
        second_lock = other.lock("prefix-2", ttl_seconds=10, wait_seconds=0.3)
        second = await asyncio.wait_for(second_lock.__aenter__(), 15)
        assert not second
        await second_lock.__aexit__(None, None, None)
        # A different name is independent.
        async with other.lock("prefix-3", ttl_seconds=10, wait_seconds=0) as third:
            assert third
    # Released: free again at once.
    async with other.lock("prefix-2", ttl_seconds=10, wait_seconds=0) as again:
        assert again


async def test_lock_expires_when_holder_hangs(store_factory: StoreFactory) -> None:
    store = store_factory()
    other = store_factory()
    async with store.lock("prefix-4", ttl_seconds=0.3, wait_seconds=0) as first:
        assert first
        async with other.lock("prefix-4", ttl_seconds=5, wait_seconds=0) as early:
            assert not early  # the lease still holds
        async with other.lock("prefix-4", ttl_seconds=5, wait_seconds=10) as second:
            assert second  # got it once the first lease ran out


async def test_expired_holder_does_not_release_the_next_holders_lock(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    other = store_factory()
    lock_a = store.lock("prefix-5", ttl_seconds=0.2, wait_seconds=0)
    assert await lock_a.__aenter__()
    # B waits until A's lease has expired while A still "works".
    lock_b = other.lock("prefix-5", ttl_seconds=10, wait_seconds=10)
    assert await lock_b.__aenter__()  # B holds it now
    await lock_a.__aexit__(None, None, None)  # A finishes late and releases: must be a no-op
    async with store.lock("prefix-5", ttl_seconds=10, wait_seconds=0) as third:
        assert not third  # B's lock survived A's release
    await lock_b.__aexit__(None, None, None)
    async with store.lock("prefix-5", ttl_seconds=10, wait_seconds=0) as fourth:
        assert fourth


async def test_lock_released_when_the_body_raises(store_factory: StoreFactory) -> None:
    store = store_factory()
    try:
        async with store.lock("prefix-6", ttl_seconds=10, wait_seconds=0) as acquired:
            assert acquired
            raise RuntimeError("summarizer blew up")
    except RuntimeError:
        pass
    async with store.lock("prefix-6", ttl_seconds=10, wait_seconds=0) as again:
        assert again
