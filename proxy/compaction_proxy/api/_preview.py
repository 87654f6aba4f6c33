"""POST /v1/compaction/preview: what the proxy would forward, and why; nothing goes upstream.

It takes a body exactly as the client would send it to one of the compacted routes, so a user
can paste a failing request and see the compacted request and the report. The body's wire
format (compaction_proxy/wire/registry.py: a Responses body is ``input`` and no ``messages``,
anything else is read as chat completions) lifts it to the core's messages, the same flow
compacts them, and the answer shows the body that would be forwarded, lowered back.
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
from compaction_proxy.engine import FlowRequest, FlowResult
from compaction_proxy.http import (
    ProxyError,
    bad_request,
    read_body,
    send_bytes,
)
from compaction_proxy.wire import (
    ContextEdits,
    View,
    WireFormat,
    format_for_body,
    lowered_limits,
    parse_json_object,
    validate_chat,
)

from ._context import RequestContext
from ._context_edits import context_edits
from ._limits import compacted_model, size_limits
from ._outcome import RouteOutcome
from ._recall import offer_for
from ._requests import (
    caller_key,
    compaction_mode,
    credential,
    effective_window,
    native_request,
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


async def preview(ctx: RequestContext) -> RouteOutcome:
    scope, send = ctx.scope, ctx.send
    if scope["method"] != "POST":
        raise ProxyError(405, "use POST with a chat-completions body", code="method_not_allowed")
    raw = await read_body(scope, ctx.receive, ctx.state.settings.server.max_body_bytes)
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
    wire = _format_of(raw)
    body = wire.parse(raw)
    if not isinstance(body.get("model"), str):  # a format whose route takes a stored prompt
        raise bad_request(
            "'model' is required and must be a string",
            param="model",
            code="missing_required_parameter",
        )
    held_by = wire.held_by(body)
    # Checked below, as the route checks it, only when something is to be compacted.
    view = None if held_by is not None else wire.lift(body, check=False)
    data = view.chat if view is not None else {"model": body["model"], "messages": []}
    ctx.model = data["model"]
    mode = compaction_mode(scope)
    # `messages` is checked by validate_chat (more strictly, naming the message) when it runs.
    check_nesting(data, skip="messages")
    if body is not data:
        check_nesting(body, skip=wire.items)  # echoed in the answer (the items were validated)
    if mode is None or not data["messages"]:
        check_nesting(body)
        payload: dict[str, Any] = {"changed": False, "request": body, "report": None}
        if held_by is not None:
            payload["skipped"] = f"{held_by}: server-side history the proxy cannot see"
        await send_bytes(send, 200, orjson.dumps(payload), ctx.response_headers)
        return RouteOutcome(None, 200)
    assert view is not None
    validate_chat(data)
    return await _compact_and_answer(ctx, wire, body, view, mode, len(raw))


async def _compact_and_answer(
    ctx: RequestContext,
    wire: WireFormat,
    body: dict[str, Any],
    view: View,
    mode: Mode,
    size: int,
) -> RouteOutcome:
    data, scope, send = view.chat, ctx.scope, ctx.send
    # Dry-run and normal compute the same thing here: nothing is forwarded either way, and
    # nothing is stored (a preview must not change what the next real request finds).
    run_mode = Mode.FORCE if mode is Mode.FORCE else Mode.NORMAL
    upstream = ctx.state.router.for_model(data["model"])
    # The answer carries the summary: an operator's key pays for it only for a caller
    # authenticated by server.api_keys (compaction_proxy/http/_admission.py).
    spend = preview_spending(ctx)
    # Edits the routed upstream would not apply: shown as the proxy would apply them.
    edits = context_edits(ctx, upstream, view)
    try:
        with StoreBudget(ctx.state.settings.store.request_budget):
            window = await effective_window(ctx, upstream, data["model"], wire, spend)
            flow = await ctx.state.flow.run(
                FlowRequest(
                    data,
                    run_mode,
                    size_hint=size,
                    credential=credential(ctx),
                    caller_key=None if ctx.authenticated else caller_key(scope, wire.auth),
                    upstream_name=upstream.name,
                    persist=False,
                    context_window=window.tokens,
                    window_source=window.source,
                    # `dry-run-local`: what compaction would do without calling the summarizer.
                    summarize=mode is not Mode.DRY_RUN_LOCAL,
                    wire=wire,
                    tenant=tenant(scope),
                    spend=spend,
                    native=native_request(scope, wire, body, view, upstream.native_api),
                    edits=edits,
                )
            )
    except Exception as exc:  # the preview has no original to fall back on: say what broke
        log.exception("preview: compaction failed")
        raise ProxyError(
            500, f"compaction failed: {type(exc).__name__}", "server_error", "compaction_failed"
        ) from None
    result = flow.result
    warnings = list(flow.warnings)
    # The output limits the budget lowered so the prompt and the answer fit the window.
    limits = lowered_limits(body, wire.output_limits, result.report.output_limit)
    request, notes = _forwarded(ctx, wire, body, view, flow, {**body, **limits}, edits)
    warnings.extend(notes)
    payload = {
        "changed": flow.messages is not None or bool(limits),
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
    await send_bytes(send, 200, orjson.dumps(payload), headers)
    return RouteOutcome(None, 200, result.report, flow.checkpoint)


def _forwarded(
    ctx: RequestContext,
    wire: WireFormat,
    body: dict[str, Any],
    view: View,
    flow: FlowResult,
    request: dict[str, Any],
    edits: ContextEdits | None,
) -> tuple[dict[str, Any], list[str]]:
    """The body that would be forwarded (``request``: the client's, its limits lowered), and
    what lowering and the context edits say of it."""
    warnings: list[str] = []
    if edits is not None:
        request = {k: v for k, v in request.items() if k not in edits.strip}
        warnings.extend(edits.notes(flow.result.report))
    if flow.messages is None:
        return request, warnings
    try:
        lowered = view.lower(flow.messages)
    except Exception:
        log.exception("preview: mapping the compacted request back failed")
        raise ProxyError(
            500, "compaction failed: LowerError", "server_error", "compaction_failed"
        ) from None
    recall = ctx.state.compactor.settings_for(view.chat["model"])[0].recall
    _, offered = offer_for(wire, body, flow.recall, recall)  # the recall tool, when offered
    warnings.extend(lowered.notes)
    return {**request, **offered, wire.items: list(lowered.items)}, warnings


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


def _format_of(raw: bytes) -> WireFormat:
    """The format of a previewed body (the default's, chat completions, when it is not a JSON
    object: its parser then says what is wrong)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    return format_for_body(data if isinstance(data, dict) else {})
