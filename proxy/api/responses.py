"""POST /v1/responses: the Responses API compacted in flight, on the chat-completions core.

A stateless Responses agent (``store: false``, the whole ``input`` re-sent every turn) grows
exactly as a chat agent does, so it gets exactly the same compaction: the body's items are
shown to the core as chat messages (proxy/responses/), the chat route's compaction runs on them
(``_compact``: checkpoint lookup, pipeline, summaries, report headers, the checkpoint saved
once the upstream accepts), and the result is mapped back to items. The reply, JSON or typed
SSE events, is relayed byte for byte; an overflow refusal is compacted away and retried as for
chat completions (``_after_refusal``).

What stays untouched: a request that continues server-side state (``previous_response_id``,
``conversation``: the upstream prepends history the proxy cannot see, so it can neither count
nor compact it; ``X-Compaction-Skipped`` says so), ``X-Compaction: off``, and anything a
compaction failure would touch (the original goes upstream, with a warning). ``truncation:
"auto"`` is the upstream's business and goes along as sent.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from proxy.api.chat import REFUSAL_STATUSES, _after_refusal, _Attempt, _compact, _retry_note, _saver
from proxy.api.forward import Outcome, forward, send_held
from proxy.api.requests import compaction_mode, effective_window, header_safe
from proxy.asgi import Receive, Scope, Send, read_body
from proxy.compaction import Mode
from proxy.compaction.messages import last_user_text
from proxy.context import RequestContext
from proxy.errors import bad_request
from proxy.overflow import detect_overflow
from proxy.responses import (
    Lifted,
    input_items,
    lift,
    lower,
    server_state,
    validate_request,
)
from proxy.summaries.stores import StoreBudget
from proxy.upstream import upstream_headers, upstream_url

log = logging.getLogger("compaction_proxy.responses")

_FAILED = (b"x-compaction-warning", b"compaction failed; the original request was forwarded")


async def responses(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> Outcome:
    # One time budget for every store call of the request, as for chat completions.
    with StoreBudget(ctx.state.settings.store.request_budget):
        return await _responses(ctx, scope, receive, send)


async def _responses(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> Outcome:
    state = ctx.state
    raw = await read_body(scope, receive, state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    body = parse_responses_body(raw)
    model = body.get("model")
    ctx.model = model if isinstance(model, str) else None
    mode = compaction_mode(scope)
    upstream = state.router.for_model(ctx.model)
    ctx.upstream = upstream.name
    attempt: _Attempt | None = None
    lifted: Lifted | None = None
    data: dict[str, Any] = {}
    mark = len(ctx.response_headers)
    held_by = server_state(body)
    if held_by is not None:
        ctx.response_headers.append((b"x-compaction-skipped", skipped_note(held_by)))
    elif (
        mode is not None
        and ctx.model is not None
        and input_items(body)
        and state.compactor.enabled_for(ctx.model)
    ):
        issue = validate_request(body)
        if issue is not None:
            raise bad_request(issue.message, param=issue.param, code="invalid_input")
        lifted = lift(body)
        data = lifted.chat_body(body)
        if state.settings.dashboard.show_content:
            ctx.content = last_user_text(lifted.messages)
        window = await effective_window(ctx, scope, upstream, ctx.model)
        attempt = as_responses(
            await _compact(ctx, scope, data, raw, mode, window), lifted, body, raw
        )
        attempt.adopt(ctx)
    retriable = (
        attempt is not None
        and attempt.result is not None
        and attempt.window is not None
        and mode in (Mode.NORMAL, Mode.FORCE)
    )
    body_bytes = raw if attempt is None else attempt.body
    save = None if attempt is None else attempt.save
    retries = 0
    while True:
        outcome = await forward(
            state.transport,
            upstream,
            scope,
            receive,
            send,
            method="POST",
            url=upstream_url(upstream, scope),
            headers=upstream_headers(
                scope["headers"], upstream, strip_authorization=ctx.authenticated
            ),
            content=body_bytes,
            extra_headers=ctx.response_headers,
            read_usage=ctx.report is not None,
            on_accepted=None if save is None else _saver(save),
            hold=REFUSAL_STATUSES if retriable else None,
        )
        held = outcome.held
        if held is None:
            if retries:
                ctx.overflow_outcome = "fixed" if 200 <= outcome.status < 300 else "refused_again"
            return outcome
        overflow = detect_overflow(held.status, held.body, held.content_encoding)
        retry = None
        if overflow is not None:
            assert attempt is not None and lifted is not None and mode is not None
            refused = await _after_refusal(ctx, scope, data, raw, mode, attempt, overflow, retries)
            if refused is not None:
                retry = as_responses(refused, lifted, body, raw)
                if retry.result is None:
                    retry = None  # mapping back failed: nothing smaller to offer
        if retry is None:
            if retries:
                ctx.overflow_outcome = "refused_again"
            elif overflow is not None:
                ctx.overflow_outcome = "passed_through"
            outcome.bytes_out = await send_held(send, held, ctx.response_headers)
            outcome.held = None
            outcome.completed = True
            return outcome
        assert overflow is not None
        retries += 1
        attempt = retry
        body_bytes, save = retry.body, retry.save
        del ctx.response_headers[mark:]
        retry.adopt(ctx)
        ctx.response_headers.append((b"x-compaction-retry", str(retries).encode()))
        ctx.response_headers.append((b"x-compaction-warning", header_safe(_retry_note(overflow))))
        ctx.compaction_retries = retries


def as_responses(attempt: _Attempt, lifted: Lifted, body: dict[str, Any], raw: bytes) -> _Attempt:
    """``attempt`` (made on the chat-shaped view) with a Responses body to forward.

    Unchanged requests and dry runs keep the client's bytes. Otherwise the pipeline's messages
    are mapped back to items and only ``input`` is replaced, every other field going upstream
    as the client sent it. A failure here is a compaction failure: the original is forwarded.
    """
    result = attempt.result
    if result is None or attempt.body is raw:
        return attempt
    try:
        lowered = lower(lifted, result.messages)
        attempt.body = orjson.dumps({**body, "input": lowered.items})
    except Exception:
        log.exception("mapping the compacted input back failed; forwarding the original request")
        return _Attempt(raw, None, None, attempt.window, headers=[_FAILED])
    attempt.headers.extend((b"x-compaction-warning", header_safe(n)) for n in lowered.notes)
    return attempt


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says what is wrong with it.

    ``model`` and ``input`` may be absent (a stored prompt supplies them); the upstream judges
    that. A ``model`` that is not a string is refused here, as chat completions does.
    """
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise bad_request(
            f"the request body must be a JSON object, not {type(data).__name__}",
            code="invalid_json",
        )
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
