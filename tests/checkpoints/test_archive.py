"""The archive of what compaction removed, over real stores: memory, a SQLite file and a real
redis-server (the ``store_factory`` fixture runs each test on all three)."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from compaction_proxy.checkpoints import (
    INDEX_META,
    Archive,
    ArchivedOriginal,
    ArchivedSpan,
    Checkpoint,
    MemoryStore,
    RedisStore,
    SqliteStore,
    StoreBreaker,
    StoreMarkedDown,
    StoreUnavailable,
    archive_namespace,
    index_ids,
    merged_index,
)
from compaction_proxy.compaction.archive import Archived, RecallIds
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.settings import RecallSettings
from tests.checkpoints.conftest import StoreFactory

IDS = RecallIds(b"test-archive-namespace-key")
original_id = IDS.original
span_id = IDS.span

SETTINGS = RecallSettings(enabled=True)
NS = archive_namespace("Bearer sk-alice", None)


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def call(call_id: str, name: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


def archived(*messages: dict[str, Any], span: bool = True) -> Archived:
    originals = {original_id(m): m for m in messages}
    ids = tuple(originals)
    spans = {span_id(ids, "summary"): ids} if span else {}
    return Archived(originals, spans, (*ids, *spans))


# ------------------------------------------------------------------ namespace


def test_namespace_is_the_credential_and_the_tenant() -> None:
    alice = archive_namespace("Bearer sk-alice", None)
    assert archive_namespace("Bearer sk-bob", None) != alice
    assert archive_namespace("Bearer sk-alice", "user-2") != alice
    assert archive_namespace("Bearer sk-alice", "user-2") == archive_namespace(
        "Bearer sk-alice", "user-2"
    )
    # The key an Anthropic client sends in x-api-key, or with another casing of the scheme.
    assert archive_namespace("sk-alice", None) == alice
    assert archive_namespace("bearer  sk-alice ", None) == alice
    assert archive_namespace(None, None) == archive_namespace("", None)
    assert "sk-alice" not in alice


# ------------------------------------------------------------------ keep and fetch


async def test_keep_then_fetch_originals_and_spans(store_factory: StoreFactory) -> None:
    store = store_factory()
    archive = Archive(store, SETTINGS)
    first, second = call("c1", "read_file"), result("c1", "FACT-LIME in config.yaml")
    run = archived(first, second)
    assert await archive.keep(NS, run) is None
    ids = list(run.originals)
    (span,) = run.spans
    found = await archive.fetch(NS, [*ids, span, "rnotarchived", "not an id"])
    assert set(found) == {*ids, span}
    kept = found[ids[1]]
    assert isinstance(kept, ArchivedOriginal)
    assert kept.message == second
    assert kept.tool == "read_file"  # the call was archived with it
    assert kept.created_at == pytest.approx(time.time(), abs=60)
    folded = found[span]
    assert isinstance(folded, ArchivedSpan) and folded.members == tuple(ids)
    # Another reader (a second worker on the file, a replica on the Redis) sees the same.
    again = await Archive(store_factory(), SETTINGS).fetch(NS, [ids[1]])
    assert again[ids[1]] == kept


async def test_rows_are_checkpoints_of_the_documented_form(store_factory: StoreFactory) -> None:
    store = store_factory()
    message = result("c9", "the original")
    run = archived(message)
    await Archive(store, SETTINGS).keep(NS, run)
    rid, sid = original_id(message), next(iter(run.spans))
    hit = await store.find_longest(NS, [rid])
    assert hit is not None
    assert hit[1].messages == (message,)
    assert hit[1].meta == {"kind": "original", "bytes": len(canonical_bytes(message))}
    span = await store.find_longest(NS, [sid])
    assert span is not None and span[1].messages == ()
    assert span[1].meta == {"kind": "span", "members": [rid]}


async def test_another_tenants_namespace_sees_nothing(store_factory: StoreFactory) -> None:
    archive = Archive(store_factory(), SETTINGS)
    message = result("c1", "alice's secret")
    await archive.keep(NS, archived(message))
    for other in (
        archive_namespace("Bearer sk-bob", None),
        archive_namespace("Bearer sk-alice", "another-user"),
    ):
        assert await archive.fetch(other, [original_id(message)]) == {}


async def test_a_row_that_is_not_the_archives_is_not_found(store_factory: StoreFactory) -> None:
    store = store_factory()
    rid = original_id(result("c1", "x"))
    # A checkpoint (or a stored value) under an id-shaped key: not an archive row.
    await store.put(NS, rid, Checkpoint(({"role": "user", "content": "hi"},), 1.0, {}), 60)
    sid = "s" + rid[1:]
    await store.put(NS, sid, Checkpoint((), 1.0, {"kind": "span", "members": "nope"}), 60)
    assert await Archive(store, SETTINGS).fetch(NS, [rid, sid]) == {}


async def test_an_original_too_large_is_not_kept(store_factory: StoreFactory) -> None:
    settings = RecallSettings(enabled=True, max_archive_mb=0.001)  # 1,048 bytes
    archive = Archive(store_factory(), settings)
    small, large = result("c1", "small"), result("c2", "L" * 5000)
    warning = await archive.keep(NS, archived(small, large, span=False))
    assert warning is not None
    assert "1 original(s) larger than recall.max_archive_mb" in warning
    found = await archive.fetch(NS, [original_id(small), original_id(large)])
    assert list(found) == [original_id(small)]


async def test_writes_are_concurrent_but_bounded(tmp_path: Path) -> None:
    """A summary folding 300 messages: all written, at most ``concurrency`` at once."""

    class Counting(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.now = 0
            self.most = 0

        async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl: int) -> None:
            self.now += 1
            self.most = max(self.most, self.now)
            await asyncio.sleep(0)  # let the others start if the gate allowed them
            await super().put(namespace, key, checkpoint, ttl)
            self.now -= 1

    store = Counting()
    messages = [result(f"c{i}", f"output {i}") for i in range(300)]
    assert await Archive(store, SETTINGS, concurrency=8).keep(NS, archived(*messages)) is None
    assert len(store) == 301
    assert 1 < store.most <= 8


# ------------------------------------------------------------------ TTL


async def test_rows_expire_after_recall_ttl(store_factory: StoreFactory) -> None:
    archive = Archive(store_factory(), RecallSettings(enabled=True, ttl="1s"))
    message = result("c1", "short-lived")
    lasting = Archive(archive.store, RecallSettings(enabled=True, ttl="1h"))
    other = result("c2", "long-lived")
    await archive.keep(NS, archived(message, span=False))
    await lasting.keep(NS, archived(other, span=False))
    ids = [original_id(message), original_id(other)]
    assert set(await archive.fetch(NS, ids)) == set(ids)
    # Expiry is the backend's own clock (Redis's included): poll, with a generous bound.
    async with asyncio.timeout(15):
        while original_id(message) in await archive.fetch(NS, ids):
            await asyncio.sleep(0.05)
    assert list(await archive.fetch(NS, ids)) == [original_id(other)]


async def test_sqlite_rows_carry_the_ttl(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    store = SqliteStore(path)
    message = result("c1", "x")
    before = time.time()
    await Archive(store, RecallSettings(enabled=True, ttl="2d")).keep(NS, archived(message))
    await store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT expires_at FROM checkpoints WHERE namespace = ?", (NS,)
        ).fetchall()
    conn.close()
    assert len(rows) == 2
    for (expires_at,) in rows:
        assert before + 2 * 86400 - 5 <= expires_at <= time.time() + 2 * 86400


async def test_redis_keys_carry_the_ttl(redis_url: str) -> None:
    store = RedisStore(redis_url)
    message = result("c1", "x")
    await Archive(store, RecallSettings(enabled=True, ttl="3h")).keep(NS, archived(message))
    await store.close()
    with redis.Redis.from_url(redis_url) as client:
        ttl = client.ttl(f"cp:{NS}:{original_id(message)}")
    assert 3 * 3600 - 60 <= ttl <= 3 * 3600


# ------------------------------------------------------------------ the store down


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but never listening: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_a_store_that_is_down_costs_a_warning_on_keep_and_raises_on_fetch(
    dead_port: int,
) -> None:
    inner = RedisStore(
        f"redis://127.0.0.1:{dead_port}/0", socket_timeout=0.5, connect_timeout=0.5, op_timeout=1
    )
    store = StoreBreaker(inner)
    archive = Archive(store, SETTINGS)
    messages = [result(f"c{i}", f"t{i}") for i in range(5)]
    warning = await asyncio.wait_for(archive.keep(NS, archived(*messages)), 30)
    assert warning == "recall archive: 6 of 6 entries not stored (redis unavailable)"
    assert not store.readiness().writes.up  # the breaker marked the writes down
    # Marked down: the next keep does not wait for the dead Redis at all, and still warns.
    assert await archive.keep(NS, archived(messages[0])) is not None
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(archive.fetch(NS, [original_id(messages[0])]), 30)
    with pytest.raises(StoreMarkedDown):
        await archive.fetch(NS, [original_id(messages[0])])
    await store.close()


# ------------------------------------------------------------------ the index


def _ids(index: Sequence[Sequence[Any]]) -> list[str]:
    return [entry[0] for entry in index]


def test_the_index_is_cumulative_oldest_first() -> None:
    first = archived(result("c1", "one"), result("c2", "two"))
    index = merged_index(None, first, 10_000)
    assert _ids(index) == list(first.order)
    assert all(isinstance(size, int) and size > 0 for _, size in index)
    second = archived(result("c3", "three"))
    merged = merged_index({INDEX_META: index, "model": "m"}, second, 10_000)
    assert _ids(merged) == [*first.order, *second.order]
    assert index_ids({INDEX_META: merged}) == _ids(merged)


def test_an_id_seen_again_moves_to_the_newest_end_once() -> None:
    one, two = result("c1", "one"), result("c2", "two")
    index = merged_index(None, archived(one, two, span=False), 10_000)
    # A new summary folds the stub of `one` (an id it only refers to) and a new message.
    three = result("c3", "three")
    members = (original_id(one), original_id(three))
    run = Archived(
        {original_id(three): three}, {span_id(members): members}, (*members, span_id(members))
    )
    merged = merged_index({INDEX_META: index}, run, 10_000)
    assert _ids(merged) == [
        original_id(two),
        original_id(one),
        original_id(three),
        span_id(members),
    ]
    sizes = dict((entry[0], entry[1]) for entry in merged)
    assert sizes[original_id(one)] == dict((e[0], e[1]) for e in index)[original_id(one)]


def test_the_index_drops_its_oldest_to_stay_within_the_bytes() -> None:
    messages = [result(f"c{i}", "x" * 200) for i in range(10)]
    index: list[list[Any]] = []
    for message in messages:
        index = merged_index({INDEX_META: index}, archived(message, span=False), 1000)
    assert sum(size for _, size in index) <= 1000
    assert _ids(index) == [original_id(m) for m in messages[-len(index) :]]
    assert 0 < len(index) < 10


def test_an_original_larger_than_the_cap_is_not_indexed() -> None:
    small, large = result("c1", "s"), result("c2", "L" * 5000)
    index = merged_index(None, archived(small, large, span=False), 1000)
    assert _ids(index) == [original_id(small)]


def test_an_id_only_referred_to_and_never_indexed_is_left_out() -> None:
    run = Archived({}, {}, ("rabcdefghijk",))
    assert merged_index(None, run, 1000) == []


@pytest.mark.parametrize(
    "meta",
    [
        None,
        "not a mapping",
        {},
        {INDEX_META: "x"},
        {INDEX_META: [["not-an-id", 3], ["rabcdefghijk"], ["rabcdefghijk", True], [1, 2]]},
        {INDEX_META: [["rabcdefghijk", -1], {"id": "rabcdefghijk"}]},
    ],
)
def test_a_foreign_meta_has_no_index(meta: object) -> None:
    assert index_ids(meta) == []
    run = archived(result("c1", "one"), span=False)
    assert _ids(merged_index(meta, run, 1000)) == list(run.order)


def test_a_foreign_index_keeps_its_good_entries() -> None:
    meta = {INDEX_META: [["rabcdefghijk", 10], ["bad", 1], ["sabcdefghijk", 5]]}
    assert index_ids(meta) == ["rabcdefghijk", "sabcdefghijk"]
