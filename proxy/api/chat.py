"""POST /v1/chat/completions: validate, compact, forward, stream back."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.api.forward import Outcome, forward, send_held
from proxy.api.requests import (
    authorization,
    compaction_mode,
    credential,
    effective_window,
    header_safe,
    parse_chat_body,
    report_headers,
    validate_chat,
)
from proxy.asgi import Receive, Scope, Send, read_body
from proxy.compaction import CompactionResult, Mode
from proxy.compaction.messages import last_user_text
from proxy.context import RequestContext
from proxy.overflow import Overflow, detect_overflow
from proxy.summaries.stores import StoreBudget
from proxy.summaries.summarizer import SummaryCalls
from proxy.upstream import upstream_headers, upstream_url
from proxy.windows import MIN_LEARNED_WINDOW, SHRINK, Window, window_after_refusal

log = logging.getLogger("compaction_proxy.chat")

# Statuses an overflow refusal comes with (vLLM, llama.cpp, OpenAI: 400; TGI: 422; some
# gateways: 413). Only these replies are held back and read; every other one streams through.
REFUSAL_STATUSES = frozenset({400, 413, 422})
MAX_RETRIES = 2


@dataclass(slots=True)
class _Attempt:
    """One compaction of the request: what to forward and what it was budgeted for."""

    body: bytes
    save: Callable[[], Awaitable[str | None]] | None
    result: CompactionResult | None  # None: compaction failed, the original is forwarded
    window: Window | None
    checkpoint: str = "none"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # to the client

    def adopt(self, ctx: RequestContext) -> None:
        """Make this the attempt the request reports (headers, report, checkpoint)."""
        ctx.response_headers.extend(self.headers)
        if self.result is not None:
            ctx.report = self.result.report
            ctx.checkpoint = self.checkpoint


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
    data = parse_chat_body(raw)
    model: str = data["model"]
    ctx.model = model
    mode = compaction_mode(scope)
    upstream = state.router.for_model(model)
    ctx.upstream = upstream.name
    if state.settings.dashboard.show_content:
        ctx.content = last_user_text(data["messages"])
    attempt: _Attempt | None = None
    mark = len(ctx.response_headers)
    # An empty list has nothing to compact; the upstream gives its own verdict on it.
    if mode is not None and data["messages"] and state.compactor.enabled_for(model):
        validate_chat(data)
        window = await effective_window(ctx, scope, upstream, model)
        attempt = await _compact(ctx, scope, data, raw, mode, window)
        attempt.adopt(ctx)
    # An overflow refusal can be compacted away only when this request was compacted for real
    # (not `X-Compaction: off`, not a dry run) and the compaction itself worked.
    retriable = (
        attempt is not None
        and attempt.result is not None
        and attempt.window is not None
        and mode in (Mode.NORMAL, Mode.FORCE)
    )
    body = raw if attempt is None else attempt.body
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
            content=body,
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
            assert attempt is not None and mode is not None
            retry = await _after_refusal(ctx, scope, data, raw, mode, attempt, overflow, retries)
        if retry is None:
            if retries:
                ctx.overflow_outcome = "refused_again"
            elif overflow is not None:
                ctx.overflow_outcome = "passed_through"
            # Nothing more to try: the client gets the (last) refusal exactly as it came.
            outcome.bytes_out = await send_held(send, held, ctx.response_headers)
            outcome.held = None
            outcome.completed = True
            return outcome
        assert overflow is not None
        retries += 1
        attempt = retry
        body, save = retry.body, retry.save
        del ctx.response_headers[mark:]
        retry.adopt(ctx)
        ctx.response_headers.append((b"x-compaction-retry", str(retries).encode()))
        ctx.response_headers.append((b"x-compaction-warning", header_safe(_retry_note(overflow))))
        ctx.compaction_retries = retries


async def _after_refusal(
    ctx: RequestContext,
    scope: Scope,
    data: dict[str, Any],
    raw: bytes,
    mode: Mode,
    refused: _Attempt,
    overflow: Overflow,
    retries: int,
) -> _Attempt | None:
    """Learn from an overflow refusal; the compacted retry, or None when there is none.

    The window learned is kept (proxy/windows.py) even when no retry follows. The retry is
    compacted for `min(learned, the window the refused attempt used)`, or 80 % of the latter
    when the upstream states a window no smaller than ours (our count was off, not the
    window), and is sent only when it came out smaller than what was refused.
    """
    state = ctx.state
    compactor = state.compactor
    model: str = data["model"]
    assert refused.result is not None and refused.window is not None
    sent = refused.result.report.tokens_after
    if (
        overflow.window is not None
        and overflow.prompt_tokens is not None
        and "at least" not in overflow.message.lower()
    ):
        # The upstream's own count of what we sent: tiktoken miscounts other vendors' models.
        # Not when the count is a floor (newer vLLM stops counting past the window).
        compactor.calibrate(model, overflow.prompt_tokens, sent)
    used = refused.window.tokens
    learned = window_after_refusal(
        overflow,
        sent_tokens=compactor.calibration_for(model).apply(sent),
        output_reserve=compactor.output_reserve(data, used),
        requested_output=_requested_output(data),
    )
    log.warning(
        "upstream %r refused %s tokens for model %r (%s): window %s",
        ctx.upstream,
        overflow.prompt_tokens if overflow.prompt_tokens is not None else "too many",
        model,
        overflow.family,
        learned if learned is not None else "unknown",
    )
    if learned is None:
        return None
    if overflow.window is not None or learned < used:
        await state.windows.learn(ctx.upstream or "", model, learned)
    if retries >= MAX_RETRIES:
        return None
    if overflow.window is not None and learned >= used:
        target = math.floor(SHRINK * used)
    else:
        target = min(learned, used)
    if target < MIN_LEARNED_WINDOW:
        return None
    retry = await _compact(ctx, scope, data, raw, mode, Window(target, "learned"))
    if retry.result is None or retry.result.report.tokens_after >= sent:
        return None  # nothing smaller to offer: the upstream would refuse it again
    return retry


def _requested_output(data: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _retry_note(overflow: Overflow) -> str:
    refused = (
        f"{overflow.prompt_tokens} tokens"
        if overflow.prompt_tokens is not None
        else "the request as too long"
    )
    window = f" (window {overflow.window})" if overflow.window is not None else ""
    return f"upstream refused {refused}{window}; compacted to fit and retried"


def _saver(save: Callable[[], Awaitable[str | None]]) -> Callable[[], Awaitable[None]]:
    """Store the checkpoint once the upstream accepted the compacted request (a refused one
    must not become the sticky prefix); a store failure only costs the checkpoint."""

    async def on_accepted() -> None:
        error = await save()
        if error:
            log.warning("%s", error)

    return on_accepted


async def _compact(
    ctx: RequestContext,
    scope: Scope,
    data: dict[str, Any],
    raw: bytes,
    mode: Mode,
    window: Window | None,
) -> _Attempt:
    """The bytes to forward. Unchanged requests (and dry runs) forward the client's bytes.

    A failure inside compaction must never fail a request that would have succeeded without
    the proxy: it is logged, reported in a warning header, and the original goes upstream.
    """
    # The summarizer's calls are noted on the request (one log for all its attempts), and
    # telemetry reconciles them with the report when the request ends.
    calls = ctx.summarizer_calls
    if calls is None:
        calls = ctx.summarizer_calls = SummaryCalls()
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
            context_window=None if window is None else window.tokens,
            calls=calls,
        )
    except Exception:
        log.exception("compaction failed; forwarding the original request")
        failed = (b"x-compaction-warning", b"compaction failed; the original request was forwarded")
        return _Attempt(raw, None, None, window, headers=[failed])
    finally:
        ctx.compaction_seconds = (ctx.compaction_seconds or 0.0) + (time.perf_counter() - started)
    headers = report_headers(flow.result, mode)
    headers.append((b"x-compaction-checkpoint", flow.checkpoint.encode()))
    if ctx.state.flow.preparer.enabled:
        headers.append((b"x-compaction-prepared", flow.prepared.encode()))
    for warning in flow.warnings:
        headers.append((b"x-compaction-warning", header_safe(warning)))
    return _Attempt(
        raw if flow.body is None else flow.body,
        flow.save,
        flow.result,
        window,
        flow.checkpoint,
        headers,
    )
