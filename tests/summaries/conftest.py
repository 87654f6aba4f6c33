"""Fixtures for the summaries tests: a real redis-server, and stores of every backend.

- ``redis_server`` (session): one :class:`RedisServer` for the session.
- ``redis_url`` (function): that server's URL, flushed before the test.
- ``own_redis`` (function): a server of the test's own, for tests that stop it.
- ``store_factory`` (function, parametrized memory/sqlite/redis): ``make() -> store``; two
  calls give two instances on one backend (two workers on one file, two replicas on one
  Redis); every store made is closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from proxy.summaries.stores import CheckpointStore, MemoryStore, RedisStore, SqliteStore
from tests.summaries.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "own-redis").start()
    yield server
    server.stop()


StoreFactory = Callable[[], CheckpointStore]


@pytest.fixture(params=["memory", "sqlite", "redis"])
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
