"""A format's token-counting route (``POST /v1/messages/count_tokens``): the count of what the
proxy would forward.

Clients that size their context ask the upstream how long a request is (the Anthropic SDKs'
``messages.count_tokens``). Passed through untouched, the answer would be the length of the
client's request, which the proxy never sends once it compacts: the client's meter would show
a conversation about to overflow that the proxy keeps well inside the window, or make the client
compact on its own. So the body is compacted as the format's own route would compact it (the
same checkpoint lookup, pipeline and window; but nothing is stored and no summarizer is paid for
a count: a stretch a summary would replace is counted as the fallback would leave it), and:

* nothing to compact: the client's bytes go to the upstream's counting route, as sent;
* compacted: the compacted body goes there instead, so the upstream counts, with its own
  tokenizer, exactly what the next request would carry;
* an upstream that has no counting route (404, 405, 501: most local servers): the proxy answers
  ``{"input_tokens": N}`` itself, its own count of that body calibrated by the upstream's
  reported usage, with ``X-Compaction-Counted: proxy``.

The report headers say what compaction did, as on the format's route.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson

from compaction_proxy.checkpoints import StoreBudget
from compaction_proxy.compaction import CompactionResult, Mode
from compaction_proxy.compaction.chat_messages import last_user_text
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.engine import FlowRequest
from compaction_proxy.http import read_body, send_bytes
from compaction_proxy.upstream import ReplyHandling, Window, json_model, post_upstream
from compaction_proxy.wire import ClientBody, WireFormat

from ._attempts import Subject, compacted_body, edit_notes, traits
from ._context import AppState, RequestContext
from ._context_edits import context_edits
from ._limits import compacted_model, size_limits
from ._outcome import RouteOutcome, relayed
from ._recall import offer_for
from ._requests import (
    compaction_mode,
    credential,
    effective_window,
    report_headers,
    route,
    spending,
    tenant,
)

log = logging.getLogger("compaction_proxy.count_tokens")

UNCOUNTED = frozenset({404, 405, 501})
"""Statuses by which an upstream says it has no counting route: the proxy answers instead."""


async def count_tokens(wire: WireFormat, ctx: RequestContext) -> RouteOutcome:
    with StoreBudget(ctx.state.settings.store.request_budget):
        state, scope = ctx.state, ctx.scope
        raw = await read_body(scope, ctx.receive, state.settings.server.max_body_bytes)
        ctx.bytes_in = len(raw)
        mode = compaction_mode(scope)
        if mode is None:
            upstream = route(ctx, json_model(raw))
            ctx.upstream = upstream.name
            return await _ask_upstream(wire, ctx, upstream, raw)
        body = await state.compactor.offload.parse(
            raw,
            wire.parse,
            params=(wire.items,),
            limits=size_limits(state, scope),
            applies=compacted_model(state),
        )
        model = body.get("model")
        ctx.model = model if isinstance(model, str) else None
        upstream = state.router.for_model(ctx.model)
        ctx.upstream = upstream.name
        if (
            ctx.model is None
            or not wire.has_items(body)
            or not state.compactor.enabled_for(ctx.model)
        ):
            return await _ask_upstream(wire, ctx, upstream, raw)
        view = wire.lift(body)
        if state.settings.dashboard.show_content:
            ctx.content = last_user_text(view.chat["messages"])
        # Edits the upstream would not apply are counted as the proxy applies them, without
        # the field (compaction_proxy/api/_context_edits.py).
        edits = context_edits(ctx, upstream, view)
        client = ClientBody(raw, body, wire.items)
        if edits is not None:
            client = client.without(edits.strip)
        window = await effective_window(ctx, upstream, ctx.model, wire)
        try:
            run_mode = Mode.FORCE if mode is Mode.FORCE else Mode.NORMAL
            subject = Subject(client, view, run_mode, wire, edits, traits(upstream))
            counted = await _compacted(ctx, subject, upstream, window, mode)
        except Exception:
            # A count the proxy cannot make is the upstream's to answer, as the route would
            # forward the original: never a failure the client would not have had without it.
            log.exception("count_tokens: compaction failed; the client's body is counted")
            failed = [
                (b"x-compaction-warning", b"compaction failed; the client's body was counted")
            ]
            body_as_sent = client.raw  # without a field the upstream would not take
            return await _ask_upstream(wire, ctx, upstream, body_as_sent, failed)
        forwarded, headers, result, listed = counted
        return await _ask_upstream(wire, ctx, upstream, forwarded, headers, result, listed)


async def _compacted(
    ctx: RequestContext, subject: Subject, upstream: UpstreamSettings, window: Window, mode: Mode
) -> tuple[bytes, list[tuple[bytes, bytes]], CompactionResult, tuple[tuple[str, str], ...]]:
    """The body the count is asked for (the compacted one), its report headers, the result
    and the header values the format's amendment lists (``mode``: the client's, which the
    headers report; ``subject.mode`` the one the count ran in)."""
    state, scope = ctx.state, ctx.scope
    client, view, wire, edits = subject.client, subject.view, subject.wire, subject.edits
    flow = await state.flow.run(
        FlowRequest(
            _as_asked(state, view.chat, window.tokens),
            subject.mode,
            size_hint=len(client.raw),
            credential=credential(ctx),
            caller_key=None,
            upstream_name=upstream.name,
            persist=False,  # a count changes nothing the next request finds
            context_window=window.tokens,
            window_source=window.source,
            summarize=False,  # no summarizer is paid for a count
            wire=wire,
            tenant=tenant(scope),
            spend=spending(ctx, wire.auth),
            edits=edits,
        )
    )
    headers = [h for h in report_headers(flow.result, mode) if not _about_the_limit(h)]
    headers.append((b"x-compaction-checkpoint", flow.checkpoint.encode()))
    headers.extend(edit_notes(subject, flow.result))
    if flow.messages is None:
        return client.raw, headers, flow.result, ()
    # Amended as the request would be: Anthropic's API checks thinking signatures on a count
    # too.
    # With the recall tool, when the request would be offered it (api/_recall.py).
    recall = state.compactor.settings_for(view.chat["model"])[0].recall
    offer, offered = offer_for(wire, client.data, flow.recall, recall)
    side = None if offer is None else offer.wire
    forwarded, notes, listed = compacted_body(subject, flow.messages, offered, side)
    headers.extend(notes)
    return forwarded, headers, flow.result, listed


def _as_asked(state: AppState, chat: dict[str, Any], window: int | None) -> dict[str, Any]:
    """The view budgeted as the request it counts will be: a counting body carries no output
    limit, and the request itself does (Anthropic's requires ``max_tokens``), so the count
    reserves what the model's largest answer would reserve, bounded by
    ``compaction.output_reserve_share`` as the request's own limit is. Without this the count
    would budget by the model's default reserve and compact further than the request."""
    if "max_completion_tokens" in chat or "max_tokens" in chat:
        return chat
    model = chat.get("model")
    if not isinstance(model, str):
        return chat
    most = state.compactor.facts_for(model, window).max_output_tokens
    return {**chat, "max_completion_tokens": most} if most else chat


def _about_the_limit(header: tuple[bytes, bytes]) -> bool:
    """A header about the output limit the count's budget assumed: no limit is forwarded on a
    count, so none is named (nothing the proxy did there reaches the client's request)."""
    name, value = header
    return name == b"x-compaction-output-limit" or (
        name == b"x-compaction-warning" and value.startswith(b"output limit")
    )


async def _ask_upstream(
    wire: WireFormat,
    ctx: RequestContext,
    upstream: UpstreamSettings,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    result: CompactionResult | None = None,
    listed: tuple[tuple[str, str], ...] = (),
) -> RouteOutcome:
    """Forward ``body`` to the upstream's counting route; answer it ourselves when the upstream
    has none and the proxy has a count (``result``). ``listed``: header values the compacted
    body needs (:meth:`WireFormat.amend`)."""
    extra = [*ctx.response_headers, *(headers or ())]
    hold = UNCOUNTED if result is not None else None
    handling = ReplyHandling(wire, extra, hold=hold)
    sent = await post_upstream(ctx, upstream, body, handling, listed=listed)
    # The count's compaction is reported in its headers, never to telemetry: nothing it made
    # was forwarded, so nothing was saved (the next request reports its own).
    if sent.held is None or result is None:
        return relayed(sent)
    counted = math.ceil(result.report.tokens_after * result.report.calibration)
    answer = orjson.dumps({"input_tokens": counted})
    await send_bytes(
        ctx.send,
        200,
        answer,
        [*extra, (b"x-compaction-counted", b"proxy")],
    )
    return RouteOutcome(None, 200)
