"""The compacted routes' shared path: compaction attempts, and forwarding with compact-and-retry.

Every wire format (compaction_proxy/wire/registry.py) compacts the same way (its view shows
the core chat-shaped messages) and recovers from an overflow refusal the same way, so the
attempt machinery and the forward loop live here once; the route (api/_compacted.py) parses
and lifts the body with its format, then calls :func:`compact` and :func:`send_with_retries`.
What differs between formats is asked of the :class:`Subject`'s format and view: how an attempt
made on the chat-shaped view becomes the body forwarded (:meth:`View.lower`), and whether the
summarizer may reuse the view as a cache-aligned prefix. "Windows and compact-and-retry" in
compaction_proxy/upstream/README.md has the rules.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compaction_proxy.compaction import CompactionResult, Mode, OutputLimit
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.engine import FlowRequest, Known
from compaction_proxy.summarizer import SummaryCalls
from compaction_proxy.upstream import (
    MIN_LEARNED_WINDOW,
    REFUSAL_STATUSES,
    SHRINK,
    Outcome,
    Overflow,
    ReplyHandling,
    Window,
    detect_overflow,
    post_upstream,
    send_held,
    window_after_refusal,
)
from compaction_proxy.wire import (
    ClientBody,
    ContextEdits,
    UpstreamTraits,
    View,
    WireFormat,
    lowered_limits,
)
from compaction_proxy.wire.recall import RecallWire

from ._context import RequestContext
from ._outcome import RouteOutcome, relayed
from ._recall import OK_STATUSES, RECALL_HOLD, Forwarded, RecallOffer, offer_for, recalled
from ._requests import (
    caller_key,
    credential,
    header_safe,
    native_request,
    report_headers,
    spending,
    tenant,
)

log = logging.getLogger("compaction_proxy.attempts")

MAX_RETRIES = 2
NOT_NATIVE = UpstreamTraits()
_FAILED = (b"x-compaction-warning", b"compaction failed; the original request was forwarded")


def lowered(attempt: Attempt) -> Attempt:
    """``attempt`` (made on the chat-shaped view) with the body to forward: the client's bytes
    with the compacted elements in place of theirs at the format's member
    (compaction_proxy/wire/_forwarded.py), and each of the format's output limits the budget
    lowered (:func:`output_limits`); every other field, and every element the proxy did not
    change, goes upstream as the client wrote it. Unchanged requests and dry runs keep the
    client's bytes."""
    if attempt.result is None:
        return attempt
    subject = attempt.subject
    limits: dict[str, Any] = {**output_limits(attempt), **attempt.offered}
    if attempt.messages is None:
        if not limits:
            return attempt
        return replace(attempt, body=subject.client.with_members(limits))
    recall = None if attempt.recall is None else attempt.recall.wire
    body, notes, listed = compacted_body(subject, attempt.messages, limits, recall)
    return replace(attempt, body=body, headers=(*attempt.headers, *notes), listed=listed)


def compacted_body(
    subject: Subject,
    messages: Sequence[Mapping[str, Any]],
    members: Mapping[str, Any],
    recall: RecallWire | None = None,
) -> tuple[bytes, tuple[tuple[bytes, bytes], ...], tuple[tuple[str, str], ...]]:
    """The client's bytes with ``messages`` lowered in place of its elements and ``members``
    written, amended for ``subject.upstream`` (:meth:`WireFormat.amend`: Messages'
    ``block_binding`` for Anthropic's API; ``recall``: the request is offered the recall tool,
    whose side amends it instead); with the warnings the lowering and the amendment state,
    and the header values the amendment lists."""
    out = subject.view.lower(messages)
    amend = subject.wire.amend if recall is None else recall.amend
    amendment = amend(subject.client.data, out.items, subject.upstream)
    written: dict[str, Any] = dict(members)
    said = out.notes
    listed: tuple[tuple[str, str], ...] = ()
    if amendment is not None:
        written.update(amendment.members)
        said = (*said, *amendment.notes)
        listed = amendment.listed
    notes = tuple((b"x-compaction-warning", header_safe(n)) for n in said)
    body = subject.client.with_elements(out.items, copies=out.copies, members=written)
    return body, notes, listed


def output_limits(attempt: Attempt) -> dict[str, int]:
    """The output-limit members to write into the forwarded body: those of the format's
    ``output_limits`` the client set above the limit the report lowered it to (none for a dry
    run, which forwards the client's bytes, or when nothing was lowered)."""
    result, subject = attempt.result, attempt.subject
    if result is None or subject.mode not in (Mode.NORMAL, Mode.FORCE):
        return {}
    return lowered_limits(
        subject.client.data, subject.wire.output_limits, result.report.output_limit
    )


@dataclass(frozen=True, slots=True)
class Subject:
    """What every attempt at one request is compacted from, so a retry can be made without
    the route's help.

    ``client``: the client's body: its bytes (``raw``, forwarded whenever compaction changes
    nothing or fails), its parsed form and the member an attempt rewrites (``messages``,
    ``input``), scanned once for every attempt (compaction_proxy/wire/_forwarded.py).
    ``view``: the body lifted by its ``wire`` format; the core works on ``view.chat``.
    ``edits``: the request's context edits the proxy applies for its upstream
    (compaction_proxy/api/_context_edits.py); ``client`` is then the body without them.
    ``upstream``: what the format may need to know of the upstream (:func:`traits`).
    ``known``: what the body shares with its conversation's previous request
    (compaction_proxy/engine/_known.py).
    """

    client: ClientBody
    view: View
    mode: Mode
    wire: WireFormat
    edits: ContextEdits | None = None
    upstream: UpstreamTraits = NOT_NATIVE
    known: Known | None = None

    @property
    def raw(self) -> bytes:
        return self.client.raw

    @property
    def data(self) -> dict[str, Any]:
        return self.view.chat


@dataclass(frozen=True, slots=True)
class Attempt:
    """One compaction of the request: what to forward and what it was budgeted for."""

    subject: Subject
    body: bytes
    save: Callable[[], Awaitable[str | None]] | None
    result: CompactionResult | None  # None: compaction failed, the original is forwarded
    window: Window | None
    checkpoint: str = "none"
    headers: tuple[tuple[bytes, bytes], ...] = ()  # to the client
    # The messages the compaction made, to forward in place of the client's (None: unchanged).
    messages: Sequence[Mapping[str, Any]] | None = None
    # Values appended to comma-separated request headers for the upstream (WireFormat.amend).
    listed: tuple[tuple[str, str], ...] = ()
    # The recall tool offered (api/_recall.py), and the body members that declare it.
    recall: RecallOffer | None = None
    offered: Mapping[str, Any] = field(default_factory=dict)

    def reported(self, before: Attempt | None) -> Attempt | None:
        """The attempt the request reports once this one is sent: this one, unless its
        compaction failed (then the one reported before stays)."""
        return self if self.result is not None else before

    @property
    def hold(self) -> frozenset[int] | None:
        """The statuses whose reply is read whole before the client sees it: an overflow
        refusal of a retriable attempt, and a 2xx when the recall tool was offered (the loop
        reads it, api/_recall.py)."""
        hold = REFUSAL_STATUSES if self.retriable else None
        if self.recall is not None:
            hold = (hold or frozenset()) | OK_STATUSES
        return hold

    @property
    def retriable(self) -> bool:
        """An overflow refusal can be compacted away only when this request was compacted for
        real (not a dry run) and the compaction itself worked."""
        return (
            self.result is not None
            and self.window is not None
            and self.subject.mode in (Mode.NORMAL, Mode.FORCE)
        )


def traits(upstream: UpstreamSettings) -> UpstreamTraits:
    """What a format may need to know of ``upstream``: whether it is the API's own server
    (``UpstreamSettings.native_api``)."""
    return UpstreamTraits(native=upstream.native_api)


def failed(subject: Subject, window: Window | None) -> Attempt:
    """The attempt that forwards the client's own bytes, with a warning saying why.

    A failure inside compaction must never fail a request that would have succeeded without
    the proxy, so every failure ends here rather than in an error reply.
    """
    return Attempt(
        subject, subject.raw, None, None, window, headers=(_FAILED, *edit_notes(subject, None))
    )


def edit_notes(subject: Subject, result: CompactionResult | None) -> list[tuple[bytes, bytes]]:
    """``X-Compaction-Warning`` on a request whose context edits the proxy applied (or
    stripped without applying: ``result`` None, or a dry run, which forwards the client's
    request without them)."""
    edits = subject.edits
    if edits is None:
        return []
    applied = result is not None and subject.mode in (Mode.NORMAL, Mode.FORCE)
    notes = edits.notes(result.report if applied and result is not None else None)
    return [(b"x-compaction-warning", header_safe(note)) for note in notes]


async def compact(ctx: RequestContext, subject: Subject, window: Window | None) -> Attempt:
    """The attempt to forward. Unchanged requests (and dry runs) forward the client's bytes;
    a failure is logged and forwards them too (:func:`failed`)."""
    # The summarizer's calls are noted on the request (one log for all its attempts), and
    # telemetry reconciles them with the report when the request ends.
    calls = ctx.summarizer_calls
    if calls is None:
        calls = ctx.summarizer_calls = SummaryCalls()
    mode = subject.mode
    started, scope = time.perf_counter(), ctx.scope
    try:
        flow = await ctx.state.flow.run(
            FlowRequest(
                subject.data,
                mode,
                size_hint=len(subject.raw),
                credential=credential(ctx),
                caller_key=None if ctx.authenticated else caller_key(scope, subject.wire.auth),
                upstream_name=ctx.upstream or "",
                # A forced compaction is a one-off: it must not become the sticky prefix.
                persist=mode is Mode.NORMAL,
                context_window=None if window is None else window.tokens,
                window_source=None if window is None else window.source,
                calls=calls,
                wire=subject.wire,
                tenant=tenant(scope),
                spend=spending(ctx, subject.wire.auth),
                native=native_request(
                    scope,
                    subject.wire,
                    subject.client.data,
                    subject.view,
                    subject.upstream.native,
                ),
                edits=subject.edits,
                known=subject.known,
            )
        )
    except Exception:
        log.exception("compaction failed; forwarding the original request")
        return failed(subject, window)
    finally:
        ctx.compaction_seconds = (ctx.compaction_seconds or 0.0) + (time.perf_counter() - started)
    headers = report_headers(flow.result, mode)
    headers.append((b"x-compaction-checkpoint", flow.checkpoint.encode()))
    if ctx.state.flow.preparer.enabled:
        headers.append((b"x-compaction-prepared", flow.prepared.encode()))
    for warning in flow.warnings:
        headers.append((b"x-compaction-warning", header_safe(warning)))
    headers.extend(edit_notes(subject, flow.result))
    archived = flow.result.archived
    ctx.archived = len(archived.originals) if archived else 0
    offer: RecallOffer | None = None
    offered: dict[str, Any] = {}
    # Not for a forced run: it stores nothing, so what it archives could not be recalled.
    if mode is Mode.NORMAL and flow.messages is not None:
        model: str = subject.data["model"]
        recall = ctx.state.compactor.settings_for(model)[0].recall
        offer, offered = offer_for(subject.wire, subject.client.data, flow.recall, recall)
    made = Attempt(
        subject,
        subject.raw,
        flow.save,
        flow.result,
        window,
        flow.checkpoint,
        tuple(headers),
        flow.messages,
        recall=offer,
        offered=offered,
    )
    try:
        return lowered(made)
    except Exception:
        log.exception("writing the compacted request failed; forwarding the original request")
        return failed(subject, window)


async def send_with_retries(
    ctx: RequestContext,
    upstream: UpstreamSettings,
    raw: bytes,
    attempt: Attempt | None,
    wire: WireFormat,
) -> RouteOutcome:
    """Forward ``attempt`` (None: the client's ``raw`` bytes) and relay the reply; ``wire``
    says how the upstream is authenticated, its usage read and its refusals recognised.

    When the upstream refuses a compacted request as too long, before anything reached the
    client, the window is learned, the request compacted again for it and resent, at most
    :data:`MAX_RETRIES` times; the client then sees only the answer to the last one, with
    ``X-Compaction-Retry`` and the headers of the attempt that produced it.
    """
    base = ctx.response_headers  # the request's own (its id, X-Compaction-Skipped)
    headers = base
    reported: Attempt | None = None  # the attempt the request reports (its report, checkpoint)
    if attempt is not None:
        reported = attempt.reported(None)
        headers = [*base, *attempt.headers]
    retries = 0
    while True:
        hold = None if attempt is None else attempt.hold
        offer = None if attempt is None else attempt.recall
        body = raw if attempt is None else attempt.body
        save = None if attempt is None else attempt.save
        handling = ReplyHandling(
            wire,
            headers,
            usage=wire if reported is not None else None,
            on_accepted=None if save is None else saver(save),
            hold=hold,
            hold_limit=RECALL_HOLD if offer is not None else None,
        )
        listed = () if attempt is None else attempt.listed
        outcome = await post_upstream(ctx, upstream, body, handling, listed=listed)
        held = outcome.held
        if held is not None and offer is not None and held.status in OK_STATUSES:
            assert attempt is not None
            if save is not None:
                # Accepted: what the relay does before its first byte.
                headers = [*headers, *await saver(save)()]
            forwarded = Forwarded(offer, body, tuple(headers), attempt.listed, attempt.window)
            delivered = await recalled(ctx, upstream, wire, forwarded, outcome)
            return _answered(delivered, reported, retries, "fixed" if retries else None)
        if held is None:
            overflow_outcome = None
            if retries:
                overflow_outcome = "fixed" if 200 <= outcome.status < 300 else "refused_again"
            return _answered(outcome, reported, retries, overflow_outcome)
        overflow = detect_overflow(held.status, held.body, held.content_encoding, wire.refusals)
        retry = None
        if overflow is not None:
            assert attempt is not None  # only a compacted request's refusals are held
            retry = await after_refusal(ctx, attempt, overflow, retries)
        if retry is None:
            # Nothing more to try: the client gets the (last) refusal exactly as it came.
            sent = await send_held(ctx.send, held, headers)
            delivered = replace(outcome, bytes_out=sent, held=None, completed=True)
            return _answered(delivered, reported, retries, _refused_outcome(retries, overflow))
        assert overflow is not None
        retries += 1
        attempt = retry
        reported = retry.reported(reported)
        # The headers of the attempt that produced the answer, never a refused one's.
        headers = [*base, *retry.headers, *retried_headers(retries, overflow)]


def _answered(
    sent: Outcome, reported: Attempt | None, retries: int, overflow: str | None
) -> RouteOutcome:
    if reported is None:
        return relayed(sent, retries=retries, overflow=overflow)
    report = None if reported.result is None else reported.result.report
    return relayed(sent, report, reported.checkpoint, retries, overflow)


def _refused_outcome(retries: int, overflow: Overflow | None) -> str | None:
    """The overflow outcome when a refusal reaches the client."""
    if retries:
        return "refused_again"
    return "passed_through" if overflow is not None else None


def retried_headers(retries: int, overflow: Overflow) -> list[tuple[bytes, bytes]]:
    """What a retried request's answer says about the retry."""
    return [
        (b"x-compaction-retry", str(retries).encode()),
        (b"x-compaction-warning", header_safe(retry_note(overflow))),
    ]


async def after_refusal(
    ctx: RequestContext,
    refused: Attempt,
    overflow: Overflow,
    retries: int,
) -> Attempt | None:
    """Learn from an overflow refusal; the compacted retry, or None when there is none.

    The window learned is kept (compaction_proxy/upstream/_windows.py) even when no retry follows.
    The retry is compacted for `min(learned, the window the refused attempt used)`, or 80 % of the
    latter when the upstream states a window no smaller than ours (our count was off, not the
    window), and is sent only when it came out smaller than what was refused: a smaller prompt,
    or an output limit lowered further for the smaller window.
    """
    state = ctx.state
    compactor = state.compactor
    data = refused.subject.data
    model: str = data["model"]
    assert refused.result is not None and refused.window is not None
    sent = refused.result.report.tokens_after
    if (
        overflow.window is not None
        and overflow.prompt_tokens is not None
        and not overflow.prompt_is_floor
    ):
        # The upstream's own count of what we sent: tiktoken miscounts other vendors' models.
        # Not when the count is a floor (newer vLLM stops counting past the window).
        compactor.calibrate(model, overflow.prompt_tokens, sent)
    used = refused.window.tokens
    # The output the refused request asked for: the limit forwarded (lowered to fit, or as
    # the client asked), else what the budget reserved.
    limit = refused.result.report.output_limit
    learned = window_after_refusal(
        overflow,
        sent_tokens=compactor.calibration_for(model).apply(sent),
        output_reserve=(
            compactor.output_reserve(data, used)
            if limit is None
            else min(_forwarded_output(refused, limit), used)
        ),
        requested_output=(
            _requested_output(data) if limit is None else _forwarded_output(refused, limit)
        ),
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
    option = refused.window.option  # the header-chosen window it refused, if any
    if overflow.window is not None or learned < used:
        await state.windows.learn(ctx.upstream or "", model, learned, option)
    if retries >= MAX_RETRIES:
        return None
    if overflow.window is not None and learned >= used:
        target = math.floor(SHRINK * used)
    else:
        target = min(learned, used)
    if target < MIN_LEARNED_WINDOW:
        return None
    retry = await compact(ctx, refused.subject, Window(target, "learned", option))
    if retry.result is None:
        return None
    # A smaller prompt, or the same prompt with a lower output limit (the refusal of a prompt
    # plus a limit over the window is fixed by the limit alone); nothing smaller to offer: the
    # upstream would refuse it again.
    if retry.result.report.tokens_after >= sent and not _less_output(retry, refused):
        return None
    return retry


def _forwarded_output(attempt: Attempt, limit: OutputLimit) -> int:
    """The output limit ``attempt`` went upstream with: the lowered one when it was written
    into the body, else the one asked."""
    return limit.forwarded if output_limits(attempt) else limit.asked


def _less_output(retry: Attempt, refused: Attempt) -> bool:
    """Whether ``retry`` goes upstream with a lower output limit than ``refused`` did."""
    assert retry.result is not None and refused.result is not None
    was, now = refused.result.report.output_limit, retry.result.report.output_limit
    if was is None or now is None:
        return False
    return _forwarded_output(retry, now) < _forwarded_output(refused, was)


def _requested_output(data: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def retry_note(overflow: Overflow) -> str:
    """``X-Compaction-Warning`` on a retried request: what the upstream refused."""
    refused = (
        f"{overflow.prompt_tokens} tokens"
        if overflow.prompt_tokens is not None
        else "the request as too long"
    )
    window = f" (window {overflow.window})" if overflow.window is not None else ""
    return f"upstream refused {refused}{window}; compacted to fit and retried"


def saver(
    save: Callable[[], Awaitable[str | None]],
) -> Callable[[], Awaitable[list[tuple[bytes, bytes]]]]:
    """Store the checkpoint once the upstream accepted the compacted request (a refused one
    must not become the sticky prefix); a store failure only costs the checkpoint, and the
    response says so (``X-Compaction-Warning``). The log says it once, when the store starts
    failing and when it recovers (the flow's degraded paths, compaction_proxy/engine/_degraded.py),
    never per request."""

    async def on_accepted() -> list[tuple[bytes, bytes]]:
        error = await save()
        return [(b"x-compaction-warning", header_safe(error))] if error else []

    return on_accepted
