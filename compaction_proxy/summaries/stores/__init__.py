"""Checkpoint stores: memory (bounded LRU), sqlite (the default, one file) and redis (shared
by replicas), each behind a circuit breaker (:mod:`.breaker`), with one store time budget per
request (:mod:`.deadline`). See :mod:`.base` for the contract every one of them keeps."""

from .base import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointStore,
    ForeignValue,
    StoreUnavailable,
)
from .breaker import Readiness, StoreBreaker, StoreMarkedDown, StoreReadiness
from .deadline import StoreBudget, StoreBudgetSpent, budget_left, store_deadline
from .decoded import pick_longest
from .factory import make_backend, make_store
from .memory import MemoryStore
from .redis import RedisStore
from .sqlite import SqliteStore

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointStore",
    "ForeignValue",
    "MemoryStore",
    "Readiness",
    "RedisStore",
    "SqliteStore",
    "StoreBreaker",
    "StoreBudget",
    "StoreBudgetSpent",
    "StoreMarkedDown",
    "StoreReadiness",
    "StoreUnavailable",
    "budget_left",
    "make_backend",
    "make_store",
    "pick_longest",
    "store_deadline",
]
