"""``make_store`` picks the backend from ``store.backend``."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_proxy.checkpoints import (
    Checkpoint,
    MemoryStore,
    RedisStore,
    SqliteStore,
    StoreBreaker,
    make_archive_store,
    make_store,
)
from compaction_proxy.config import ConfigError, StoreSettings


async def test_each_backend(tmp_path: Path, redis_url: str) -> None:
    memory = make_store(StoreSettings.model_validate({"backend": "memory", "max_entries": 5}))
    sqlite = make_store(
        StoreSettings.model_validate({"backend": "sqlite", "path": str(tmp_path / "x" / "cp.db")})
    )
    redis_store = make_store(StoreSettings.model_validate({"backend": "redis", "url": redis_url}))
    # Every backend sits behind the circuit breaker (compaction_proxy/checkpoints/_breaker.py).
    assert all(isinstance(s, StoreBreaker) for s in (memory, sqlite, redis_store))
    assert isinstance(memory.inner, MemoryStore)
    assert isinstance(sqlite.inner, SqliteStore)
    assert isinstance(redis_store.inner, RedisStore)
    for store in (memory, sqlite, redis_store):
        await store.ping()
        await store.close()


def test_redis_needs_a_valid_url() -> None:
    with pytest.raises(ConfigError, match=r"store\.url"):
        make_store(StoreSettings.model_validate({"backend": "redis"}))
    with pytest.raises(ConfigError, match=r"store\.url") as caught:
        make_store(
            StoreSettings.model_validate({"backend": "redis", "url": "http://u:pw-SECRET@host/0"})
        )
    assert "SECRET" not in str(caught.value)


async def test_memory_store_is_bounded() -> None:
    from tests.checkpoints.test_store_contract import chain, checkpoint

    store = MemoryStore(max_entries=3)
    keys = chain(5)
    for key in keys:
        await store.put("ns", key, checkpoint(key), 3600)
    assert len(store) == 3
    # The two oldest were evicted; the newest is found.
    assert await store.find_longest("ns", keys[:2]) is None
    hit = await store.find_longest("ns", keys)
    assert hit is not None and hit[0] == 5


async def test_memory_store_bounded_by_bytes() -> None:
    big = Checkpoint(({"role": "tool", "tool_call_id": "c", "content": "x" * 1_000},), 1.0)
    size = len(big.to_bytes())
    store = MemoryStore(max_entries=1_000, max_bytes=3 * (size + 400))
    for n in range(6):
        await store.put("ns", f"k{n}", big, 3600)
        assert store.bytes <= 3 * (size + 400)
    assert len(store) == 3
    assert await store.find_longest("ns", ["k0", "k1", "k2"]) is None
    assert await store.find_longest("ns", ["k5"]) is not None
    # Replacing an entry does not count it twice; deleting one gives its bytes back.
    await store.put("ns", "k5", big, 3600)
    assert len(store) == 3
    before = store.bytes
    assert await store.delete("ns", "k5")
    assert store.bytes < before and len(store) == 2
    # An entry heavier than the whole bound is not kept: the bound holds.
    huge = Checkpoint(({"role": "user", "content": "y" * 10_000},), 1.0)
    await store.put("ns", "huge", huge, 3600)
    assert await store.find_longest("ns", ["huge"]) is None
    assert store.bytes <= 3 * (size + 400)


async def test_the_archive_has_a_store_of_its_own_only_in_memory(tmp_path: Path) -> None:
    """The memory backend's archive rows go to a memory store of their own, bounded by
    ``store.archive_max_mb`` (so recall never evicts a checkpoint); SQLite and Redis keep them
    beside the checkpoints (rows expire by TTL: no count bound ties the two)."""
    memory_settings = StoreSettings.model_validate({"backend": "memory", "archive_max_mb": 2})
    memory = make_store(memory_settings)
    archive = make_archive_store(memory_settings, memory)
    assert archive is not memory and isinstance(archive, StoreBreaker)
    assert isinstance(archive.inner, MemoryStore) and archive.inner is not memory.inner
    huge = Checkpoint(({"role": "user", "content": "z" * 3_000_000},), 1.0)
    await archive.put("ns", "k", huge, 60)
    assert archive.inner.bytes == 0  # past 2 MB: not kept
    sqlite_settings = StoreSettings.model_validate(
        {"backend": "sqlite", "path": str(tmp_path / "cp.db")}
    )
    sqlite = make_store(sqlite_settings)
    assert make_archive_store(sqlite_settings, sqlite) is sqlite
    await sqlite.close()
