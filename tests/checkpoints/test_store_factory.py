"""``make_store`` picks the backend from ``store.backend``."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_proxy.checkpoints import (
    MemoryStore,
    RedisStore,
    SqliteStore,
    StoreBreaker,
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
