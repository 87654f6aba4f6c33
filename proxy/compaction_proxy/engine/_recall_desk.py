"""The answer to one ``compaction_recall`` call, from the archive (docs/recall.md, "The recall
tool").

The recall loop (``compaction_proxy/api/_recall.py``) hands each call the model made to
:meth:`RecallDesk.answer` with the ids the request may recall (``allowed``: its conversation's
index, which :func:`~compaction_proxy.checkpoints.merged_index` keeps in its checkpoint, with
what this request archived; never an id because some text of the request names it). The
rules:

* the arguments are JSON: ``ids`` (recall ids, from the marks), ``query`` (keywords), ``page``
  (from 1); a malformed call gets an error answer that says what is wrong, never a failure;
* an id is answered only when it is allowed or a member of an allowed span (spans expanded a
  few levels deep, at most :data:`MAX_EXPANDED` ids; a span lists only ids its conversation
  held, :func:`~compaction_proxy.checkpoints.confined`), read in the end user's own archive
  namespace: content reaches only the conversation it came from, and an id of another
  conversation or end user reads exactly like one that never existed, ``no archived content
  for id X``;
* ``query`` ranks the allowed originals (:func:`~compaction_proxy.compaction.recall_text.search`)
  and shows the best of them;
* the answer is paged to ``recall.max_tokens`` (or the loop's smaller limit);
* a store that cannot answer: ``archive not available right now``, an error answer, and
  :attr:`Recalled.unavailable` so the loop can count it. The request still succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.checkpoints import (
    Archive,
    ArchivedOriginal,
    ArchivedSpan,
    ArchiveEntry,
    StoreUnavailable,
)
from compaction_proxy.compaction.archive import ID_PATTERN
from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.compaction.message_text import call_names
from compaction_proxy.compaction.recall_text import PageOutOfRange, page, render, search
from compaction_proxy.compaction.settings import RecallSettings
from compaction_proxy.wire.recall import RECALL_TOOL, RecallAnswer, RecallCall

from ._degraded import RECALL, DegradedPath

log = logging.getLogger("compaction_proxy.recall")

CountText = Callable[[str], int]

UNAVAILABLE = "archive not available right now"
MAX_IDS = 50
"""Ids one call may name (a model listing hundreds wants a query)."""
MAX_DEPTH = 4
"""How deep spans are expanded: a summary of summaries of summaries, and one more."""
MAX_EXPANDED = 5_000
"""Ids one answer reads at most (spans, their members, the originals a query searches)."""
MAX_QUERY_RESULTS = 8
"""Originals a query answer shows, best first (then paged like any answer)."""
_SHOWN_ID = 40  # characters of an unknown id the answer repeats


@dataclass(frozen=True, slots=True)
class Recalled:
    """One call's answer and what it returned: ``ids``, the originals it shows (``shown``:
    which); ``tokens``, the answer's; ``unavailable``, the archive could not be read."""

    answer: RecallAnswer
    ids: int = 0
    tokens: int = 0
    unavailable: bool = False
    shown: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RecallArguments:
    """A call's arguments, checked."""

    ids: tuple[str, ...] = ()
    query: str | None = None
    page: int = 1


class BadArguments(CompactionProxyError, ValueError):
    """Why a call's arguments cannot be answered (the text of the error answer)."""


def parse_arguments(text: str) -> RecallArguments:
    """The call's arguments (JSON text, as the model wrote them); :class:`BadArguments` says
    what is wrong. ``ids`` may be one string; unknown members are ignored."""
    try:
        data = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        raise BadArguments(
            'the arguments are not valid JSON: send an object such as {"ids": ["r..."]} or '
            '{"query": "words to look for"}'
        ) from None
    if not isinstance(data, dict):
        raise BadArguments("the arguments must be a JSON object with ids, query or page")
    raw_ids = data.get("ids")
    if raw_ids is None:
        ids: tuple[str, ...] = ()
    elif isinstance(raw_ids, str):
        ids = (raw_ids,)
    elif isinstance(raw_ids, list) and all(isinstance(i, str) for i in raw_ids):
        ids = tuple(i.strip() for i in raw_ids)
    else:
        raise BadArguments('ids must be an array of recall id strings, such as ["rq72amlvh4xx"]')
    if len(ids) > MAX_IDS:
        raise BadArguments(f"at most {MAX_IDS} ids per call ({len(ids)} given); use a query")
    query = data.get("query")
    if query is not None and not isinstance(query, str):
        raise BadArguments("query must be a string")
    query = query.strip() if query else None
    number = data.get("page", 1)
    if number is None:
        number = 1
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise BadArguments("page must be an integer, 1 or more")
    if not ids and not query:
        raise BadArguments(
            "give ids (the recall ids the placeholders and summaries name) or a query"
        )
    return RecallArguments(tuple(dict.fromkeys(ids)), query or None, number)


class _Reader:
    """The entries one answer has read, fetched in batches (each id once)."""

    def __init__(self, archive: Archive, namespace: str) -> None:
        self.archive = archive
        self.namespace = namespace
        self.entries: dict[str, ArchiveEntry] = {}
        self.asked: set[str] = set()

    async def load(self, ids: Iterable[str]) -> None:
        wanted = [i for i in dict.fromkeys(ids) if i not in self.asked]
        room = MAX_EXPANDED - len(self.asked)
        wanted = wanted[: max(0, room)]
        if not wanted:
            return
        self.asked.update(wanted)
        self.entries.update(await self.archive.fetch(self.namespace, wanted))

    async def expand(self, roots: Iterable[str]) -> None:
        """Reads ``roots`` and, level by level, the members of the spans among them."""
        frontier = list(dict.fromkeys(roots))
        for _ in range(MAX_DEPTH + 1):
            await self.load(frontier)
            following: list[str] = []
            for recall_id in frontier:
                entry = self.entries.get(recall_id)
                if isinstance(entry, ArchivedSpan):
                    following.extend(m for m in entry.members if m not in self.asked)
            frontier = list(dict.fromkeys(following))
            if not frontier:
                return

    def originals(self, recall_id: str, depth: int = 0, seen: set[str] | None = None) -> list[str]:
        """The original ids ``recall_id`` stands for, in order (itself for an original; a
        span's members, expanded), among what was read."""
        entry = self.entries.get(recall_id)
        if isinstance(entry, ArchivedOriginal):
            return [recall_id]
        if not isinstance(entry, ArchivedSpan) or depth > MAX_DEPTH:
            return []
        seen = set() if seen is None else seen
        if recall_id in seen:
            return []
        seen.add(recall_id)
        found: list[str] = []
        for member in entry.members:
            found.extend(self.originals(member, depth + 1, seen))
        return list(dict.fromkeys(found))

    def reachable(self, allowed: Iterable[str]) -> set[str]:
        """``allowed`` and every id inside the allowed spans read so far."""
        reached: set[str] = set()
        frontier = list(allowed)
        for _ in range(MAX_DEPTH + 2):
            following: list[str] = []
            for recall_id in frontier:
                if recall_id in reached:
                    continue
                reached.add(recall_id)
                entry = self.entries.get(recall_id)
                if isinstance(entry, ArchivedSpan):
                    following.extend(entry.members)
            frontier = following
            if not frontier:
                break
        return reached


class RecallDesk:
    """Answers recall calls from an :class:`~compaction_proxy.checkpoints.Archive`; see the
    module docstring. ``count``: the tokens of a text, for paging and the answer's size."""

    def __init__(
        self,
        archive: Archive,
        settings: RecallSettings,
        count: CountText,
        health: DegradedPath | None = None,
    ) -> None:
        self.archive = archive
        self.settings = settings
        self.count = count
        self.health = health or DegradedPath(RECALL, "recall archive")  # _degraded.py

    async def answer(
        self,
        namespace: str,
        allowed: frozenset[str],
        call: RecallCall,
        max_tokens: int | None = None,
        *,
        names: Mapping[str, str] | None = None,
    ) -> Recalled:
        """The answer to ``call`` for a request whose conversation may recall ``allowed``
        (in the tenant's archive ``namespace``). ``max_tokens``: the loop's limit for one
        answer (default ``recall.max_tokens``); ``names``: tool call id -> tool name over the
        forwarded messages, so a recalled tool result can say which tool made it."""
        limit = self.settings.max_tokens if max_tokens is None else max(1, max_tokens)
        try:
            arguments = parse_arguments(call.arguments)
        except BadArguments as exc:
            return self._error(call, str(exc))
        reader = _Reader(self.archive, namespace)
        try:
            sections, shown = await self._sections(reader, allowed, arguments)
        except StoreUnavailable as exc:
            log.debug("recall: the archive could not be read: %s", exc)
            self.health.failed(f"the archive could not be read ({type(exc).__name__})")
            text = UNAVAILABLE
            return Recalled(RecallAnswer(call.call_id, text, True), 0, self.count(text), True)
        self.health.recovered()
        tools = {**call_names(_messages(reader)), **(names or {})}

        def paged() -> str:
            rendered = [_render(section, reader, tools) for section in sections]
            return page("\n\n".join(rendered), limit, arguments.page, self.count)[0]

        try:
            # Rendering and counting an answer (a span of thousands of originals, one original
            # of megabytes) can take a while: always off the event loop (a recall is rare, the
            # hop costs well under a millisecond).
            text = await asyncio.to_thread(paged)
        except PageOutOfRange as exc:
            return self._error(call, str(exc))
        shown_ids = tuple(dict.fromkeys(shown))
        return Recalled(
            RecallAnswer(call.call_id, text), len(shown_ids), self.count(text), False, shown_ids
        )

    def _error(self, call: RecallCall, text: str) -> Recalled:
        message = f"{RECALL_TOOL}: {text}"
        return Recalled(RecallAnswer(call.call_id, message, True), 0, self.count(message))

    async def _sections(
        self, reader: _Reader, allowed: frozenset[str], arguments: RecallArguments
    ) -> tuple[list[str | _Line], list[str]]:
        """What the answer shows, in order: original ids to render and lines of text."""
        sections: list[str | _Line] = []
        shown: list[str] = []
        if arguments.ids:
            valid = [i for i in arguments.ids if ID_PATTERN.fullmatch(i)]
            await reader.expand(i for i in valid if i in allowed)
            if any(i not in allowed for i in valid):
                # A member of an allowed span may be asked for by its own id.
                await reader.expand(i for i in allowed if i.startswith("s"))
            reached = reader.reachable(allowed)
            await reader.expand(i for i in valid if i in reached)
            for recall_id in arguments.ids:
                originals = reader.originals(recall_id) if recall_id in reached else []
                entry = reader.entries.get(recall_id) if recall_id in reached else None
                if not originals:
                    if isinstance(entry, ArchivedSpan):
                        sections.append(_Line(f"no archived content left for id {recall_id}"))
                    else:
                        sections.append(_Line(f"no archived content for id {_shown(recall_id)}"))
                    continue
                if isinstance(entry, ArchivedSpan):
                    missing = len(entry.members) - len(originals)
                    note = f"; {missing} no longer archived" if missing > 0 else ""
                    sections.append(
                        _Line(f"[recall id {recall_id}: {len(originals)} archived messages{note}]")
                    )
                fresh = [i for i in originals if i not in shown]
                sections.extend(fresh)
                shown.extend(fresh)
        if arguments.query:
            await reader.expand(sorted(allowed))
            reached = reader.reachable(allowed)
            candidates: list[tuple[float, str, ArchivedOriginal]] = []
            for recall_id in reached:
                entry = reader.entries.get(recall_id)
                if isinstance(entry, ArchivedOriginal) and recall_id not in shown:
                    candidates.append((entry.created_at, recall_id, entry))
            # Oldest first, so a tie goes to the newest (search's rule); the id breaks ties
            # of one write, so the order is the same on every call (pages stay stable).
            candidates.sort(key=lambda item: (item[0], item[1]))
            entries = {recall_id: entry.message for _, recall_id, entry in candidates}
            hits = await asyncio.to_thread(
                search, arguments.query, entries, limit=MAX_QUERY_RESULTS
            )
            if not hits:
                sections.append(_Line(f"no archived content matches the query {arguments.query!r}"))
            sections.extend(hits)
            shown.extend(hits)
        return sections, shown


@dataclass(frozen=True, slots=True)
class _Line:
    """A line of an answer that is not an original (a span's header, a miss)."""

    text: str


def _render(section: str | _Line, reader: _Reader, tools: Mapping[str, str]) -> str:
    if isinstance(section, _Line):
        return section.text
    entry = reader.entries[section]
    assert isinstance(entry, ArchivedOriginal)
    return render(section, entry.message, _tool(entry, tools))


def _shown(recall_id: str) -> str:
    return recall_id if len(recall_id) <= _SHOWN_ID else recall_id[:_SHOWN_ID] + "…"


def _messages(reader: _Reader) -> Sequence[Mapping[str, Any]]:
    return [e.message for e in reader.entries.values() if isinstance(e, ArchivedOriginal)]


def _tool(entry: ArchiveEntry, names: Mapping[str, str]) -> str | None:
    if not isinstance(entry, ArchivedOriginal):
        return None
    call_id = entry.message.get("tool_call_id")
    if isinstance(call_id, str) and call_id in names:
        return names[call_id]
    return entry.tool
