"""POST /v1/responses: the Responses API compacted in flight, on the chat-completions core.

A stateless Responses agent (``store: false``, the whole ``input`` re-sent every turn) grows
exactly as a chat agent does, so it gets exactly the same compaction: the body's items are
shown to the core as chat messages (compaction_proxy/wire/responses/), the compaction shared with
the chat route runs on them (compaction_proxy/api/_attempts.py: checkpoint lookup, pipeline,
summaries, report headers, the checkpoint saved once the upstream accepts), and each attempt is
mapped back to items (:func:`as_responses`). The reply, JSON or typed SSE events, is relayed byte
for byte; an overflow refusal is compacted away and retried as for chat completions. Summary calls
get the plain-text transcript, not the chat-shaped view as a prefix: the view carries ``input_text``
parts and custom tool calls a strict chat-completions server refuses.

What stays untouched: a request that continues server-side state (``previous_response_id``,
``conversation``: the upstream prepends history the proxy cannot see, so it can neither count
nor compact it; ``X-Compaction-Skipped`` says so), ``X-Compaction: off``, and anything a
compaction failure would touch (the original goes upstream, with a warning). ``truncation:
"auto"`` is the upstream's business and goes along as sent.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from compaction_proxy.checkpoints import StoreBudget
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.messages import last_user_text
from compaction_proxy.engine import OFFLOAD_BYTES
from compaction_proxy.http import Receive, Scope, Send, bad_request, read_body
from compaction_proxy.upstream import json_model
from compaction_proxy.wire import ClientBody, parse_json_object
from compaction_proxy.wire.responses import (
    Lifted,
    input_items,
    lift,
    lower,
    server_state,
    validate_request,
)

from ._attempts import Attempt, Subject, compact, failed, send_with_retries
from ._context import RequestContext
from ._forward import Outcome
from ._limits import compacted_model, size_limits
from ._requests import (
    compaction_mode,
    effective_window,
    header_safe,
    readable_encoding,
    route,
)

log = logging.getLogger("compaction_proxy.responses")


async def responses(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> Outcome:
    # One time budget for every store call of the request, as for chat completions.
    with StoreBudget(ctx.state.settings.store.request_budget):
        return await _responses(ctx, scope, receive, send)


async def _responses(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> Outcome:
    state = ctx.state
    raw = await read_body(scope, receive, state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    mode = compaction_mode(scope)
    if mode is None:
        # The client's bytes go upstream as they came, routed by `model` alone.
        readable_encoding(ctx, scope)
        upstream = route(ctx, json_model(raw))
        ctx.upstream = upstream.name
        return await send_with_retries(ctx, scope, receive, send, upstream, raw, None)
    with state.compactor.offload.holding(raw):
        return await _compact_and_send(ctx, scope, receive, send, raw, mode)


async def _compact_and_send(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send, raw: bytes, mode: Mode
) -> Outcome:
    state = ctx.state
    offload = state.compactor.offload
    # Large bodies: parsed, limited, validated and lifted off the event loop, as for chat.
    body = await offload.parse(
        raw,
        parse_responses_body,
        params=("input",),
        limits=size_limits(state, scope),
        applies=compacted_model(state),
    )
    model = body.get("model")
    ctx.model = model if isinstance(model, str) else None
    upstream = state.router.for_model(ctx.model)
    ctx.upstream = upstream.name
    attempt: Attempt | None = None
    held_by = server_state(body)
    if held_by is not None:
        ctx.response_headers.append((b"x-compaction-skipped", skipped_note(held_by)))
    elif ctx.model is not None and input_items(body) and state.compactor.enabled_for(ctx.model):
        if len(raw) >= OFFLOAD_BYTES:
            lifted = await offload.call(validated_lift, body)
        else:
            lifted = validated_lift(body)
        if state.settings.dashboard.show_content:
            ctx.content = last_user_text(lifted.messages)
        window = await effective_window(ctx, scope, upstream, ctx.model)
        subject = Subject(
            ClientBody(raw, body, "input"),
            lifted.chat_body(body),
            mode,
            reshape=partial(as_responses, lifted=lifted),
            # The view's parts and custom calls are not chat completions: a summary call
            # sends the plain-text transcript, never the view as a cache-aligned prefix.
            summary_prefix=False,
        )
        attempt = await compact(ctx, scope, subject, window)
    return await send_with_retries(ctx, scope, receive, send, upstream, raw, attempt)


def validated_lift(body: dict[str, Any]) -> Lifted:
    """The chat-shaped view of ``body``, or a 400 naming what is wrong with its input."""
    issue = validate_request(body)
    if issue is not None:
        raise bad_request(issue.message, param=issue.param, code="invalid_input")
    return lift(body)


def as_responses(attempt: Attempt, *, lifted: Lifted) -> Attempt:
    """``attempt`` (made on the chat-shaped view) with a Responses body to forward.

    Unchanged requests and dry runs keep the client's bytes. Otherwise the pipeline's messages
    are mapped back to items and only ``input`` is replaced, in the client's own bytes: every
    other field, and every item the proxy did not change, goes upstream as the client wrote it
    (compaction_proxy/wire/_forwarded.py). A failure here is a compaction failure: the original is
    forwarded.
    """
    if attempt.result is None or attempt.messages is None:
        return attempt
    try:
        lowered = lower(lifted, attempt.messages)
        attempt.body = attempt.subject.client.with_elements(lowered.items)
    except Exception:
        log.exception("mapping the compacted input back failed; forwarding the original request")
        return failed(attempt.subject, attempt.window)
    attempt.headers.extend((b"x-compaction-warning", header_safe(n)) for n in lowered.notes)
    return attempt


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says what is wrong with it.

    ``model`` and ``input`` may be absent (a stored prompt supplies them); the upstream judges
    that. A ``model`` that is not a string is refused here, as chat completions does.
    """
    data = parse_json_object(raw)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(
            f"'model' must be a string, not {type(model).__name__}",
            param="model",
            code="invalid_type",
        )
    return data


def skipped_note(field: str) -> bytes:
    """``X-Compaction-Skipped``: why the request went upstream uncompacted."""
    return (
        f"{field}: the upstream holds this conversation's history, which the proxy cannot see; "
        "forwarded unchanged"
    ).encode()
