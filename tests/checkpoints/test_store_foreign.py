"""Foreign values and ``delete``: part of the store contract, on memory, sqlite and redis alike.

A foreign value (not written by this code: another program's row, another format version,
truncated bytes, messages no client could send) must cost a cache miss, never the request: it
is skipped, counted, deleted, and a valid shorter prefix behind it is still found.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import orjson
import pytest
import redis

from compaction_proxy.checkpoints import (
    FORMAT_VERSION,
    Checkpoint,
    Checkpoints,
    CheckpointStore,
    ForeignValue,
    Lookup,
    MemoryStore,
    RedisStore,
    SqliteStore,
    chain,
)
from compaction_proxy.checkpoints._contract import Foreign
from compaction_proxy.checkpoints._sqlite import _delete_foreign
from tests.checkpoints.conftest import StoreFactory
from tests.checkpoints.test_store_contract import chain as keys_chain
from tests.checkpoints.test_store_contract import checkpoint

NS = "ns-foreign"

VALID = checkpoint("valid").to_bytes()


def _versioned(messages: Any, **fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "messages": messages, "created_at": 1.0, "meta": {}, **fields})


FOREIGN: dict[str, bytes | str] = {
    "not chat messages": _versioned([42, "x", None, {"role": 7}]),
    "bare list": orjson.dumps([42, "x", None, {"role": 7}]),
    "wrong version": orjson.dumps({**orjson.loads(VALID), "v": 2}),
    "no version": orjson.dumps({k: v for k, v in orjson.loads(VALID).items() if k != "v"}),
    "version as bool": orjson.dumps({**orjson.loads(VALID), "v": True}),
    "truncated JSON": VALID[:-9],
    "dict instead of list": _versioned({"role": "user", "content": "hi"}),
    "unknown role": _versioned([{"role": "wizard", "content": "abracadabra"}]),
    "tool without call id": _versioned([{"role": "tool", "content": "out"}]),
    "meta not an object": _versioned([], meta=[1, 2]),
    "not UTF-8": b"\xff\xfe\x00garbage",
    "text, not bytes": '{"v": 1, "messages": [{"role": 7}], "created_at": 1, "meta": {}}',
}


# ------------------------------------------------------------------------- raw access per backend


async def write_raw(store: CheckpointStore, namespace: str, key: str, value: bytes | str) -> None:
    """Writes a value as another program would: straight into the backend, no checkpoint."""
    if isinstance(store, MemoryStore):
        raw = value.encode() if isinstance(value, str) else value
        store._entries[(namespace, key)] = (time.monotonic() + 3600, raw)
    elif isinstance(store, SqliteStore):
        await store.ping()  # the schema exists once the store opened the file
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)",
                (namespace, key, value, time.time() + 3600),
            )
        conn.close()
    else:
        assert isinstance(store, RedisStore)
        with redis.Redis.from_url(store._url) as client:
            client.set(f"cp:{namespace}:{key}", value, ex=3600)


def read_raw(store: CheckpointStore, namespace: str, key: str) -> object:
    """The value stored under ``key``, whatever it is; None when there is none."""
    if isinstance(store, MemoryStore):
        entry = store._entries.get((namespace, key))
        return None if entry is None else entry[1]
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            row = conn.execute(
                "SELECT value FROM checkpoints WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
        conn.close()
        return None if row is None else row[0]
    assert isinstance(store, RedisStore)
    with redis.Redis.from_url(store._url) as client:
        return client.get(f"cp:{namespace}:{key}")


def foreign_count(store: CheckpointStore) -> int:
    count = getattr(store, "foreign_values", None)
    assert isinstance(count, int), "every backend counts foreign values"
    return count


# ------------------------------------------------------------------------- the serialized form


def test_the_serialized_form_carries_the_format_version() -> None:
    assert FORMAT_VERSION == 1
    assert orjson.loads(VALID)["v"] == 1
    assert Checkpoint.from_bytes(VALID) == checkpoint("valid")


@pytest.mark.parametrize("shape", sorted(FOREIGN))
def test_a_foreign_value_does_not_parse(shape: str) -> None:
    with pytest.raises(ForeignValue) as caught:
        Checkpoint.from_bytes(FOREIGN[shape])
    assert caught.value.reason


def test_meta_only_records_parse() -> None:
    """Shared summaries and learned windows store no messages, only meta."""
    window = Checkpoint(messages=(), created_at=5.0, meta={"window": 32_000, "model": "m"})
    assert Checkpoint.from_bytes(window.to_bytes()) == window


# ------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("shape", sorted(FOREIGN))
async def test_a_foreign_value_is_a_miss_counted_and_deleted(
    store_factory: StoreFactory, shape: str
) -> None:
    store = store_factory()
    keys = keys_chain(4, prefix=f"f{len(shape)}")
    await write_raw(store, NS, keys[3], FOREIGN[shape])
    before = foreign_count(store)
    assert await store.find_longest(NS, keys) is None
    assert foreign_count(store) == before + 1
    assert read_raw(store, NS, keys[3]) is None, "the foreign row is deleted"
    # Deleted, so the next lookup neither counts it again nor pays for it.
    assert await store.find_longest(NS, keys) is None
    assert foreign_count(store) == before + 1


async def test_a_valid_shorter_prefix_behind_foreign_longer_ones_is_found(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    keys = keys_chain(8, prefix="behind")
    valid = checkpoint("shorter")
    await store.put(NS, keys[2], valid, 3600)
    await write_raw(store, NS, keys[5], FOREIGN["not chat messages"])
    await write_raw(store, NS, keys[7], FOREIGN["truncated JSON"])
    before = foreign_count(store)
    hit = await store.find_longest(NS, keys)
    assert hit == (3, valid)
    assert foreign_count(store) == before + 2
    assert read_raw(store, NS, keys[5]) is None and read_raw(store, NS, keys[7]) is None
    assert read_raw(store, NS, keys[2]) is not None, "the valid checkpoint stays"


async def test_learned_window_records_round_trip(store_factory: StoreFactory) -> None:
    """compaction_proxy/upstream/_windows.py stores ``messages=()`` with the window in ``meta``: not
    foreign."""
    store = store_factory()
    record = Checkpoint(
        messages=(), created_at=1_700_000_000.0, meta={"window": 8_192, "upstream": "u"}
    )
    await store.put("context-windows-v1", "w1", record, 3600)
    before = foreign_count(store)
    assert await store.find_longest("context-windows-v1", ["w1"]) == (1, record)
    assert foreign_count(store) == before


async def test_delete(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = keys_chain(3, prefix="del")
    await store.put(NS, keys[0], checkpoint("a"), 3600)
    await store.put(NS, keys[1], checkpoint("b"), 3600)
    await store.put("other-ns", keys[1], checkpoint("c"), 3600)
    assert await store.delete(NS, keys[1]) is True
    assert await store.delete(NS, keys[1]) is False, "a missing key is no error"
    assert await store.delete(NS, "never-stored") is False
    hit = await store.find_longest(NS, keys)
    assert hit is not None and hit[0] == 1
    other = await store.find_longest("other-ns", keys)
    assert other is not None and other[1].meta["tag"] == "c", "namespaces are separate"


async def test_a_row_rewritten_since_the_lookup_read_it_survives(tmp_path: Any) -> None:
    """Only the foreign bytes that were read are deleted: a valid checkpoint written under the
    same key in the meantime (another worker) stays."""
    store = SqliteStore(tmp_path / "cp.db")
    await store.put(NS, "k", checkpoint("fresh"), 3600)
    with sqlite3.connect(store.path) as conn:
        _delete_foreign(conn, NS, [Foreign("k", b"stale foreign bytes", "not JSON")])
    conn.close()
    hit = await store.find_longest(NS, ["k"])
    assert hit is not None and hit[1].meta["tag"] == "fresh"
    await store.close()


# ------------------------------------------------------------------------- through Checkpoints


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "step 1"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "step 2"},
        {"role": "user", "content": "newest"},
    ]


async def test_lookup_falls_back_past_a_foreign_checkpoint() -> None:
    store = MemoryStore()
    checkpoints = Checkpoints(store, 3600)
    messages = _conversation()
    hashes = chain(NS, messages[1:])
    summary = Checkpoint(({"role": "user", "content": "<summary>task</summary>"},), 1.0)
    await store.put(NS, hashes[1], summary, 3600)  # stands for "task", "step 1"
    await write_raw(store, NS, hashes[3], FOREIGN["not chat messages"])
    lookup = await checkpoints.lookup(NS, messages)
    assert lookup.covered == 2 and lookup.checkpoint == summary
    assert lookup.messages == [messages[0], *summary.messages, *messages[3:]]
    assert store.foreign_values == 1


async def test_save_skips_a_checkpoint_that_would_read_back_as_foreign() -> None:
    store = MemoryStore()
    checkpoints = Checkpoints(store, 3600)
    messages = _conversation()
    lookup = Lookup(messages, 1, chain(NS, messages[1:]), 0, None)
    compacted = [messages[0], {"role": "wizard", "content": "?"}]
    assert await checkpoints.save(NS, lookup, compacted, {}) is None
    assert len(store) == 0
