"""Builds the configured checkpoint store (``store.backend``), behind a circuit breaker."""

from __future__ import annotations

from compaction_proxy.config import ConfigError, StoreSettings
from compaction_proxy.config.preflight import INVALID_REDIS_URL, redis_url_problem

from ._breaker import StoreBreaker
from ._contract import CheckpointStore
from ._memory import MemoryStore
from ._redis import RedisStore
from ._sqlite import SqliteStore


def make_store(settings: StoreSettings) -> StoreBreaker:
    """The store for ``settings``, wrapped in a :class:`StoreBreaker` (every backend: a disk
    or a Redis can fail alike); nothing connects until first use.

    ``ConfigError`` when the backend lacks what it needs (redis without ``url``), so a
    misconfiguration stops start-up instead of silently running without checkpoints.
    """
    return StoreBreaker(make_backend(settings))


def make_archive_store(settings: StoreSettings, store: CheckpointStore) -> CheckpointStore:
    """Where the recall archive keeps its rows (compaction_proxy/checkpoints/_archive.py):
    ``store`` itself for SQLite and Redis (rows expire by TTL, no count bound couples them to
    the checkpoints), a memory store of its own for the memory backend, bounded by
    ``store.archive_max_mb``: each compaction with recall on archives tens of rows, which in
    the checkpoints' least-recently-used table (``store.max_entries``) would evict other
    conversations' checkpoints."""
    if settings.backend != "memory":
        return store
    # The entry bound only backs the byte bound (a row weighs 200 bytes at least).
    entries = max(1, settings.archive_max_bytes // 200)
    return StoreBreaker(MemoryStore(entries, max_bytes=settings.archive_max_bytes))


def make_backend(settings: StoreSettings) -> CheckpointStore:
    """The bare backend for ``settings`` (no breaker); see :func:`make_store`."""
    if settings.backend == "memory":
        return MemoryStore(settings.max_entries)
    if settings.backend == "sqlite":
        return SqliteStore(settings.path)
    problem = redis_url_problem(settings)
    if problem is not None:
        raise ConfigError(problem)
    assert settings.url is not None
    try:
        return RedisStore(settings.url)
    except ValueError as exc:
        # redis-py's message about a bad URL may quote it, password included: say only where.
        raise ConfigError(INVALID_REDIS_URL) from exc
