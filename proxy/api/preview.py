"""POST /v1/compaction/preview: what the proxy would forward, and why; nothing goes upstream.

It takes a chat-completions body exactly as the client would send it, so a user can paste a
failing request and see the compacted messages and the report. `X-Compaction: force` runs the
pipeline as if every trigger fired; `off` shows the request untouched.
"""

from __future__ import annotations

import logging

import orjson

from proxy.api.requests import (
    authorization,
    compaction_mode,
    credential,
    effective_window,
    parse_chat_body,
    report_headers,
    validate_chat,
)
from proxy.asgi import Receive, Scope, Send, read_body, send_bytes
from proxy.compaction import Mode
from proxy.compaction.validation import nesting_issue
from proxy.context import RequestContext
from proxy.errors import ProxyError, bad_request
from proxy.summaries.stores import StoreBudget

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
    data = parse_chat_body(raw)
    ctx.model = data["model"]
    mode = compaction_mode(scope)
    # `messages` is checked by validate_chat (more strictly, naming the message) when it runs.
    check_nesting(data, skip="messages")
    if mode is None or not data["messages"]:
        check_nesting(data)
        payload = {"changed": False, "request": data, "report": None}
        ctx.status = 200
        await send_bytes(send, 200, orjson.dumps(payload), ctx.response_headers)
        return
    validate_chat(data)
    # Dry-run and normal compute the same thing here: nothing is forwarded either way, and
    # nothing is stored (a preview must not change what the next real request finds).
    run_mode = Mode.FORCE if mode is Mode.FORCE else Mode.NORMAL
    upstream = ctx.state.router.for_model(data["model"])
    try:
        with StoreBudget(ctx.state.settings.store.request_budget):
            window = await effective_window(ctx, scope, upstream, data["model"])
            flow = await ctx.state.flow.run(
                data,
                run_mode,
                size_hint=len(raw),
                credential=credential(scope),
                authorization=None if ctx.authenticated else authorization(scope),
                upstream_name=upstream.name,
                persist=False,
                context_window=window.tokens,
            )
    except Exception as exc:  # the preview has no original to fall back on: say what broke
        log.exception("preview: compaction failed")
        raise ProxyError(
            500, f"compaction failed: {type(exc).__name__}", "server_error", "compaction_failed"
        ) from None
    result = flow.result
    ctx.report = result.report
    ctx.checkpoint = flow.checkpoint
    request = orjson.loads(flow.body) if flow.body is not None else data
    payload = {
        "changed": flow.body is not None,
        "checkpoint": flow.checkpoint,
        "request": request,
        "report": result.report.to_dict(),
        "warnings": flow.warnings,
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
