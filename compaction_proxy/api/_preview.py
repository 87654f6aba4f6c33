"""POST /v1/compaction/preview: what the proxy would forward, and why; nothing goes upstream.

It takes a chat-completions body exactly as the client would send it, so a user can paste a
failing request and see the compacted messages and the report. A Responses body (``input``, no
``messages``) is previewed the same way: its items are compacted on the same core
(compaction_proxy/wire/responses/) and the answer shows the ``input`` that would be forwarded.
`X-Compaction: force` runs the pipeline as if every trigger fired; `off` shows the request
untouched.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from compaction_proxy.checkpoints import StoreBudget
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.validation import nesting_issue
from compaction_proxy.http import (
    ProxyError,
    Receive,
    Scope,
    Send,
    bad_request,
    read_body,
    send_bytes,
)
from compaction_proxy.wire import parse_chat_body, parse_json_object, validate_chat
from compaction_proxy.wire.responses import (
    Lifted,
    is_responses_body,
    lift,
    lower,
    server_state,
    validate_request,
)

from ._context import RequestContext
from ._limits import compacted_model, size_limits
from ._requests import (
    authorization,
    compaction_mode,
    credential,
    effective_window,
    preview_spending,
    report_headers,
    tenant,
)

log = logging.getLogger("compaction_proxy.preview")

MAX_NESTING = 128
"""How deeply any top-level value of a previewed body may nest. The preview serializes the
request (echoed in its answer, and re-serialized by the compaction flow) with orjson, which
refuses past 254 levels: without this bound a hostile body 300 arrays deep in an unknown field
or a tool schema got a bare 500 instead of a 400. The chat route needs no such bound: there a
failed compaction forwards the client's bytes untouched."""


async def preview(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["method"] != "POST":
        raise ProxyError(405, "use POST with a chat-completions body", code="method_not_allowed")
    raw = await read_body(scope, receive, ctx.state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    # The compacting routes' size limits, a large body checked off the event loop (so a
    # hostile one is refused without being built here; compaction_proxy/engine/_offload.py).
    await ctx.state.compactor.offload.parse(
        raw,
        parse_json_object,
        params=("messages", "input"),
        limits=size_limits(ctx.state, scope),
        applies=compacted_model(ctx.state),
    )
    body = responses_body(raw)
    lifted = None if body is None else lift_for_preview(body)
    data = parse_chat_body(raw) if body is None else _chat_view(body, lifted)
    ctx.model = data["model"]
    mode = compaction_mode(scope)
    # `messages` is checked by validate_chat (more strictly, naming the message) when it runs.
    check_nesting(data, skip="messages")
    if body is not None:
        check_nesting(body, skip="input")  # echoed in the answer (`input` was validated)
    if mode is None or not data["messages"]:
        check_nesting(data if body is None else body)
        payload = {"changed": False, "request": data if body is None else body, "report": None}
        held_by = None if body is None else server_state(body)
        if held_by is not None:
            payload["skipped"] = f"{held_by}: server-side history the proxy cannot see"
        ctx.status = 200
        await send_bytes(send, 200, orjson.dumps(payload), ctx.response_headers)
        return
    validate_chat(data)
    # Dry-run and normal compute the same thing here: nothing is forwarded either way, and
    # nothing is stored (a preview must not change what the next real request finds).
    run_mode = Mode.FORCE if mode is Mode.FORCE else Mode.NORMAL
    upstream = ctx.state.router.for_model(data["model"])
    # The answer carries the summary: an operator's key pays for it only for a caller
    # authenticated by server.api_keys (compaction_proxy/http/_admission.py).
    spend = preview_spending(ctx)
    try:
        with StoreBudget(ctx.state.settings.store.request_budget):
            window = await effective_window(ctx, scope, upstream, data["model"], spend)
            flow = await ctx.state.flow.run(
                data,
                run_mode,
                size_hint=len(raw),
                credential=credential(scope),
                authorization=None if ctx.authenticated else authorization(scope),
                upstream_name=upstream.name,
                persist=False,
                context_window=window.tokens,
                window_source=window.source,
                # `dry-run-local`: what compaction would do without calling the summarizer.
                summarize=mode is not Mode.DRY_RUN_LOCAL,
                summary_prefix=body is None,  # as the Responses route: the transcript form
                tenant=tenant(scope),
                spend=spend,
            )
    except Exception as exc:  # the preview has no original to fall back on: say what broke
        log.exception("preview: compaction failed")
        raise ProxyError(
            500, f"compaction failed: {type(exc).__name__}", "server_error", "compaction_failed"
        ) from None
    result = flow.result
    ctx.report = result.report
    ctx.checkpoint = flow.checkpoint
    warnings = list(flow.warnings)
    if body is None or lifted is None:
        request = orjson.loads(flow.body) if flow.body is not None else data
    elif flow.body is None:
        request = body
    else:
        try:
            lowered = lower(lifted, result.messages)
        except Exception:
            log.exception("preview: mapping the compacted input back failed")
            raise ProxyError(
                500, "compaction failed: LowerError", "server_error", "compaction_failed"
            ) from None
        request = {**body, "input": lowered.items}
        warnings.extend(lowered.notes)
    payload = {
        "changed": flow.body is not None,
        "checkpoint": flow.checkpoint,
        "request": request,
        "report": result.report.to_dict(),
        "warnings": warnings,
    }
    headers = [
        *ctx.response_headers,
        *report_headers(result, run_mode),
        (b"x-compaction-checkpoint", flow.checkpoint.encode()),
    ]
    ctx.status = 200
    await send_bytes(send, 200, orjson.dumps(payload), headers)


def check_nesting(data: dict[str, object], skip: str | None = None) -> None:
    """A 400 naming the first top-level key (but `skip`) whose value nests past
    :data:`MAX_NESTING`: orjson cannot write it back, so the preview could not show it."""
    for key, value in data.items():
        if key == skip:
            continue
        issue = nesting_issue(value, key, limit=MAX_NESTING)
        if issue is not None:
            raise bad_request(
                f"{issue.message}; the preview cannot show or compact it",
                param=key,
                code="invalid_value",
            )


def responses_body(raw: bytes) -> dict[str, Any] | None:
    """The body when it is a Responses request (``input`` and no ``messages``), else None
    (a chat body, or one the chat parser then refuses with its own 400)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and is_responses_body(data) else None


def lift_for_preview(body: dict[str, Any]) -> Lifted | None:
    """The chat-shaped view of a Responses body, or None when there is nothing the proxy
    could compact (server-side history); a 400 for what the route would refuse too."""
    if not isinstance(body.get("model"), str):
        raise bad_request(
            "'model' is required and must be a string",
            param="model",
            code="missing_required_parameter",
        )
    if server_state(body) is not None:
        return None
    issue = validate_request(body)
    if issue is not None:
        raise bad_request(issue.message, param=issue.param, code="invalid_input")
    return lift(body)


def _chat_view(body: dict[str, Any], lifted: Lifted | None) -> dict[str, Any]:
    """What the chat path of the preview reads: model, messages (none: nothing to do)."""
    if lifted is None:
        return {"model": body["model"], "messages": []}
    return lifted.chat_body(body)
