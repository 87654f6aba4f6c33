"""SQLite specifics: the file, restarts, several processes, expiry purge, bad rows, failures."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.checkpoints import Checkpoint, SqliteStore, StoreUnavailable
from tests.checkpoints.test_store_contract import chain, checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]


class ThreadTrips:
    """In place of a store's ``_run``: counts the trips to its thread, then makes them."""

    def __init__(self, store: SqliteStore) -> None:
        self.run = store._run
        self.count = 0

    async def __call__(self, work: Any) -> Any:
        self.count += 1
        return await self.run(work)


async def test_creates_parent_directory_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "cp.db"
    store = SqliteStore(path)
    await store.ping()
    await store.close()
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    keys = chain(5)
    first = SqliteStore(path)
    await first.put("ns", keys[3], checkpoint("persisted"), 3600)
    await first.close()
    reopened = SqliteStore(path)
    try:
        hit = await reopened.find_longest("ns", keys)
        assert hit is not None and hit[0] == 4 and hit[1].meta["tag"] == "persisted"
    finally:
        await reopened.close()


async def test_find_longest_is_one_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "cp.db")
    keys = chain(1200)
    for i in (5, 700, 1100):
        await store.put("ns", keys[i - 1], checkpoint(str(i)), 3600)
    original = store._run
    trips = ThreadTrips(store)
    monkeypatch.setattr(store, "_run", trips)
    hit = await store.find_longest("ns", keys)
    assert hit is not None and hit[0] == 1100
    assert trips.count == 0  # the namespace holds 3 keys: they are probed on the loop
    # A namespace holding more keys than the lookup asks for: the 1200 keys are probed on
    # the store's thread, in one trip.
    await original(
        lambda conn: conn.executemany(
            "INSERT INTO checkpoints (namespace, key, value, expires_at) VALUES (?, ?, ?, ?)",
            [("ns", f"z{i}", b"x", 4e9) for i in range(1300)],
        )
    )
    hit = await store.find_longest("ns", keys)
    assert hit is not None and hit[0] == 1100
    assert trips.count == 1
    await store.close()


async def test_expired_rows_are_ignored_then_purged(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    store = SqliteStore(path)
    keys = chain(2)
    await store.put("ns", keys[0], checkpoint("short"), 1)
    with sqlite3.connect(path) as conn:  # age it without sleeping
        conn.execute("UPDATE checkpoints SET expires_at = expires_at - 10")
    assert await store.find_longest("ns", keys) is None
    assert await store.purge_expired() == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0
    await store.close()


async def test_a_corrupt_row_is_a_miss_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    store = SqliteStore(path)
    keys = chain(3)
    await store.put("ns", keys[0], checkpoint("good"), 3600)
    await store.put("ns", keys[2], checkpoint("to-break"), 3600)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE checkpoints SET value = x'00ff' WHERE key = ?", (keys[2],))
    hit = await store.find_longest("ns", keys)
    assert hit is not None and hit[0] == 1
    await store.close()


async def test_unusable_path_raises_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = SqliteStore(blocker / "cp.db")
    with pytest.raises(StoreUnavailable):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.find_longest("ns", chain(2))
    with pytest.raises(StoreUnavailable):
        await store.put("ns", "k", checkpoint("x"), 60)
    with pytest.raises(StoreUnavailable):
        async with store.lock("x", 1, 0):
            pass
    await store.close()


async def test_closed_store_raises_store_unavailable(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "cp.db")
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.find_longest("ns", chain(1))


_WRITER = textwrap.dedent("""
    import asyncio, sys
    from compaction_proxy.checkpoints import Checkpoint, SqliteStore

    async def main(path: str, worker: str) -> None:
        store = SqliteStore(path)
        for i in range(60):
            await store.put("ns", f"{worker}-{i}", Checkpoint(({"role": "user",
                            "content": worker},), 0.0, {"i": i}), 3600)
            await store.find_longest("ns", [f"{worker}-{j}" for j in range(i + 1)])
        async with store.lock("shared", 5, 10) as got:
            assert got
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.mark.e2e
async def test_several_processes_write_one_file(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    SqliteStore(path)  # nothing opened until used: the workers create the file together
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), f"w{n}"],
            cwd=REPO_ROOT,
            stderr=subprocess.PIPE,
        )
        for n in range(4)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err.decode()
    store = SqliteStore(path)
    for n in range(4):
        hit = await store.find_longest("ns", [f"w{n}-{i}" for i in range(60)])
        assert hit is not None and hit[0] == 60
        assert isinstance(hit[1], Checkpoint)
    await store.close()


class _LockedWhileAnotherOpens(sqlite3.Connection):
    """A connection that meets what a second worker meets while the first one is switching a
    new file to WAL: ``database is locked`` at once, whatever the busy timeout."""

    refusals = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if sql.startswith("PRAGMA journal_mode") and type(self).refusals > 0:
            type(self).refusals -= 1
            raise sqlite3.OperationalError("database is locked")
        return super().execute(sql, *args)


def _locked_connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    return sqlite3.connect(
        path,
        timeout=busy_timeout_ms / 1000,
        isolation_level=None,
        check_same_thread=False,
        factory=_LockedWhileAnotherOpens,
    )


async def test_an_open_that_meets_another_process_creating_the_file_waits_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened while another process holds the new file answers once it is free,
    rather than failing its first request (as four workers starting together once did)."""
    from compaction_proxy.checkpoints import _sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_connect", _locked_connect)
    _LockedWhileAnotherOpens.refusals = 3
    store = SqliteStore(tmp_path / "cp.db")
    await store.put(
        "ns", "k", Checkpoint(messages=({"role": "user", "content": "x"},), created_at=0.0), 60
    )
    assert _LockedWhileAnotherOpens.refusals == 0
    hit = await store.find_longest("ns", ["k"])
    assert hit is not None and hit[0] == 1
    await store.close()


async def test_an_open_that_stays_locked_past_the_busy_timeout_fails_as_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compaction_proxy.checkpoints import _sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_connect", _locked_connect)
    _LockedWhileAnotherOpens.refusals = 10**9
    store = SqliteStore(tmp_path / "cp.db", busy_timeout_ms=50)
    with pytest.raises(StoreUnavailable, match="locked"):
        await store.put(
            "ns", "k", Checkpoint(messages=({"role": "user", "content": "x"},), created_at=0.0), 60
        )
    _LockedWhileAnotherOpens.refusals = 0
    await store.close()


async def test_short_lookups_read_inline_and_long_ones_on_the_thread(tmp_path: Path) -> None:
    """The result is the same either way; only where the query runs differs."""
    from compaction_proxy.checkpoints import _sqlite as sqlite_module

    store = SqliteStore(tmp_path / "cp.db")
    record = Checkpoint(messages=({"role": "user", "content": "x"},), created_at=0.0)
    await store.put("ns", "k3", record, 60)
    short = await store.find_longest("ns", ["k1", "k2", "k3"])
    assert short is not None and short[0] == 3
    assert store._reader is not None  # the loop's read-only connection answered
    long_keys = [f"x{i}" for i in range(sqlite_module.INLINE_KEYS + 5)] + ["k3"]
    found = await store.find_longest("ns", long_keys)
    assert found is not None and found[0] == len(long_keys)
    await store.close()
    assert store._reader is None


async def test_a_long_conversation_in_a_namespace_of_few_checkpoints_is_answered_inline(
    tmp_path: Path,
) -> None:
    """Past INLINE_KEYS keys, the namespace's own few keys are what is probed: the answer
    comes from the loop's connection, and an expired key there is not a hit."""
    from compaction_proxy.checkpoints import _sqlite as sqlite_module

    store = SqliteStore(tmp_path / "cp.db")
    keys = chain(sqlite_module.INLINE_KEYS * 3)
    await store.put("ns", keys[40], checkpoint("early"), 60)
    await store.put("ns", keys[-10], checkpoint("late"), 60)
    await store.put("other", keys[-1], checkpoint("elsewhere"), 60)
    original = store._run
    threaded = store._run = ThreadTrips(store)  # type: ignore[method-assign]
    found = await store.find_longest("ns", keys)
    assert found is not None and found[0] == len(keys) - 9 and found[1].meta["tag"] == "late"
    assert threaded.count == 0 and store._reader is not None
    await original(
        lambda conn: conn.execute(
            "UPDATE checkpoints SET expires_at = 0 WHERE key = ?", (keys[-10],)
        )
    )
    found = await store.find_longest("ns", keys)
    assert found is not None and found[0] == 41 and found[1].meta["tag"] == "early"
    assert threaded.count == 0
    await store.close()


HELD_KEYS = chain(12)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    held=st.dictionaries(
        st.sampled_from(HELD_KEYS), st.sampled_from(["live", "expired", "elsewhere"]), max_size=12
    ),
    wanted=st.lists(st.sampled_from(HELD_KEYS), min_size=1, max_size=12),
    inline_keys=st.sampled_from([1, 3, 500]),
)
def test_the_inline_answer_is_the_thread_answer(
    tmp_path_factory: pytest.TempPathFactory,
    held: dict[str, str],
    wanted: list[str],
    inline_keys: int,
) -> None:
    """Whichever way the loop's connection answers (the namespace's keys, the wanted keys,
    or not at all past INLINE_KEYS), it finds what the store's thread finds."""
    from compaction_proxy.checkpoints import _sqlite as sqlite_module

    path = tmp_path_factory.mktemp("inline") / "cp.db"

    async def both() -> tuple[Any, Any]:
        store = SqliteStore(path)
        for key, state in held.items():
            namespace = "elsewhere" if state == "elsewhere" else "ns"
            await store.put(namespace, key, checkpoint(key), 60)
        expired = [k for k, state in held.items() if state == "expired"]
        await store._run(
            lambda conn: conn.executemany(
                "UPDATE checkpoints SET expires_at = 0 WHERE key = ?", [(k,) for k in expired]
            )
        )
        inline = await store.find_longest("ns", wanted)
        store._inline_lookup = lambda namespace, keys: None  # type: ignore[method-assign]
        threaded = await store.find_longest("ns", wanted)
        await store.close()
        return inline, threaded

    saved = sqlite_module.INLINE_KEYS
    sqlite_module.INLINE_KEYS = inline_keys
    try:
        inline, threaded = asyncio.run(both())
    finally:
        sqlite_module.INLINE_KEYS = saved
    live = [i for i, key in enumerate(wanted) if held.get(key) == "live"]
    expected = (live[-1] + 1, wanted[live[-1]]) if live else None
    assert (None if inline is None else (inline[0], inline[1].meta["tag"])) == expected
    assert (None if threaded is None else (threaded[0], threaded[1].meta["tag"])) == expected
