"""POST /v1/compaction/preview: what the proxy would forward, and why; nothing goes upstream.

It takes a chat-completions body exactly as the client would send it, so a user can paste a
failing request and see the compacted messages and the report. `X-Compaction: force` runs the
pipeline as if every trigger fired; `off` shows the request untouched.
"""

from __future__ import annotations

import logging

import orjson

from proxy.api.chat import (
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
from proxy.context import RequestContext
from proxy.errors import ProxyError

log = logging.getLogger("compaction_proxy.preview")


async def preview(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["method"] != "POST":
        raise ProxyError(405, "use POST with a chat-completions body", code="method_not_allowed")
    raw = await read_body(scope, receive, ctx.state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    data = parse_chat_body(raw)
    ctx.model = data["model"]
    mode = compaction_mode(scope)
    if mode is None or not data["messages"]:
        payload = {"changed": False, "request": data, "report": None}
        ctx.status = 200
        await send_bytes(send, 200, orjson.dumps(payload), ctx.response_headers)
        return
    validate_chat(data)
    # Dry-run and normal compute the same thing here: nothing is forwarded either way, and
    # nothing is stored (a preview must not change what the next real request finds).
    run_mode = Mode.FORCE if mode is Mode.FORCE else Mode.NORMAL
    upstream = ctx.state.router.for_model(data["model"])
    window = await effective_window(ctx, scope, upstream, data["model"])
    try:
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
