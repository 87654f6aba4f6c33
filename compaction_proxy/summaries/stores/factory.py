"""Builds the configured checkpoint store (``store.backend``), behind a circuit breaker."""

from __future__ import annotations

from compaction_proxy.config import ConfigError, StoreSettings

from .base import CheckpointStore
from .breaker import StoreBreaker
from .memory import MemoryStore
from .redis import RedisStore
from .sqlite import SqliteStore


def make_store(settings: StoreSettings) -> StoreBreaker:
    """The store for ``settings``, wrapped in a :class:`StoreBreaker` (every backend: a disk
    or a Redis can fail alike); nothing connects until first use.

    ``ConfigError`` when the backend lacks what it needs (redis without ``url``), so a
    misconfiguration stops start-up instead of silently running without checkpoints.
    """
    return StoreBreaker(make_backend(settings))


def make_backend(settings: StoreSettings) -> CheckpointStore:
    """The bare backend for ``settings`` (no breaker); see :func:`make_store`."""
    if settings.backend == "memory":
        return MemoryStore(settings.max_entries)
    if settings.backend == "sqlite":
        return SqliteStore(settings.path)
    if not settings.url:
        raise ConfigError(
            "store.url: required when store.backend is redis (e.g. redis://127.0.0.1:6379/0)"
        )
    try:
        return RedisStore(settings.url)
    except ValueError as exc:
        # redis-py's message about a bad URL may quote it, password included: say only where.
        raise ConfigError(
            "store.url: not a valid Redis URL (expected redis://[user:password@]host:port/db)"
        ) from exc
