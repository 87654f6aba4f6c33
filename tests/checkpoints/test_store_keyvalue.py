"""Small JSON values kept in the checkpoint store (compaction_proxy/checkpoints/_keyvalue.py),
on memory, sqlite and redis alike: what learned windows and shared summaries rely on."""

from __future__ import annotations

from compaction_proxy.checkpoints import Checkpoint, StoredValue, StoredValues
from tests.checkpoints.conftest import StoreFactory

NS = "values-ns"


async def test_a_value_round_trips_with_when_it_was_written(store_factory: StoreFactory) -> None:
    values = StoredValues(store_factory())
    assert await values.get(NS, "k") is None
    await values.put(NS, "k", {"window": 8_192, "model": "m"}, 3600, written_at=1_234.5)
    assert await values.get(NS, "k") == StoredValue({"window": 8_192, "model": "m"}, 1_234.5)
    assert values.name in ("memory", "sqlite", "redis")


async def test_replicas_on_one_backend_read_each_others_values(
    store_factory: StoreFactory,
) -> None:
    await StoredValues(store_factory()).put(NS, "k", {"summary": "text"}, 3600)
    found = await StoredValues(store_factory()).get(NS, "k")
    assert found is not None and found.value == {"summary": "text"}


async def test_a_put_replaces_and_namespaces_are_apart(store_factory: StoreFactory) -> None:
    values = StoredValues(store_factory())
    await values.put(NS, "k", {"n": 1}, 3600)
    await values.put(NS, "k", {"n": 2}, 3600)
    await values.put("other", "k", {"n": 3}, 3600)
    first, other = await values.get(NS, "k"), await values.get("other", "k")
    assert first is not None and first.value == {"n": 2}
    assert other is not None and other.value == {"n": 3}


async def test_rows_written_as_meta_only_checkpoints_read_back(store_factory: StoreFactory) -> None:
    """The stored form did not change: a row an older version wrote (a checkpoint with no
    messages, the value in its meta) is read as a value, and a value reads as that row."""
    store = store_factory()
    old = Checkpoint(messages=(), created_at=1_700_000_000.0, meta={"window": 4_096})
    await store.put(NS, "old", old, 3600)
    assert await StoredValues(store).get(NS, "old") == StoredValue({"window": 4_096}, 1.7e9)
    await StoredValues(store).put(NS, "new", {"summary": "s"}, 3600, written_at=5.0)
    assert await store.find_longest(NS, ["new"]) == (
        1,
        Checkpoint(messages=(), created_at=5.0, meta={"summary": "s"}),
    )


async def test_the_lease_is_the_stores(store_factory: StoreFactory) -> None:
    values = StoredValues(store_factory())
    async with values.lock("lease", 30.0, 0.0) as held:
        assert held
        async with StoredValues(store_factory()).lock("lease", 30.0, 0.0) as second:
            assert not second
