"""Fixtures for the checkpoint store tests: a real redis-server, and stores of every backend.

- ``redis_server``, ``redis_url``, ``own_redis``: in tests/conftest.py (shared with the
  integration tests).
- ``store_factory`` (function, parametrized memory/sqlite/redis): ``make() -> store``; two
  calls give two instances on one backend (two workers on one file, two replicas on one
  Redis); every store made is closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from compaction_proxy.checkpoints import CheckpointStore, MemoryStore, RedisStore, SqliteStore

StoreFactory = Callable[[], CheckpointStore]


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.e2e)])
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    made: list[CheckpointStore] = []
    shared_memory = MemoryStore(max_entries=1000)
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""

    def make() -> CheckpointStore:
        store: CheckpointStore
        if request.param == "memory":
            # One process, one store: "two instances" are the same object.
            store = shared_memory
        elif request.param == "sqlite":
            store = SqliteStore(tmp_path / "data" / "checkpoints.db")
        else:
            store = RedisStore(url)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()
