"""Checkpoints: what the pipeline made of a conversation's prefix, where it is kept, and how it
is found again (compaction_proxy/checkpoints/README.md, "Checkpoints" and "The store contract").

* ``_keys``: the namespace and the hash chain a checkpoint is keyed by;
* ``_lookup``: :class:`Checkpoints`, the one round trip that finds the longest stored prefix,
  and the save once the upstream accepted a request;
* ``_contract``: :class:`Checkpoint` (its stored format) and what every store promises
  (:class:`CheckpointStore`, :class:`StoreUnavailable`);
* the stores: ``_memory`` (a bounded LRU), ``_sqlite`` (the default, one file), ``_redis``
  (shared by replicas), built by ``_factory`` behind the circuit breaker of ``_breaker``, with
  one time budget per request (``_deadline``), the leases of the memory and SQLite stores
  (``_leases``) and the process's memo of decoded values (``_decoded``);
* ``_keyvalue``: small JSON values kept in the same store (:class:`StoredValues`), for the
  learned windows and the summaries shared across replicas;
* ``_archive``: what compaction removed, kept in the same store under recall ids
  (:class:`Archive`), and the conversation's index in its checkpoint's meta; ``_archive_key``:
  the server secret those ids are keyed with, kept in the same store (:class:`ArchiveKeys`).
"""

from ._archive import (
    INDEX_META,
    Archive,
    ArchivedOriginal,
    ArchivedSpan,
    ArchiveEntry,
    archive_namespace,
    confined,
    index_ids,
    merged_index,
)
from ._archive_key import ArchiveKeys, unstored_ids
from ._breaker import Readiness, StoreBreaker, StoreMarkedDown, StoreReadiness
from ._contract import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointStore,
    ForeignValue,
    StoreUnavailable,
)
from ._deadline import (
    StoreBudget,
    StoreBudgetSpent,
    budget_left,
    detached_budget,
    store_deadline,
)
from ._decoded import pick_longest
from ._factory import make_archive_store, make_backend, make_store
from ._keys import (
    SCOPE_FIELDS,
    Message,
    chain,
    could_have_checkpoint,
    leading_system_count,
    namespace_for,
    scope_of,
)
from ._keyvalue import StoredValue, StoredValues
from ._lookup import FOLDED_TOKENS, Checkpoints, Lookup
from ._memory import MemoryStore
from ._redis import RedisStore
from ._sqlite import SqliteStore

__all__ = [
    "FOLDED_TOKENS",
    "FORMAT_VERSION",
    "INDEX_META",
    "SCOPE_FIELDS",
    "Archive",
    "ArchiveEntry",
    "ArchiveKeys",
    "ArchivedOriginal",
    "ArchivedSpan",
    "Checkpoint",
    "CheckpointStore",
    "Checkpoints",
    "ForeignValue",
    "Lookup",
    "MemoryStore",
    "Message",
    "Readiness",
    "RedisStore",
    "SqliteStore",
    "StoreBreaker",
    "StoreBudget",
    "StoreBudgetSpent",
    "StoreMarkedDown",
    "StoreReadiness",
    "StoreUnavailable",
    "StoredValue",
    "StoredValues",
    "archive_namespace",
    "budget_left",
    "chain",
    "confined",
    "could_have_checkpoint",
    "detached_budget",
    "index_ids",
    "leading_system_count",
    "make_archive_store",
    "make_backend",
    "make_store",
    "merged_index",
    "namespace_for",
    "pick_longest",
    "scope_of",
    "store_deadline",
    "unstored_ids",
]
