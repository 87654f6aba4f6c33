"""Where archived originals live: rows in the checkpoint store, under the end user's archive
namespace, keyed by their recall id (docs/recall.md, "Where the originals live").

With ``compaction.recall`` on, every message a compaction removed or rewrote is kept so the
model (the ``compaction_recall`` tool) and a person (``GET /v1/compaction/archive/{id}``) can
read it back. The archive is the checkpoint store itself (with the memory backend, a memory
store of its own: compaction_proxy/checkpoints/_factory.py), so it has its backends, its
breaker, its time budget and its replicas' sharing for free:

* an original: ``Checkpoint(messages=(original,), meta={"kind": "original", "bytes": n})``
  (and ``"tool"``, the name of the call it answers, when this run archived the call too);
* a span (what a summary or a collapsed group stands for): ``Checkpoint(messages=(),
  meta={"kind": "span", "members": [ids]})``;
* the namespace is the end user's (:func:`archive_namespace`: the caller's credential, the
  ``X-Compaction-Tenant`` header and every per-user field that separates checkpoints,
  ``SCOPE_FIELDS``), not a conversation's: two conversations of one end user that archive the
  same message share its row. The ids are keyed per namespace (:class:`ArchiveKeys`,
  compaction_proxy/checkpoints/_archive_key.py), so an id tells nothing of its content and
  names nothing in another namespace. What keeps one conversation from reading another's is
  the *index* in its checkpoint's meta (:data:`INDEX_META`, :func:`merged_index`): the recall
  tool answers only the ids there and their spans' members
  (``compaction_proxy/engine/_recall_desk.py``), and a span lists only ids the conversation
  held (:func:`confined`), never one because some text named it.

Rows live ``recall.ttl``. Writing is best-effort like every store write (a warning, never a
failed request); reading raises :class:`StoreUnavailable` so the caller can say "archive not
available" rather than "not found".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from compaction_proxy.compaction.archive import ID_PATTERN, Archived, RecallIds
from compaction_proxy.compaction.canonical import canonical_bytes, digest
from compaction_proxy.compaction.message_text import call_names
from compaction_proxy.compaction.settings import RecallSettings

from ._archive_key import ArchiveKeys, Health
from ._breaker import StoreMarkedDown
from ._contract import Checkpoint, CheckpointStore, StoreUnavailable, check_messages
from ._keys import SCOPE_FIELDS

log = logging.getLogger("compaction_proxy.archive")

T = TypeVar("T")

INDEX_META = "archive"
"""The checkpoint meta key of a conversation's index: ``[[id, bytes], ...]``, oldest first."""
KIND_ORIGINAL = "original"
KIND_SPAN = "span"
CONCURRENCY = 8
"""Store calls of one keep or fetch in flight at once: a summary that folds 300 messages
writes 300 rows, which must not open 300 connections (Redis) or queue 300 threads (SQLite)."""
NAMESPACE_VERSION = "archive2"
"""archive2: the per-user fields joined the namespace and ids are keyed. What an
older version archived (``archive1``) is in no namespace this one reads: an id an older
checkpoint names reads "no archived content", never another end user's row."""
_BEARER = "bearer "


def archive_namespace(
    credential: str | None, tenant: str | None, owner: Mapping[str, Any] | None = None
) -> str:
    """The archive namespace of an end user: a digest of the caller's credential (hashed, as
    the checkpoints' namespace hashes it), its ``X-Compaction-Tenant`` and the per-user fields
    of ``owner`` (:data:`SCOPE_FIELDS` of a chat-shaped body: ``user``, which a Messages
    request's ``metadata.user_id`` becomes, and ``safety_identifier``; the archive route's
    query parameters of those names). Every field that separates checkpoints separates
    archives, so an app serving many end users under one key never hands one another's
    originals.

    The credential is the key a request presented (``Authorization`` or ``x-api-key``); its
    ``Bearer`` scheme is left out, so the key an Anthropic client sends in ``x-api-key`` and
    a person's ``Authorization: Bearer`` with the same key name the same archive. A per-user
    field that is absent, null or empty names no end user.
    """
    key = (credential or "").strip()
    if key[: len(_BEARER)].lower() == _BEARER:
        key = key[len(_BEARER) :].strip()
    hashed = digest((key or "anonymous").encode()).hex()
    fields = owner or {}
    users = {name: fields.get(name) for name in SCOPE_FIELDS}
    named = {name: value for name, value in users.items() if value is not None and value != ""}
    parts = [NAMESPACE_VERSION, hashed, tenant or "", canonical_bytes(named).decode()]
    return digest("\x1f".join(parts).encode()).hex()


# ------------------------------------------------------------------ the conversation's index


def entry_bytes(value: Mapping[str, Any] | Sequence[str]) -> int:
    """What an archived original (its canonical bytes) or a span (its members) weighs in the
    index, against ``recall.max_archive_mb``."""
    return len(canonical_bytes(value if isinstance(value, Mapping) else list(value)))


def _index_entries(meta: object) -> list[tuple[str, int]]:
    """The entries of ``meta``'s index that are well formed; a foreign or older meta (no
    index, a list of something else) has none."""
    if not isinstance(meta, Mapping):
        return []
    index = meta.get(INDEX_META)
    if not isinstance(index, list):
        return []
    entries: list[tuple[str, int]] = []
    for item in index:
        if not isinstance(item, list | tuple) or len(item) != 2:
            continue
        recall_id, size = item
        if not isinstance(recall_id, str) or ID_PATTERN.fullmatch(recall_id) is None:
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            continue
        entries.append((recall_id, size))
    return entries


def index_ids(meta: object) -> list[str]:
    """The ids a checkpoint's meta indexes, oldest first (none for a foreign meta)."""
    return [recall_id for recall_id, _ in _index_entries(meta)]


def merged_index(previous_meta: object, archived: Archived, max_bytes: int) -> list[list[Any]]:
    """The index of the checkpoint a run makes: the one it started from (``previous_meta``,
    the checkpoint's meta or None) with this run's ids appended, oldest first, each once (an
    id archived or referred to again moves to the newest end), then cut from the oldest end
    until the bytes sum to at most ``max_bytes``. An original larger than ``max_bytes`` alone
    is not kept (:meth:`Archive.keep`) and not indexed; an id this run only refers to (a stub
    dropped again) keeps the size it was indexed with, and is left out when it was not."""
    entries = dict(_index_entries(previous_meta))
    ordered = list(dict.fromkeys([*archived.order, *archived.originals, *archived.spans]))
    for recall_id in ordered:
        size: int | None
        if recall_id in archived.originals:
            size = entry_bytes(archived.originals[recall_id])
            if size > max_bytes:
                continue
        elif recall_id in archived.spans:
            size = entry_bytes(archived.spans[recall_id])
        else:
            size = entries.get(recall_id)
        if size is None:
            continue
        entries.pop(recall_id, None)
        entries[recall_id] = size
    total = sum(entries.values())
    kept = list(entries.items())
    start = 0
    while start < len(kept) and total > max_bytes:
        total -= kept[start][1]
        start += 1
    return [[recall_id, size] for recall_id, size in kept[start:]]


def confined(archived: Archived, previous_meta: object) -> Archived:
    """``archived`` with each span's members cut to the ids the conversation holds: the index
    it started from (``previous_meta``, its checkpoint's meta or None) and what this run
    archived. A member named only by some text (a client's message or a tool result ending
    with a mark, which the core takes for an older summary or a stub) is dropped, so no span
    reaches an id the conversation never held, whoever archived it."""
    if not archived.spans:
        return archived
    held = set(index_ids(previous_meta))
    held.update(archived.originals)
    held.update(archived.spans)
    spans = {
        span: tuple(member for member in members if member in held)
        for span, members in archived.spans.items()
    }
    if all(spans[span] == members for span, members in archived.spans.items()):
        return archived
    return Archived(archived.originals, spans, archived.order)


# ------------------------------------------------------------------ what a fetch returns


@dataclass(frozen=True, slots=True)
class ArchivedOriginal:
    """An original read back: the message, when it was written, and the name of the call it
    answers when that was known when it was archived."""

    message: dict[str, Any]
    created_at: float
    tool: str | None = None

    kind = KIND_ORIGINAL


@dataclass(frozen=True, slots=True)
class ArchivedSpan:
    """A span read back: the ids it stands for, oldest first."""

    members: tuple[str, ...]
    created_at: float

    kind = KIND_SPAN


ArchiveEntry = ArchivedOriginal | ArchivedSpan


def _entry(row: Checkpoint) -> ArchiveEntry | None:
    """An archive row as its entry; None for a row of another kind (not the archive's)."""
    kind = row.meta.get("kind")
    if kind == KIND_ORIGINAL and len(row.messages) == 1:
        tool = row.meta.get("tool")
        return ArchivedOriginal(
            row.messages[0], row.created_at, tool if isinstance(tool, str) else None
        )
    members = row.meta.get("members")
    if kind == KIND_SPAN and not row.messages and isinstance(members, list):
        ids = tuple(m for m in members if isinstance(m, str) and ID_PATTERN.fullmatch(m))
        return ArchivedSpan(ids, row.created_at)
    return None


# ------------------------------------------------------------------ the archive


class Archive:
    """The archive over a checkpoint store (see the module docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        settings: RecallSettings,
        *,
        concurrency: int = CONCURRENCY,
        clock: Callable[[], float] = time.time,
        health: Health | None = None,
    ) -> None:
        """``health``: where a secret the store cannot give is reported (:class:`ArchiveKeys`)."""
        self.store = store
        self.settings = settings
        self.concurrency = max(1, concurrency)
        self.clock = clock
        self.keys = ArchiveKeys(store, health=health)

    async def recall_ids(self, namespace: str) -> RecallIds:
        """The keyed ids of ``namespace`` (:class:`ArchiveKeys`); ``StoreUnavailable`` while
        the store's secret cannot be read."""
        return await self.keys.ids(namespace)

    @property
    def max_bytes(self) -> int:
        """What one conversation's index may name (``recall.max_archive_mb``)."""
        return self.settings.max_archive_bytes

    @property
    def ttl_seconds(self) -> int:
        return self.settings.ttl_seconds

    async def keep(self, namespace: str, archived: Archived) -> str | None:
        """Writes what one run archived; returns a warning text when some of it was not
        written (the store failed, an original too large or not storable), None when all was.
        Never raises for the store: the request it belongs to goes on regardless."""
        now = self.clock()
        names = call_names(list(archived.originals.values()))
        rows: list[tuple[str, Checkpoint]] = []
        too_large = unstorable = 0
        for recall_id, message in archived.originals.items():
            size = entry_bytes(message)
            if size > self.max_bytes:
                too_large += 1
                continue
            original = dict(message)
            issue = check_messages([original])
            if issue is not None:
                # Read back it would be a foreign value (deleted on sight): not worth the write.
                log.warning("archived original %s not stored: %s", recall_id, issue)
                unstorable += 1
                continue
            meta: dict[str, Any] = {"kind": KIND_ORIGINAL, "bytes": size}
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and call_id in names:
                meta["tool"] = names[call_id]
            rows.append((recall_id, Checkpoint((original,), now, meta)))
        for recall_id, members in archived.spans.items():
            meta = {"kind": KIND_SPAN, "members": list(members)}
            rows.append((recall_id, Checkpoint((), now, meta)))
        ttl = self.ttl_seconds

        async def put(row: tuple[str, Checkpoint]) -> None:
            await self.store.put(namespace, row[0], row[1], ttl)

        results = await self._bounded([functools.partial(put, row) for row in rows])
        failures = [r for r in results if isinstance(r, StoreUnavailable)]
        problems: list[str] = []
        if failures:
            problems.append(
                f"recall archive: {len(failures)} of {len(rows)} entries not stored "
                f"({self.store.name} unavailable)"
            )
            first = failures[0]
            level = logging.DEBUG if isinstance(first, StoreMarkedDown) else logging.WARNING
            log.log(level, "%s: %s", problems[0], first)
        if too_large:
            problems.append(
                f"recall archive: {too_large} original(s) larger than recall.max_archive_mb "
                f"({self.settings.max_archive_mb:g} MB) not archived"
            )
        if unstorable:
            problems.append(f"recall archive: {unstorable} original(s) not storable, not archived")
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, StoreUnavailable):
                raise result
        return "; ".join(problems) or None

    async def fetch(self, namespace: str, ids: Iterable[str]) -> dict[str, ArchiveEntry]:
        """The entries of ``ids`` that are archived (an id never kept, expired, malformed or
        of a row that is not the archive's is absent). Raises :class:`StoreUnavailable` when
        the store could not answer: the caller says "not available", never "not found"."""
        wanted = [i for i in dict.fromkeys(ids) if ID_PATTERN.fullmatch(i)]

        async def get(recall_id: str) -> tuple[str, ArchiveEntry | None]:
            found = await self.store.find_longest(namespace, [recall_id])
            return recall_id, None if found is None else _entry(found[1])

        results = await self._bounded([functools.partial(get, i) for i in wanted])
        entries: dict[str, ArchiveEntry] = {}
        for result in results:
            if isinstance(result, BaseException):
                raise result
            recall_id, entry = result
            if entry is not None:
                entries[recall_id] = entry
        return entries

    async def _bounded(
        self, calls: Sequence[Callable[[], Awaitable[T]]]
    ) -> list[T | BaseException]:
        """Every call run, at most :attr:`concurrency` at once; each result or its exception,
        in order."""
        gate = asyncio.Semaphore(self.concurrency)

        async def one(call: Callable[[], Awaitable[T]]) -> T:
            async with gate:
                return await call()

        return await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)
