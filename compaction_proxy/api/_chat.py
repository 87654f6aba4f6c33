"""POST /v1/chat/completions: validate, compact, forward, stream back.

The compaction attempts and the forward loop with compact-and-retry are shared with the
Responses route (compaction_proxy/api/_attempts.py); this module only reads the chat body.
"""

from __future__ import annotations

from compaction_proxy.checkpoints import StoreBudget
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.messages import last_user_text
from compaction_proxy.engine import OFFLOAD_BYTES
from compaction_proxy.http import Receive, Scope, Send, read_body
from compaction_proxy.upstream import json_model
from compaction_proxy.wire import ClientBody, parse_chat_body, validate_chat

from ._attempts import Attempt, Subject, compact, send_with_retries
from ._context import RequestContext
from ._forward import Outcome
from ._limits import compacted_model, size_limits
from ._requests import (
    compaction_mode,
    effective_window,
    readable_encoding,
    route,
)


async def chat_completions(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send
) -> Outcome:
    # Every store call of the request (window read, lookup, summary flights, the checkpoint
    # saved once the upstream answers, a learned window) shares one time budget: a store that
    # hangs costs the request that much at most, however many calls it would have made.
    with StoreBudget(ctx.state.settings.store.request_budget):
        return await _chat_completions(ctx, scope, receive, send)


async def _chat_completions(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send
) -> Outcome:
    state = ctx.state
    raw = await read_body(scope, receive, state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    mode = compaction_mode(scope)
    if mode is None:
        return await untouched(ctx, scope, receive, send, raw)
    offload = state.compactor.offload
    with offload.holding(raw):
        return await _compact_and_send(ctx, scope, receive, send, raw, mode)


async def _compact_and_send(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send, raw: bytes, mode: Mode
) -> Outcome:
    state = ctx.state
    offload = state.compactor.offload
    # A large body is parsed (and held to server.max_messages / max_content_parts) off the
    # event loop (compaction_proxy/engine/_offload.py).
    data = await offload.parse(
        raw,
        parse_chat_body,
        params=("messages",),
        limits=size_limits(state, scope),
        applies=compacted_model(state),
    )
    model: str = data["model"]
    ctx.model = model
    upstream = state.router.for_model(model)
    ctx.upstream = upstream.name
    if state.settings.dashboard.show_content:
        ctx.content = last_user_text(data["messages"])
    attempt: Attempt | None = None
    # An empty list has nothing to compact; the upstream gives its own verdict on it.
    if data["messages"] and state.compactor.enabled_for(model):
        if len(raw) >= OFFLOAD_BYTES:
            await offload.call(validate_chat, data)
        else:
            validate_chat(data)
        window = await effective_window(ctx, scope, upstream, model)
        subject = Subject(ClientBody(raw, data, "messages"), data, mode)
        attempt = await compact(ctx, scope, subject, window)
    return await send_with_retries(ctx, scope, receive, send, upstream, raw, attempt)


async def untouched(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send, raw: bytes
) -> Outcome:
    """``X-Compaction: off``: the client's bytes go upstream as they came, whatever JSON they
    hold; only ``model`` is read, to route them (compaction_proxy/upstream/_routing.py)."""
    readable_encoding(ctx, scope)
    read = json_model(raw)
    upstream = route(ctx, read)
    ctx.upstream = upstream.name
    messages = read.data.get("messages") if read.data is not None else None
    if ctx.state.settings.dashboard.show_content and isinstance(messages, list):
        ctx.content = last_user_text(messages)
    return await send_with_retries(ctx, scope, receive, send, upstream, raw, None)
