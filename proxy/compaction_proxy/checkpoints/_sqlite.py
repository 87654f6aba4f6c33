"""The default checkpoint store: one SQLite file, shared by the worker processes of one host.

* WAL mode and ``busy_timeout``: readers never block the writer, and several processes (uvicorn
  workers), each with its own connection, can write the same file. Every write is a single
  statement, so there is no multi-statement transaction to deadlock.
* TTL by an ``expires_at`` column (wall-clock seconds, so it survives restarts): rows past it
  are ignored on read and purged at most every ``purge_interval`` seconds by a writer.
* sqlite3 blocks, so every call runs on one dedicated thread that owns the connection; the
  event loop only awaits it. The exception: a lookup of a few keys (a short conversation)
  runs on a read-only connection of the loop's own, which waits for a lock at most 5 ms and
  hands anything unusual to the thread.
* Single-flight across processes with an advisory row in a ``locks`` table: taking it is one
  upsert that succeeds only when the row is absent or expired; release deletes it only when
  the owner token matches.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

from ._contract import Checkpoint, Foreign, StoreUnavailable, log_foreign, ttl_at_least_one
from ._deadline import bounded
from ._decoded import Picked, pick_longest
from ._leases import polled_lock

T = TypeVar("T")

log = logging.getLogger("compaction_proxy.stores")

SQL_VARIABLES_PER_QUERY = 500
"""Keys per ``IN (...)`` list: under SQLite's oldest variable limit (999) with room to spare."""
INLINE_KEYS = SQL_VARIABLES_PER_QUERY
"""Probes of at most this many keys (one statement's) run on the event loop (see
``_inline_lookup``). Measured on a shared 2-core VM, probing inline / on the store's thread:
150 keys 0.15 / 0.5 ms, 500 keys 0.55 / 1.0 ms, 1500 keys 1.8 / 2.2 ms; past this bound the
loop would wait longer."""
INLINE_BUSY_SECONDS = 0.005
LOCK_POLL_SECONDS = 0.02
LOCK_POLL_MAX_SECONDS = 0.2

# A rowid table, so the primary key is an index of its own and a lookup's probes never touch
# the values. In a WITHOUT ROWID table (the first schema) the values lived in the probed
# b-tree, and comparing a probe with a value's row read its whole overflow chain: a 500-key
# lookup beside one 1 MB checkpoint took 10 ms (see :func:`_migrate`).
_CHECKPOINTS = """CREATE TABLE IF NOT EXISTS checkpoints (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (namespace, key)
    )"""
_SCHEMA = (
    _CHECKPOINTS,
    "CREATE INDEX IF NOT EXISTS checkpoints_expiry ON checkpoints (expires_at)",
    """CREATE TABLE IF NOT EXISTS locks (
        name TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID""",
)


class SqliteStore:
    """Checkpoints in one SQLite file (created with its parent directory on first use)."""

    name = "sqlite"

    def __init__(
        self, path: str | Path, *, busy_timeout_ms: int = 5000, purge_interval: float = 300.0
    ) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._purge_interval = purge_interval
        self._last_purge = 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._closed = False
        self.foreign_values = 0
        """Foreign values met by lookups (and deleted); see :mod:`._contract`."""

    # -------------------------------------------------------------- plumbing

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreUnavailable("the sqlite store is closed")

        def job() -> T:
            return work(self._connection())

        try:
            # Bounded by the request's store budget, if any (the statement itself may still
            # finish on the store's thread; the request does not wait for it).
            async with bounded(None):
                return await asyncio.get_running_loop().run_in_executor(self._executor, job)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc
        except TimeoutError as exc:
            raise StoreUnavailable("sqlite store: the request's store time budget ran out") from exc

    def _connection(self) -> sqlite3.Connection:
        """The connection, opened on the store's thread at first use."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = _open_shared(self.path, self._busy_timeout_ms)
        return self._conn

    # -------------------------------------------------------------- the protocol

    def _inline_lookup(self, namespace: str, wanted: list[str]) -> dict[str, object] | None:
        """A lookup on the event loop's own read-only connection, or None to use the store's
        thread.

        The thread hop costs more than the query for most conversations. First the keys the
        namespace holds are read from the primary key's index alone (no row touched), up to
        one more than ``wanted``: a namespace with fewer checkpoints than the conversation
        has messages (the usual case, a few per conversation) is answered by probing only
        the keys it holds, however long the conversation. Otherwise ``wanted`` is probed
        here when it has at most :data:`INLINE_KEYS` keys. The connection waits at most a
        few milliseconds for a lock; anything unusual (no table yet, busy) goes to the
        thread.
        """
        if self._closed or (self._reader is None and not self.path.exists()):
            return None  # an open reader needs no stat per request: a missing table raises
        try:
            reader = self._inline_reader()
            held = reader.execute(
                "SELECT key FROM checkpoints WHERE namespace = ? LIMIT ?",
                (namespace, len(wanted) + 1),
            ).fetchall()
            if len(held) <= len(wanted):
                asked = set(wanted)
                probe = [key for (key,) in held if key in asked]
                if not probe:
                    return {}
            else:
                probe = wanted
            if len(probe) > INLINE_KEYS:
                return None
            marks = ",".join("?" * len(probe))
            rows = reader.execute(
                "SELECT key, value FROM checkpoints WHERE namespace = ? "
                f"AND expires_at > ? AND key IN ({marks})",
                (namespace, time.time(), *probe),
            )
            return dict(rows.fetchall())
        except sqlite3.Error:
            return None

    def _inline_reader(self) -> sqlite3.Connection:
        if self._reader is None:
            reader = sqlite3.connect(
                f"file:{self.path}?mode=ro",
                uri=True,
                timeout=INLINE_BUSY_SECONDS,
                isolation_level=None,
                check_same_thread=False,
            )
            reader.execute(f"PRAGMA busy_timeout = {int(INLINE_BUSY_SECONDS * 1000)}")
            self._reader = reader
        return self._reader

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        if not keys:
            return None
        wanted = list(dict.fromkeys(keys))
        inline = self._inline_lookup(namespace, wanted)
        if inline is not None:
            return await self._hit(namespace, pick_longest(keys, inline))

        def lookup(conn: sqlite3.Connection) -> dict[str, object]:
            now = time.time()
            found: dict[str, object] = {}
            # One read transaction: every chunk sees the same snapshot.
            conn.execute("BEGIN")
            try:
                for start in range(0, len(wanted), SQL_VARIABLES_PER_QUERY):
                    chunk = wanted[start : start + SQL_VARIABLES_PER_QUERY]
                    marks = ",".join("?" * len(chunk))
                    rows = conn.execute(
                        "SELECT key, value FROM checkpoints WHERE namespace = ? "
                        f"AND expires_at > ? AND key IN ({marks})",
                        (namespace, now, *chunk),
                    )
                    found.update((key, value) for key, value in rows)
            finally:
                conn.execute("COMMIT")
            return found

        return await self._hit(namespace, pick_longest(keys, await self._run(lookup)))

    async def _hit(self, namespace: str, picked: Picked) -> tuple[int, Checkpoint] | None:
        """The lookup's answer, once the foreign values it passed over are deleted."""
        if picked.foreign:
            self.foreign_values += len(picked.foreign)
            log_foreign(self.name, namespace, picked.foreign)
            try:
                await self._run(lambda conn: _delete_foreign(conn, namespace, picked.foreign))
            except StoreUnavailable as exc:  # the next lookup tries again
                log.warning("foreign values not deleted: %s", exc)
        return picked.hit

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        data = checkpoint.to_bytes()
        expires = time.time() + ttl_at_least_one(ttl_seconds)

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (namespace, key, value, expires_at) "
                "VALUES (?, ?, ?, ?)",
                (namespace, key, data, expires),
            )
            now = time.monotonic()
            if now - self._last_purge >= self._purge_interval:
                self._last_purge = now
                conn.execute("DELETE FROM checkpoints WHERE expires_at <= ?", (time.time(),))

        await self._run(write)

    async def delete(self, namespace: str, key: str) -> bool:
        def remove(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM checkpoints WHERE namespace = ? AND key = ?", (namespace, key)
            )
            return cursor.rowcount > 0

        return await self._run(remove)

    async def purge_expired(self) -> int:
        """Deletes expired rows now; returns how many."""

        def purge(conn: sqlite3.Connection) -> int:
            cursor = conn.execute("DELETE FROM checkpoints WHERE expires_at <= ?", (time.time(),))
            conn.execute("DELETE FROM locks WHERE expires_at <= ?", (time.time(),))
            return cursor.rowcount

        return await self._run(purge)

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        token = uuid.uuid4().hex

        def acquire(conn: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = conn.execute(
                "INSERT INTO locks (name, token, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET token = excluded.token, "
                "expires_at = excluded.expires_at WHERE locks.expires_at <= ?",
                (name, token, now + ttl_seconds, now),
            )
            return cursor.rowcount == 1

        def release(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM locks WHERE name = ? AND token = ?", (name, token))

        return polled_lock(
            lambda: self._run(acquire),
            lambda: self._run(release),
            wait_seconds,
            poll_seconds=LOCK_POLL_SECONDS,
            poll_max_seconds=LOCK_POLL_MAX_SECONDS,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
            self._reader = None

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        finally:
            self._executor.shutdown(wait=False)


def _delete_foreign(conn: sqlite3.Connection, namespace: str, foreign: Sequence[Foreign]) -> None:
    """Deletes each foreign row only while it still holds the value that was read: a valid
    checkpoint written under the same key meanwhile survives."""
    conn.executemany(
        "DELETE FROM checkpoints WHERE namespace = ? AND key = ? AND value = ?",
        [(namespace, item.key, item.value) for item in foreign],
    )


def _without_rowid(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'"
    ).fetchone()
    return row is not None and "WITHOUT ROWID" in str(row[0]).upper()


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    return sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )


def _open_shared(
    path: Path, busy_timeout_ms: int, *, clock: Callable[[], float] = time.monotonic
) -> sqlite3.Connection:
    """Open the file in WAL mode with its schema, retrying while another process holds it.

    ``busy_timeout`` does not cover everything: while another process is creating the file or
    switching it to WAL, SQLite answers ``database is locked`` at once rather than calling the
    busy handler (it cannot wait without risking a deadlock). Several uvicorn workers starting
    together meet exactly that, so the whole open is retried, with a short backoff, for as long
    as the busy timeout allows. The switch to WAL is made only when the file is not in WAL
    already (the mode is persistent), so only its first opener needs the exclusive lock."""
    deadline = clock() + busy_timeout_ms / 1000
    pause = 0.005
    while True:
        conn = _connect(path, busy_timeout_ms)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _migrate(conn)
            for statement in _SCHEMA:
                conn.execute(statement)
        except sqlite3.OperationalError as exc:
            conn.close()
            if not _contended(exc) or clock() >= deadline:
                raise
            time.sleep(pause)  # on the store's own thread, never the event loop
            pause = min(pause * 2, 0.1)
            continue
        except sqlite3.Error:
            conn.close()
            raise
        return conn


def _contended(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _migrate(conn: sqlite3.Connection) -> None:
    """Move a file made by the first schema (WITHOUT ROWID) to the rowid table, keeping its
    live rows, in one write transaction (another process opening the file at the same time
    waits, then finds it done). A process of the older version still running on the file
    keeps working: the table has the same name and columns."""
    if not _without_rowid(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _without_rowid(conn):
            conn.execute("ALTER TABLE checkpoints RENAME TO checkpoints_without_rowid")
            conn.execute(_CHECKPOINTS)
            conn.execute(
                "INSERT INTO checkpoints SELECT namespace, key, value, expires_at "
                "FROM checkpoints_without_rowid WHERE expires_at > ?",
                (time.time(),),
            )
            conn.execute("DROP TABLE checkpoints_without_rowid")  # its expiry index with it
        conn.execute("COMMIT")
    except sqlite3.Error:
        conn.execute("ROLLBACK")
        raise
