"""POST /v1/chat/completions: validate, compact, forward, stream back."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from proxy.api.forward import Outcome, forward
from proxy.api.passthrough import upstream_url
from proxy.asgi import Receive, Scope, Send, header, read_body
from proxy.compaction import CompactionResult, Mode, validate_messages
from proxy.context import RequestContext
from proxy.errors import bad_request
from proxy.metrics import last_user_text, summarizer_calls
from proxy.upstream import upstream_headers

log = logging.getLogger("compaction_proxy.chat")

_MODES = {b"off": None, b"dry-run": Mode.DRY_RUN, b"force": Mode.FORCE, b"on": Mode.NORMAL}


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says exactly what is wrong with it."""
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
    if "messages" not in data:
        raise bad_request(
            "'messages' is required", param="messages", code="missing_required_parameter"
        )
    if not isinstance(data["messages"], list):
        raise bad_request(
            f"'messages' must be an array, not {type(data['messages']).__name__}",
            param="messages",
            code="invalid_type",
        )
    model = data.get("model")
    if not isinstance(model, str):
        raise bad_request(
            "'model' is required and must be a string"
            if model is None
            else f"'model' must be a string, not {type(model).__name__}",
            param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    return data


def compaction_mode(scope: Scope) -> Mode | None:
    """The `X-Compaction` header: off | dry-run | force (absent: normal). None means off."""
    raw = header(scope, b"x-compaction")
    if raw is None:
        return Mode.NORMAL
    value = raw.strip().lower()
    if value not in _MODES:
        raise bad_request(
            f"X-Compaction must be one of off, dry-run, force (got {raw.decode('latin-1')!r})",
            param="X-Compaction",
            code="invalid_header",
        )
    return _MODES[value]


def validate_chat(data: dict[str, Any]) -> None:
    issue = validate_messages(data["messages"])
    if issue is not None:
        raise bad_request(issue.message, param=issue.param, code="invalid_messages")


def report_headers(result: CompactionResult, mode: Mode) -> list[tuple[bytes, bytes]]:
    report = result.report
    strategies = ",".join(report.changed_by) or "none"
    headers = [
        (b"x-compaction-tokens-before", str(report.tokens_before).encode()),
        (b"x-compaction-tokens-after", str(report.tokens_after).encode()),
        (b"x-compaction-strategies", strategies.encode()),
    ]
    if mode is Mode.DRY_RUN:
        headers.append((b"x-compaction-dry-run", b"true"))
    for warning in report.warnings:
        headers.append((b"x-compaction-warning", _header_safe(warning)))
    return headers


def _header_safe(text: str) -> bytes:
    cleaned = " ".join(text.split())
    return cleaned[:500].encode("ascii", "replace")


async def chat_completions(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send
) -> Outcome:
    state = ctx.state
    raw = await read_body(scope, receive, state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    data = parse_chat_body(raw)
    model: str = data["model"]
    ctx.model = model
    mode = compaction_mode(scope)
    upstream = state.router.for_model(model)
    ctx.upstream = upstream.name
    if state.settings.dashboard.show_content:
        ctx.content = last_user_text(data["messages"])
    body = raw
    save = None
    # An empty list has nothing to compact; the upstream gives its own verdict on it.
    if mode is not None and data["messages"] and state.compactor.enabled_for(model):
        validate_chat(data)
        body, save = await _compact(ctx, scope, data, raw, mode)
    return await forward(
        state.upstream,
        upstream,
        scope,
        receive,
        send,
        method="POST",
        url=upstream_url(upstream, scope),
        headers=upstream_headers(scope["headers"], upstream, strip_authorization=ctx.authenticated),
        content=body,
        extra_headers=ctx.response_headers,
        read_usage=ctx.report is not None,
        on_accepted=None if save is None else _saver(save),
    )


def _saver(save: Callable[[], Awaitable[str | None]]) -> Callable[[], Awaitable[None]]:
    """Store the checkpoint once the upstream accepted the compacted request (a refused one
    must not become the sticky prefix); a store failure only costs the checkpoint."""

    async def on_accepted() -> None:
        error = await save()
        if error:
            log.warning("%s", error)

    return on_accepted


async def _compact(
    ctx: RequestContext, scope: Scope, data: dict[str, Any], raw: bytes, mode: Mode
) -> tuple[bytes, Callable[[], Awaitable[str | None]] | None]:
    """The bytes to forward. Unchanged requests (and dry runs) forward the client's bytes.

    A failure inside compaction must never fail a request that would have succeeded without
    the proxy: it is logged, reported in a warning header, and the original goes upstream.
    """
    # The summarizer's calls during this flow are noted on the request (proxy/metrics.py).
    calls = ctx.summarizer_calls = []
    token = summarizer_calls.set(calls)
    started = time.perf_counter()
    try:
        flow = await ctx.state.flow.run(
            data,
            mode,
            size_hint=len(raw),
            credential=credential(scope),
            authorization=None if ctx.authenticated else authorization(scope),
            upstream_name=ctx.upstream or "",
            # A forced compaction is a one-off: it must not become the sticky prefix.
            persist=mode is Mode.NORMAL,
        )
    except Exception:
        log.exception("compaction failed; forwarding the original request")
        ctx.response_headers.append(
            (b"x-compaction-warning", b"compaction failed; the original request was forwarded")
        )
        return raw, None
    finally:
        ctx.compaction_seconds = time.perf_counter() - started
        summarizer_calls.reset(token)
    ctx.report = flow.result.report
    ctx.checkpoint = flow.checkpoint
    ctx.response_headers.extend(report_headers(flow.result, mode))
    ctx.response_headers.append((b"x-compaction-checkpoint", flow.checkpoint.encode()))
    for warning in flow.warnings:
        ctx.response_headers.append((b"x-compaction-warning", _header_safe(warning)))
    return (raw if flow.body is None else flow.body), flow.save


def credential(scope: Scope) -> str | None:
    """Who is asking, for the checkpoint namespace: the key the client presented (to the
    proxy or, passed through, to the upstream). Hashed before it is used anywhere."""
    value = header(scope, b"authorization") or header(scope, b"x-api-key")
    return value.decode("latin-1") if value else None


def authorization(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    return value.decode("latin-1") if value else None
