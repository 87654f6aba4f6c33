"""The compacted routes: one per wire format (compaction_proxy/wire/registry.py), all this one.

Read the body with the format, lift it to the chat-shaped view the core compacts, compact
(compaction_proxy/api/_attempts.py: checkpoint lookup, pipeline, summaries, report headers, the
checkpoint saved once the upstream accepts), lower each attempt back into the client's bytes,
forward, and compact again after an overflow refusal. The reply, JSON or SSE, is relayed byte
for byte.

What stays untouched: ``X-Compaction: off`` (the client's bytes, routed by ``model`` alone), a
request whose history the upstream holds (``held_by``: the proxy can neither count nor compact
it; ``X-Compaction-Skipped`` says so), and anything a compaction failure would touch (the
original goes upstream, with a warning).
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction_proxy.checkpoints import StoreBudget
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.chat_messages import last_user_text
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.engine import OFFLOAD_BYTES, Known
from compaction_proxy.http import ProxyError, read_body
from compaction_proxy.upstream import json_model
from compaction_proxy.wire import ClientBody, WireFormat
from compaction_proxy.wire.recall import RECALL_TOOL

from ._attempts import Attempt, Subject, compact, send_with_retries, traits
from ._context import RequestContext
from ._context_edits import context_edits
from ._limits import compacted_model, size_limits
from ._outcome import RouteOutcome
from ._recall import clashes
from ._requests import (
    compaction_mode,
    credential,
    effective_window,
    readable_encoding,
    route,
    tenant,
)


async def compacted(wire: WireFormat, ctx: RequestContext) -> RouteOutcome:
    # Every store call of the request (window read, lookup, summary flights, the checkpoint
    # saved once the upstream answers, a learned window) shares one time budget: a store that
    # hangs costs the request that much at most, however many calls it would have made.
    with StoreBudget(ctx.state.settings.store.request_budget):
        state = ctx.state
        raw = await read_body(ctx.scope, ctx.receive, state.settings.server.max_body_bytes)
        ctx.bytes_in = len(raw)
        mode = compaction_mode(ctx.scope)
        call = _Call(wire, ctx, raw)
        if mode is None:
            return await _untouched(call)
        with state.compactor.offload.holding(raw):
            return await _compact_and_send(call, mode)


@dataclass(frozen=True, slots=True)
class _Call:
    """One compacted route's request as it reached the proxy: what each of its steps takes."""

    wire: WireFormat
    ctx: RequestContext
    raw: bytes

    async def send_upstream(
        self, upstream: UpstreamSettings, attempt: Attempt | None
    ) -> RouteOutcome:
        """Forward ``attempt`` (None: the client's bytes), compacting again after a refusal."""
        return await send_with_retries(self.ctx, upstream, self.raw, attempt, self.wire)


async def _compact_and_send(call: _Call, mode: Mode) -> RouteOutcome:
    wire, ctx, raw = call.wire, call.ctx, call.raw
    scope = ctx.scope
    state = ctx.state
    offload = state.compactor.offload
    # A large body is parsed (and held to server.max_messages / max_content_parts),
    # validated and lifted off the event loop (compaction_proxy/engine/_offload.py); one that
    # extends its conversation's previous request, only in its new part
    # (compaction_proxy/engine/_known.py).
    memory = state.compactor.memory
    limits, applies = size_limits(state, scope), compacted_model(state)
    known: Known | None = None
    if memory.applies(wire, raw):
        bucket = memory.bucket(credential(ctx), tenant(scope), wire, raw)
        parsed = await memory.parse(raw, wire, bucket, limits=limits, applies=applies)
        body, known = parsed.data, parsed.known
    else:
        body = await offload.parse(
            raw, wire.parse, params=(wire.items,), limits=limits, applies=applies
        )
    model = body.get("model")
    ctx.model = model if isinstance(model, str) else None
    upstream = state.router.for_model(ctx.model)
    ctx.upstream = upstream.name
    show = state.settings.dashboard.show_content
    if show:
        ctx.content = wire.shown(body)
    attempt: Attempt | None = None
    held_by = wire.held_by(body)
    if held_by is not None:
        ctx.response_headers.append((b"x-compaction-skipped", skipped_note(held_by)))
    elif ctx.model is not None and wire.has_items(body) and state.compactor.enabled_for(ctx.model):
        if state.compactor.settings_for(ctx.model)[0].recall.enabled and clashes(wire, body):
            raise ProxyError(
                400,
                f"the tool name {RECALL_TOOL!r} is the proxy's own (compaction.recall is on): "
                "rename your tool, or turn recall off for this model",
                param="tools",
                code="tool_name_reserved",
            )
        if len(raw) >= OFFLOAD_BYTES and (known is None or not known.checked):
            view = await offload.call(wire.lift, body)
        else:
            view = memory.lift(wire, body, known)
        if show:
            ctx.content = last_user_text(view.chat["messages"])
        # Edits the upstream would not apply: the proxy applies them, and they go without.
        edits = context_edits(ctx, upstream, view)
        client = ClientBody(raw, body, wire.items)
        if edits is not None:
            client = client.without(edits.strip)
        window = await effective_window(ctx, upstream, ctx.model, wire)
        subject = Subject(client, view, mode, wire, edits, traits(upstream), known)
        attempt = await compact(ctx, subject, window)
        memory.remember(known)
    return await call.send_upstream(upstream, attempt)


async def _untouched(call: _Call) -> RouteOutcome:
    """``X-Compaction: off``: the client's bytes go upstream as they came, whatever JSON they
    hold; only ``model`` is read, to route them (compaction_proxy/upstream/_routing.py)."""
    wire, ctx = call.wire, call.ctx
    readable_encoding(ctx)
    read = json_model(call.raw)
    upstream = route(ctx, read)
    ctx.upstream = upstream.name
    if ctx.state.settings.dashboard.show_content and read.data is not None:
        ctx.content = wire.shown(read.data)
    return await call.send_upstream(upstream, None)


def skipped_note(field: str) -> bytes:
    """``X-Compaction-Skipped``: why the request went upstream uncompacted."""
    return (
        f"{field}: the upstream holds this conversation's history, which the proxy cannot see; "
        "forwarded unchanged"
    ).encode()
