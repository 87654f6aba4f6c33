"""The compaction flow's public values: the request every caller states (:class:`FlowRequest`)
and what the flow answers (:class:`FlowResult`); compaction_proxy/engine/_flow.py runs one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.compaction import CompactionResult, Mode
from compaction_proxy.http import UNKNOWN_CALLER, Spending
from compaction_proxy.summarizer import SummaryCalls
from compaction_proxy.wire import DEFAULT_FORMAT, CallerKey, ContextEdits, NativeRequest, WireFormat

from ._known import Known
from ._prepare import PrepareState
from ._recallable import Recallable


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """One request to compact, as every caller (the routes, the preview, ``compact``) states it.

    ``data``: the chat-shaped body (a format's view, compaction_proxy/wire/format.py).
    ``credential`` names the tenant (hashed into the namespace); ``caller_key`` is the
    caller's own key, which the summarizer may send to the request's own upstream (None when
    the client authenticated to the proxy).
    ``tenant``: the ``X-Compaction-Tenant`` header, which joins the body's system block, tools
    and per-user fields in the namespace (:func:`scope_of`). ``spend``: whether the
    summarizer may spend an operator's key for this caller (by default it may not: the
    edge says who was let in, compaction_proxy/http/_admission.py).
    ``persist``: False stores nothing (a preview, a forced run).
    ``context_window``: the window to budget for, when not the catalog's
    (compaction_proxy/upstream/_windows.py); it is part of the checkpoint namespace;
    ``window_source``: where it came from (the report says). ``calls``: the request's log of
    summarizer HTTP calls (the request's telemetry counts them when it ends); None: counted as
    they happen. ``summarize``: False keeps the summarizer out (a local preview,
    ``compact --no-summarize``). ``wire``: the request's format: whether ``data`` may be sent
    to the summarizer as a cache-aligned prefix, and the summary call's form on the request's
    own upstream. ``native``: the request in its own format's form, for a format whose summary
    call writes the cache-aligned prefix itself (``SummaryCall.prefix``; None otherwise).
    ``edits``: the request's own context edits, which the proxy applies for an upstream that
    does not (compaction_proxy/wire/format.py): their strategies run before the pipeline, and
    their key joins the namespace. ``known``: what the request shares with its conversation's
    previous one (compaction_proxy/engine/_known.py): the chain and the counts go on from
    there, and what this one learns is left in it for the next.
    """

    data: dict[str, Any]
    mode: Mode
    size_hint: int
    credential: str | None
    caller_key: CallerKey | None
    upstream_name: str
    persist: bool = True
    context_window: int | None = None
    window_source: str | None = None
    calls: SummaryCalls | None = None
    summarize: bool = True
    wire: WireFormat = DEFAULT_FORMAT
    tenant: str | None = None
    spend: Spending = UNKNOWN_CALLER
    native: NativeRequest | None = None
    edits: ContextEdits | None = None
    known: Known | None = None


@dataclass(slots=True)
class FlowResult:
    """What to forward and what to tell the client about it.

    `messages`: what goes upstream in place of the request's messages (the pipeline's result,
    or the checkpoint view on a hit); None: the client's request as it came. The forwarding
    routes splice them into the client's own bytes (compaction_proxy/wire/_forwarded.py), so the
    flow serializes nothing. `save` stores the new checkpoint; the caller runs it only once
    the upstream accepted the compacted request (a 2xx), so a compaction the upstream refused
    never becomes sticky.
    """

    messages: Sequence[Mapping[str, Any]] | None
    result: CompactionResult
    checkpoint: str  # "hit" | "new" (stored once the upstream accepts it) | "none"
    warnings: list[str] = field(default_factory=list)
    save: Callable[[], Awaitable[str | None]] | None = None
    prepared: PrepareState = "none"  # X-Compaction-Prepared (compaction_proxy/engine/_prepare.py)
    request: Mapping[str, Any] | None = None  # the body `messages` belong in
    recall: Recallable | None = None  # what the conversation may recall (docs/recall.md)

    @property
    def body(self) -> bytes | None:
        """The request with `messages`, serialized whole by orjson (what the preview shows and
        `compact --out` writes); None when nothing changed."""
        if self.messages is None:
            return None
        return orjson.dumps({**(self.request or {}), "messages": list(self.messages)})
