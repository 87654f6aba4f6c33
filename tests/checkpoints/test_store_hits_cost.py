"""What keeps a checkpoint hit cheap: SQLite's probes never read the values (a rowid table;
files of the first schema are migrated), and a stored value is decoded once per process."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from compaction_proxy.checkpoints import Checkpoint, ForeignValue, SqliteStore
from compaction_proxy.checkpoints._decoded import DecodedCheckpoints, pick_longest
from tests.checkpoints.test_store_contract import chain

_OLD_SCHEMA = """CREATE TABLE checkpoints (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID"""


def big_checkpoint(tag: str, size: int = 20_000) -> Checkpoint:
    """A checkpoint whose stored form is over ``size`` bytes (past the memo's minimum)."""
    text = f"{tag} " + "lorem ipsum " * (size // 12)
    return Checkpoint(({"role": "user", "content": text},), 1.0, {"tag": tag})


def _table_sql(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'"
        ).fetchone()
    return str(row[0])


async def test_a_new_file_keeps_values_out_of_the_probed_index(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    store = SqliteStore(path)
    await store.ping()
    await store.close()
    assert "WITHOUT ROWID" not in _table_sql(path).upper()


async def test_a_file_of_the_first_schema_is_migrated_with_its_live_rows(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    keys = chain(4)
    now = time.time()
    with sqlite3.connect(path) as conn:
        conn.execute(_OLD_SCHEMA)
        conn.execute("CREATE INDEX checkpoints_expiry ON checkpoints (expires_at)")
        rows = [
            ("ns", keys[1], big_checkpoint("live").to_bytes(), now + 3600),
            ("ns", keys[3], big_checkpoint("expired").to_bytes(), now - 10),
        ]
        conn.executemany("INSERT INTO checkpoints VALUES (?, ?, ?, ?)", rows)
    store = SqliteStore(path)
    try:
        await store.ping()  # opens the writer connection: the migration runs
        assert "WITHOUT ROWID" not in _table_sql(path).upper()
        hit = await store.find_longest("ns", keys)
        assert hit is not None and hit[0] == 2 and hit[1].meta["tag"] == "live"
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 1
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "checkpoints_without_rowid" not in tables
        assert "checkpoints_expiry" in tables
    finally:
        await store.close()
    reopened = SqliteStore(path)  # a second opening finds it done
    try:
        await reopened.ping()
        hit = await reopened.find_longest("ns", keys)
        assert hit is not None and hit[1].meta["tag"] == "live"
    finally:
        await reopened.close()


def test_the_same_bytes_decode_once() -> None:
    memo = DecodedCheckpoints()
    data = big_checkpoint("a").to_bytes()
    first = memo.decode(data)
    again = memo.decode(bytes(bytearray(data)))  # equal bytes, another object (a new read)
    assert again is first
    assert memo.decode(big_checkpoint("b").to_bytes()) is not first
    assert len(memo) == 2


def test_small_values_and_foreign_values_are_not_kept() -> None:
    memo = DecodedCheckpoints()
    small = Checkpoint(({"role": "user", "content": "hi"},), 1.0).to_bytes()
    assert memo.decode(small) == memo.decode(small)
    assert len(memo) == 0
    foreign = b'{"v": 1, "messages": [{"role": "wizard", "content": "x"}], "created_at": 1}'
    foreign += b" " * 5000
    for _ in range(2):
        with pytest.raises(ForeignValue):
            memo.decode(foreign)
    assert len(memo) == 0


def test_the_memo_is_bounded_by_bytes_oldest_out() -> None:
    values = [big_checkpoint(str(i)).to_bytes() for i in range(5)]
    memo = DecodedCheckpoints(max_bytes=len(values[0]) * 3)
    for value in values:
        memo.decode(value)
    assert len(memo) == 3
    assert memo.size <= memo.max_bytes
    kept = memo.decode(values[4])
    assert memo.decode(values[4]) is kept  # the newest stayed
    assert memo.decode(values[0]) is not memo.decode(values[1])  # the oldest were dropped


async def test_a_deleted_checkpoint_is_never_served_from_the_memo(tmp_path: Path) -> None:
    """Prepared checkpoints are deleted when used: the memo must not bring them back."""
    store = SqliteStore(tmp_path / "cp.db")
    keys = chain(3)
    try:
        await store.put("prepared", keys[2], big_checkpoint("prepared"), 3600)
        assert await store.find_longest("prepared", keys) is not None  # decoded, remembered
        assert await store.delete("prepared", keys[2])
        assert await store.find_longest("prepared", keys) is None
        # A rewritten key serves its new value, not the remembered one.
        await store.put("prepared", keys[2], big_checkpoint("newer"), 3600)
        hit = await store.find_longest("prepared", keys)
        assert hit is not None and hit[1].meta["tag"] == "newer"
    finally:
        await store.close()


def test_pick_longest_shares_one_decoded_value_between_lookups() -> None:
    keys = chain(2)
    data = big_checkpoint("shared").to_bytes()
    first = pick_longest(keys, {keys[1]: data}).hit
    second = pick_longest(keys, {keys[1]: bytes(bytearray(data))}).hit
    assert first is not None and second is not None
    assert second[1] is first[1]
