"""Checkpoint stores: memory (bounded LRU), sqlite (the default, one file) and redis (shared
by replicas). See :mod:`.base` for the contract every one of them keeps."""

from .base import Checkpoint, CheckpointStore, StoreUnavailable, pick_longest
from .factory import make_store
from .memory import MemoryStore
from .redis import RedisStore
from .sqlite import SqliteStore

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "MemoryStore",
    "RedisStore",
    "SqliteStore",
    "StoreUnavailable",
    "make_store",
    "pick_longest",
]
