"""Each conversation's previous request, so the next one costs only its new step.

An agent re-sends its whole history after every step: without memory the proxy parses,
validates, hashes and counts hundreds of kilobytes to find the one new message. This module
remembers, per process, what the previous request of a conversation cost to understand,
and hands the next request the part that still holds:

* **parse**: the new body's bytes are compared with the previous one's (``memcmp``), and
  only the bytes after the last shared message are parsed
  (compaction_proxy/wire/_increments.py says why that is exact);
* **limits and validation**: each message is checked on its own, so the shared ones passed
  already; only the new ones are checked (``server.max_content_parts`` keeps a running
  count);
* **hash chain**: the checkpoint keys of the shared messages, when the namespace is the same
  (compaction_proxy/checkpoints/_keys.py);
* **token counts**: the exact counts of the shared part of the view the compactor counted,
  when the view is the same (no checkpoint, or the very same checkpoint) and so is the
  tokenizer (:class:`TokenLedger`).

Anything that does not match exactly takes the full path; the two give the same forwarded
bytes, reports and checkpoint keys (tests/unit/test_known_requests.py proves it on generated
sessions). Bounded: at most ``server.conversation_memory_mb`` in all (a record is counted at
about three times its body, what its bytes and parsed messages hold), least recently used
first out; only bodies from :data:`MIN_BYTES` up to :data:`MAX_BYTES`. Safe across tenants: a
record is found only by a key hashed from the request's credential, ``X-Compaction-Tenant``
and format as well as its first bytes, and used only for bytes equal to its own.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from compaction_proxy.checkpoints import Lookup
from compaction_proxy.compaction.validation import SizeLimits, item_parts, size_issue
from compaction_proxy.http import ProxyError
from compaction_proxy.wire import View, WireFormat, validate_chat
from compaction_proxy.wire._increments import (
    Earlier,
    Extended,
    extend,
    scanned,
    shared_items,
    tail_bytes,
)
from compaction_proxy.wire.chat import CHAT

from ._offload import OFFLOAD_BYTES, THREAD_PARSE_BYTES, Offload

MIN_BYTES = 16 * 1024
"""Smaller bodies parse whole: the comparison and the bookkeeping would cost what they save."""
MAX_BYTES = THREAD_PARSE_BYTES
"""Larger bodies are parsed in the worker process and are not remembered."""
PROBE_BYTES = 256
"""The leading bytes that, with the caller, name a record's bucket: a conversation's next
request starts with the same ones."""
BUCKET_SIZE = 16
"""Records per bucket (conversations under one key whose bodies start alike: one system
prompt shared by many sessions); the one a request extends is replaced by its record."""
ViewKey = tuple[str | None, float, int, int, int]
"""Which effective view a count is of: the checkpoint's key and time (None, 0: no
checkpoint), how many client messages it covers, its length, and the system block's."""


@dataclass(slots=True)
class TokenLedger:
    """The exact counts of the effective view's leading messages known before, and, once the
    compactor counted the view exactly, every message's (for the next request)."""

    view: ViewKey
    encoding: str | None
    cumulative: list[int]
    """``cumulative[i]``: the tokens of the view's first ``i`` messages (``i <= n``)."""
    counted: tuple[str, list[int]] | None = None

    def known(self, encoding: str) -> tuple[int, int]:
        """``(n, tokens)`` of the leading messages known for ``encoding``; ``(0, 0)``: none."""
        if encoding != self.encoding or len(self.cumulative) < 2:
            return 0, 0
        return len(self.cumulative) - 1, self.cumulative[-1]

    def settle(self, encoding: str, skip: int, counts: Sequence[int]) -> None:
        """Record the view's counts: ``counts`` of the messages after the ``skip`` known."""
        base = self.cumulative[: skip + 1] if skip and encoding == self.encoding else [0]
        self.counted = (encoding, [*base[:-1], *accumulate(counts, initial=base[-1])])


@dataclass(slots=True)
class Record:
    """What one request leaves for the next of its conversation."""

    earlier: Earlier
    parts: list[int]
    """``parts[i]``: the content parts of the first ``i`` items (``server.max_content_parts``)."""
    namespace: str | None = None
    system: int = 0
    hashes: list[str] = field(default_factory=list)
    view: ViewKey | None = None
    encoding: str | None = None
    cumulative: list[int] | None = None

    @property
    def size(self) -> int:
        """About the memory it holds: the body, its parsed messages, the lists kept."""
        return 3 * len(self.earlier.raw) + 200 * len(self.earlier.items)


class Known:
    """One request's handle on its conversation's memory: what it shares with the previous
    request (read by the route, the flow and the compactor), and the record it leaves."""

    __slots__ = ("bucket", "closed", "previous", "record", "shared")

    def __init__(
        self, bucket: bytes, record: Record, previous: Record | None = None, shared: int = 0
    ) -> None:
        self.bucket = bucket
        self.record = record
        self.previous = previous
        self.shared = shared
        self.closed = False

    @property
    def checked(self) -> int:
        """Leading items validated before (the shared ones)."""
        return self.shared

    def chained(self, namespace: str, system: int) -> Sequence[str]:
        """The chain hashes of the shared non-system messages, when computed under
        ``namespace`` with the same system block."""
        before = self.previous
        if before is None or before.namespace != namespace or before.system != system:
            return ()
        return before.hashes[: max(0, self.shared - system)]

    def ledger(self, lookup: Lookup) -> TokenLedger:
        """The counts known for ``lookup``'s effective view: the shared part of the previous
        request's view, when that was the same view (:data:`ViewKey`)."""
        view = view_of(lookup)
        before = self.previous
        if before is None or before.view != view or before.cumulative is None:
            return TokenLedger(view, None, [0])
        covered, system = lookup.covered, lookup.system_count
        if self.shared < system + covered:
            return TokenLedger(view, None, [0])
        # The view is the system block, the checkpoint, then the client's messages after
        # what it covers: the same objects as before up to the last shared one.
        same = min(self.shared + view[3] - covered, len(before.cumulative) - 1)
        return TokenLedger(view, before.encoding, before.cumulative[: same + 1])

    def settle(self, namespace: str, lookup: Lookup, ledger: TokenLedger | None) -> None:
        """What the flow learned of this request, for the next one (its first attempt's)."""
        if self.closed:
            return
        record = self.record
        record.namespace, record.system, record.hashes = (
            namespace,
            lookup.system_count,
            lookup.hashes,
        )
        if ledger is not None and ledger.counted is not None:
            record.view = ledger.view
            record.encoding, record.cumulative = ledger.counted


def view_of(lookup: Lookup) -> ViewKey:
    checkpoint = lookup.checkpoint
    if checkpoint is None or not lookup.covered:
        return (None, 0.0, 0, 0, lookup.system_count)
    return (
        lookup.hashes[lookup.covered - 1],
        checkpoint.created_at,
        lookup.covered,
        len(checkpoint.messages),
        lookup.system_count,
    )


@dataclass(frozen=True, slots=True)
class Parsed:
    """A body as the route reads it, and its handle on the memory (None: not remembered)."""

    data: dict[str, Any]
    known: Known | None


class ConversationMemory:
    """The records of one process (module docstring), least recently used first out."""

    def __init__(self, budget_bytes: int, offload: Offload) -> None:
        self.budget = budget_bytes
        self.offload = offload
        self._buckets: OrderedDict[bytes, list[Record]] = OrderedDict()
        self.held = 0
        self.extended = 0
        """Requests parsed from a record (a figure for tests and benchmarks)."""

    def applies(self, wire: WireFormat, raw: bytes) -> bool:
        """Chat completions only: its view is the body itself, so what the parse shares is
        what the chain and the counts see (a Responses or Messages view is lifted anew)."""
        return self.budget > 0 and wire is CHAT and MIN_BYTES <= len(raw) <= MAX_BYTES

    @staticmethod
    def lift(wire: WireFormat, body: dict[str, Any], known: Known | None) -> View:
        """``wire.lift(body)``, validating only the messages after the shared ones."""
        if known is None or not known.checked:
            return wire.lift(body)
        validate_chat(body, start=known.checked)
        return wire.lift(body, check=False)

    @staticmethod
    def bucket(credential: str | None, tenant: str | None, wire: WireFormat, raw: bytes) -> bytes:
        parts = (credential or "", tenant or "", wire.name)
        head = "\x1f".join(parts).encode("utf-8", "surrogateescape")
        return hashlib.blake2b(head + b"\x1f" + raw[:PROBE_BYTES], digest_size=16).digest()

    async def parse(
        self,
        raw: bytes,
        wire: WireFormat,
        bucket: bytes,
        *,
        limits: SizeLimits | None,
        applies: Callable[[str | None], bool],
    ) -> Parsed:
        """``raw`` parsed, from its conversation's previous request when it extends it
        (limits applied as :meth:`Offload.parse` does), else whole."""
        found = self._extended(raw, bucket)
        if found is not None:
            before, shared = found
            extended: Extended | None
            if tail_bytes(raw, before.earlier, shared) >= OFFLOAD_BYTES:
                extended = await self.offload.call(extend, raw, before.earlier, wire.parse, shared)
            else:
                extended = extend(raw, before.earlier, wire.parse, shared)
            if extended is not None:
                record = _continued(before, extended, wire.items, raw)
                _check_limits(extended.data, wire.items, record.parts, limits, applies)
                self.extended += 1
                return Parsed(extended.data, Known(bucket, record, before, extended.shared))
        data = await self.offload.parse(
            raw, wire.parse, params=(wire.items,), limits=limits, applies=applies
        )
        if len(raw) >= OFFLOAD_BYTES:
            fresh = await self.offload.call(_fresh, raw, data, wire.items)
        else:
            fresh = _fresh(raw, data, wire.items)
        return Parsed(data, None if fresh is None else Known(bucket, fresh))

    def _extended(self, raw: bytes, bucket: bytes) -> tuple[Record, int] | None:
        """The record of this bucket ``raw`` shares most leading items with."""
        records = self._buckets.get(bucket)
        if not records:
            return None
        best: tuple[Record, int] | None = None
        for record in records:
            shared = shared_items(raw, record.earlier)
            if shared and (best is None or shared > best[1]):
                best = (record, shared)
        return best

    def remember(self, known: Known | None) -> None:
        """Keep ``known``'s record for the conversation's next request (replacing the one it
        extended), then evict down to the budget."""
        if known is None or known.closed or self.budget <= 0:
            return
        known.closed = True
        record = known.record
        if record.size > self.budget:
            return
        records = self._buckets.get(known.bucket)
        if records is None:
            records = self._buckets[known.bucket] = []
        else:
            self._buckets.move_to_end(known.bucket)
        if known.previous is not None and known.previous in records:
            records.remove(known.previous)
            self.held -= known.previous.size
        records.insert(0, record)
        self.held += record.size
        while len(records) > BUCKET_SIZE:
            self.held -= records.pop().size
        while self.held > self.budget and self._buckets:
            oldest_key, oldest = next(iter(self._buckets.items()))
            self.held -= oldest.pop().size
            if not oldest:
                del self._buckets[oldest_key]

    @property
    def records(self) -> int:
        return sum(len(records) for records in self._buckets.values())


def _fresh(raw: bytes, data: dict[str, Any], key: str) -> Record | None:
    earlier = scanned(raw, data, key)
    if earlier is None:
        return None
    return Record(earlier, [0, *accumulate(item_parts(item) for item in earlier.items)])


def _continued(before: Record, extended: Extended, key: str, raw: bytes) -> Record:
    items: list[Any] = extended.data[key]
    shared = extended.shared
    tail = (item_parts(item) for item in items[shared:])
    parts = [*before.parts[:shared], *accumulate(tail, initial=before.parts[shared])]
    return Record(Earlier(raw, key, extended.spans, items), parts)


def _check_limits(
    data: dict[str, Any],
    key: str,
    parts: list[int],
    limits: SizeLimits | None,
    applies: Callable[[str | None], bool],
) -> None:
    """``server.max_messages`` / ``max_content_parts`` as the full path applies them."""
    if limits is None:
        return
    items = data.get(key)
    issue = size_issue(items, limits, param=key, start=len(parts) - 1, parts=parts[-1])
    if issue is None:
        return
    model = data.get("model")
    if applies(model if isinstance(model, str) else None):
        raise ProxyError(413, issue.message, "invalid_request_error", issue.code, issue.param)


__all__ = ["MIN_BYTES", "ConversationMemory", "Known", "Parsed", "TokenLedger"]
