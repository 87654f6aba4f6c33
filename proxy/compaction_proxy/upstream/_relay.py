"""Send one request upstream and stream the answer back as it arrives.

Shared by chat completions and the pass-through: both must relay bytes without buffering or
re-encoding, cancel the upstream call when the client goes away, and turn transport failures
into 502/504 in OpenAI's error shape.

A client that goes away after the reply's last byte has not gone away: Codex CLI closes its
connection right after ``response.completed``, while the upstream's transfer has yet to end.
Such a reply was delivered (every byte of its declared length, a stream's final event, a JSON
body that parses whole): it is a 200 in the access log and its usage is read for calibration.
Streams are relayed whole event by whole event (compaction_proxy/upstream/_stream_events.py), which
is also what tells their final event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import (
    InFlight,
    ProxyError,
    Receive,
    Send,
    in_flight,
    retry_after_header,
    send_bytes,
    shutdown_error,
)
from compaction_proxy.wire import WireFormat

from ._failures import classify_error
from ._headers import response_headers
from ._overflow import MAX_ERROR_BODY
from ._stream_events import EventRelay
from ._transport import TRANSPORT_ERRORS, UpstreamReply, UpstreamRequest, UpstreamTransport
from ._usage import UsageFormat, UsageProbe

log = logging.getLogger("compaction_proxy.forward")

_SSE_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]
_JSON_TYPE = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one forwarding did, once it is over; the relay's running tally, frozen."""

    status: int
    bytes_out: int = 0
    completed: bool = False
    client_gone: bool = False
    upstream_request_id: str | None = None
    upstream_seconds: float | None = None  # to the response headers
    prompt_tokens: int | None = None  # the reply's usage.prompt_tokens (when asked to read it)
    cut_by_shutdown: bool = False  # answered 503, or the stream ended with an error event
    held: HeldReply | None = None  # a reply read but not sent (`ReplyHandling.hold`)


@dataclass(slots=True)
class _Tally:
    """:class:`Outcome`'s fields while the reply is relayed: the one mutable copy, private to
    the relay."""

    status: int = 0
    bytes_out: int = 0
    completed: bool = False
    client_gone: bool = False
    upstream_request_id: str | None = None
    upstream_seconds: float | None = None
    prompt_tokens: int | None = None
    cut_by_shutdown: bool = False
    held: HeldReply | None = None

    def frozen(self) -> Outcome:
        return Outcome(
            self.status,
            self.bytes_out,
            self.completed,
            self.client_gone,
            self.upstream_request_id,
            self.upstream_seconds,
            self.prompt_tokens,
            self.cut_by_shutdown,
            self.held,
        )


@dataclass(frozen=True, slots=True)
class HeldReply:
    """An upstream error reply read whole before anything went to the client.

    The caller decides: act on it (compact and retry) or relay it with :func:`send_held`,
    status and body exactly as the upstream sent them.
    """

    status: int
    headers: list[tuple[bytes, bytes]]  # as the client would get them, before extra headers
    body: bytes
    content_encoding: str | None


@dataclass(slots=True)
class StreamedBody:
    """A request body still arriving from the client while it goes upstream.

    `done` tells the disconnect watch when `receive()` is free; `error` keeps what our own
    generator raised (413, client gone), because the transport reports it as a connection
    failure without chaining the original.
    """

    done: asyncio.Event
    error: BaseException | None = None


class _DisconnectWatch:
    """Cancels the forwarding task when the client disconnects.

    One extra task per request instead of a task group: it waits on `receive()` (which, once
    the body is read, only ever yields `http.disconnect`) and cancels its owner.
    """

    def __init__(self, receive: Receive, streamed: StreamedBody | None) -> None:
        self.fired = False
        self._finished = False
        self._owner = asyncio.current_task()
        self._task = asyncio.ensure_future(self._watch(receive, streamed))

    async def _watch(self, receive: Receive, streamed: StreamedBody | None) -> None:
        if streamed is not None:
            await streamed.done.wait()
            if streamed.error is not None:
                return
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        if not self._finished and self._owner is not None:
            self.fired = True
            self._owner.cancel()

    def finish(self) -> None:
        self._finished = True
        self._task.cancel()


@dataclass(frozen=True, slots=True)
class ReplyHandling:
    """How :func:`forward` treats the upstream's reply (the default: relayed as it comes).

    ``wire``: the route's format, whose shape the proxy's own errors take (502/504, a
    shutdown's 503 or stream error event); None (passthrough): OpenAI's.
    ``extra_headers``: sent with the response, after the upstream's.
    ``usage``: note the reply's prompt tokens in the outcome, read the way this format (the
    request's) states them, from the bytes as they are relayed (nothing is held back or
    changed).
    ``on_accepted``: awaited once the upstream answered 2xx, before the response starts; the
    headers it returns go out with the response (a checkpoint the store would not take).
    ``hold``: statuses whose reply is read whole (up to MAX_ERROR_BODY) and returned in
    ``outcome.held`` instead of being sent; a longer body is relayed as usual. Only these
    replies are buffered: every other one streams through as it arrives. ``hold_limit``: the
    bound instead of MAX_ERROR_BODY (the recall loop reads whole replies);
    ``hold_failures``: an upstream that cannot be reached is held too (its 502/504 in
    ``outcome.held``, not sent), for a caller with something better to send.
    """

    wire: WireFormat | None = None
    extra_headers: list[tuple[bytes, bytes]] | None = None
    usage: UsageFormat | None = None
    on_accepted: Callable[[], Awaitable[Sequence[tuple[bytes, bytes]]]] | None = None
    hold: frozenset[int] | None = None
    hold_limit: int | None = None
    hold_failures: bool = False


RELAYED = ReplyHandling()
"""The reply relayed as it comes, the proxy's errors in OpenAI's shape (the passthrough)."""


async def forward(
    transport: UpstreamTransport,
    upstream: UpstreamSettings,
    receive: Receive,
    send: Send,
    request: UpstreamRequest,
    handling: ReplyHandling = RELAYED,
    *,
    streamed: StreamedBody | None = None,
) -> Outcome:
    """Send ``request`` and relay the reply as ``handling`` says. Never raises for transport
    problems: the client gets 502/504. ``streamed``: the request's body is the client's,
    relayed as it streams in (its refusal or loss is the client's, not the upstream's)."""
    relay = _Relay(send, upstream, handling)
    outcome = relay.outcome
    watch = _DisconnectWatch(receive, streamed)
    flight = in_flight.get()
    try:
        reply = await _request(relay, transport, request, streamed)
        if reply is None:
            return outcome.frozen()
        opened = await _open(relay, reply)
        if opened is None:
            return outcome.frozen()  # held (outcome.held) or failed (answered 502/504)
        out_headers, prefix = opened
        await _start(relay, reply, out_headers, flight)
        await _relay_body(relay, prefix)
        return outcome.frozen()
    except asyncio.CancelledError:
        if watch.fired:
            # The client left. Closing the reply (below) drops the upstream connection, which
            # is how the provider learns to stop generating.
            _uncancel()
            return _client_left(relay)
        if flight is None or not flight.cut:
            raise
        _uncancel()
        await _end_for_shutdown(relay, flight)
        return outcome.frozen()
    finally:
        watch.finish()
        if relay.reply is not None:
            await _close_quietly(relay.reply)


@dataclass(slots=True)
class _Relay:
    """One reply's relay: what :func:`forward`'s steps share, and what its cancellation reads
    (whether the response started, how much went out)."""

    send: Send
    upstream: UpstreamSettings
    handling: ReplyHandling
    outcome: _Tally = field(default_factory=_Tally)
    reply: UpstreamReply | None = None
    chunks: AsyncIterator[bytes] | None = None
    events: EventRelay | None = None
    probe: UsageProbe | None = None
    length: int | None = None
    started: bool = False
    relayed_all: bool = False

    @property
    def wire(self) -> WireFormat | None:
        return self.handling.wire

    @property
    def extra_headers(self) -> list[tuple[bytes, bytes]] | None:
        return self.handling.extra_headers


async def _request(
    relay: _Relay,
    transport: UpstreamTransport,
    request: UpstreamRequest,
    streamed: StreamedBody | None,
) -> UpstreamReply | None:
    """The upstream's reply, or None when it could not be reached (answered 502/504)."""
    started = time.perf_counter()
    try:
        reply = await transport.send(request, relay.upstream.timeouts)
    except ProxyError:
        raise
    except TRANSPORT_ERRORS as exc:
        # Our own request-body generator may have refused the body (413) or lost the
        # client; the transport reports that as a connection failure, which it is not.
        if streamed is not None and streamed.error is not None:
            raise streamed.error from None
        await _send_failure(relay, relay.outcome, exc, "request failed")
        return None
    relay.reply = reply
    relay.outcome.upstream_seconds = time.perf_counter() - started
    return reply


async def _open(
    relay: _Relay, reply: UpstreamReply
) -> tuple[list[tuple[bytes, bytes]], bytes] | None:
    """The reply's headers to relay and what was read of a held status's body; None when the
    reply is held whole (``outcome.held``) or broke while being read (answered 502)."""
    outcome = relay.outcome
    hold, limit = relay.handling.hold, relay.handling.hold_limit or MAX_ERROR_BODY
    out_headers = response_headers(reply.raw_headers)
    content_type = reply.header("content-type") or ""
    if content_type.startswith("text/event-stream"):
        out_headers = [h for h in out_headers if h[0] != b"cache-control"]
        out_headers.extend(_SSE_HEADERS)
    outcome.status = reply.status
    outcome.upstream_request_id = reply.header("x-request-id")
    chunks = relay.chunks = reply.chunks()
    prefix = b""
    if hold is not None and reply.status in hold and _small(reply.header("content-length"), limit):
        try:
            prefix, complete = await _read_bounded(chunks, limit)
        except TRANSPORT_ERRORS as exc:
            await _send_failure(relay, outcome, exc, "error reply broke")
            return None
        if complete:
            outcome.held = HeldReply(
                reply.status, out_headers, prefix, reply.header("content-encoding")
            )
            return None
    return out_headers, prefix


async def _start(
    relay: _Relay,
    reply: UpstreamReply,
    out_headers: list[tuple[bytes, bytes]],
    flight: InFlight | None,
) -> None:
    """The response's start, once what must precede the client's first byte is done."""
    on_accepted, usage = relay.handling.on_accepted, relay.handling.usage
    if relay.extra_headers:
        out_headers = [*out_headers, *relay.extra_headers]
    if on_accepted is not None and 200 <= reply.status < 300:
        # Before the client sees a byte: its next request must find what this one left.
        said = await on_accepted()
        if said:
            out_headers = [*out_headers, *said]
    content_type = reply.header("content-type") or ""
    sse = content_type.startswith("text/event-stream")
    if sse and not reply.header("content-encoding"):
        # Whole events only, so a stream the proxy must end ends cleanly (stream_events.py).
        relay.events = EventRelay()
    await relay.send(
        {"type": "http.response.start", "status": reply.status, "headers": out_headers}
    )
    relay.started = True
    if flight is not None and not sse:
        flight.relaying_body = True  # nearly done: a shutdown's cut lets it finish
    relay.length = _length(reply.header("content-length"))
    if usage is not None and reply.status == 200:
        relay.probe = UsageProbe.start(
            content_type,
            reply.header("content-encoding"),
            reply.header("content-length"),
            usage.usage_tokens,
            at_start=usage.usage_at_start,
        )


async def _relay_body(relay: _Relay, prefix: bytes) -> None:
    """The reply's body, chunk by chunk (whole events for a stream), then its end."""
    send, outcome, events, probe = relay.send, relay.outcome, relay.events, relay.probe
    assert relay.chunks is not None
    if prefix:
        # A held reply that turned out longer than the bound: what was read goes first.
        outcome.bytes_out += len(prefix)
        await send({"type": "http.response.body", "body": prefix, "more_body": True})
    try:
        async for chunk in relay.chunks:
            if events is not None:
                chunk = events.take(chunk)
            if chunk:
                outcome.bytes_out += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if probe is not None:
                    probe.feed(chunk)
    except TRANSPORT_ERRORS as exc:
        # Headers are gone already: the only honest signal left is an aborted body.
        await _send_rest(send, outcome, events, probe)
        failure = classify_error(exc, relay.upstream)
        log.warning("upstream stream broke after %d bytes: %s", outcome.bytes_out, failure.message)
        return
    await _send_rest(send, outcome, events, probe)
    relay.relayed_all = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    outcome.completed = True
    if probe is not None:
        outcome.prompt_tokens = probe.prompt_tokens()


def _client_left(relay: _Relay) -> Outcome:
    """The outcome when the client left: answered, if its reply's last byte had gone out
    (a client that closes right after the final event, as Codex CLI does), else gone."""
    outcome = relay.outcome
    if relay.started and (
        relay.relayed_all or _delivered(outcome, relay.length, relay.events, relay.probe)
    ):
        outcome.completed = True
        if relay.probe is not None:
            outcome.prompt_tokens = relay.probe.prompt_tokens()
        return outcome.frozen()
    outcome.client_gone = True
    if outcome.status == 0:
        outcome.status = 499
    return outcome.frozen()


def _uncancel() -> None:
    """The cancellation was ours (the client's watch, the shutdown's cut, or both): carry on
    with the answer."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


def _length(content_length: str | None) -> int | None:
    if content_length is None:
        return None
    try:
        return int(content_length)
    except ValueError:
        return None


def _delivered(
    outcome: _Tally, length: int | None, events: EventRelay | None, probe: UsageProbe | None
) -> bool:
    """Whether the client had the whole reply when it left: every byte of a declared length,
    a stream's final event (``[DONE]``, ``response.completed``...), or a JSON body that parses
    whole. What the upstream had not sent yet is then only the transfer's own end."""
    if length is not None:
        return outcome.bytes_out >= length
    if events is not None:
        return events.terminal
    return probe is not None and probe.complete()


async def _send_rest(
    send: Send, outcome: _Tally, events: EventRelay | None, probe: UsageProbe | None
) -> None:
    """What the event relay still holds: the upstream stopped inside an event."""
    if events is None:
        return
    rest = events.rest()
    if rest:
        outcome.bytes_out += len(rest)
        await send({"type": "http.response.body", "body": rest, "more_body": True})
        if probe is not None:
            probe.feed(rest)


async def _end_for_shutdown(relay: _Relay, flight: InFlight) -> None:
    """The shutdown's cut (compaction_proxy/http/_drain.py): a 503 when nothing went out yet, an
    error event after the last whole event of a stream. A compressed stream cannot take an
    event: it is left unfinished, which closes the connection (the client sees a cut)."""
    error = shutdown_error(flight.grace_seconds)
    outcome = relay.outcome
    outcome.cut_by_shutdown = True
    if not relay.started:
        outcome.status = error.status
        headers = [*(relay.extra_headers or ()), retry_after_header()]
        await send_bytes(relay.send, error.status, _error_body(error, relay.wire), headers)
        outcome.completed = True
        return
    if relay.events is None:
        return
    event = relay.events.error_event(error, relay.wire)
    outcome.bytes_out += len(event)
    await relay.send({"type": "http.response.body", "body": event, "more_body": True})
    await relay.send({"type": "http.response.body", "body": b"", "more_body": False})
    outcome.completed = True


def _error_body(error: ProxyError, wire: WireFormat | None) -> bytes:
    """An error the proxy answers itself, in the route's format (OpenAI's without one)."""
    if wire is None:
        return error.body()
    return wire.error_body(error.message, type=error.type, code=error.code, param=error.param)


def _small(content_length: str | None, limit: int = MAX_ERROR_BODY) -> bool:
    """Whether a reply may be held: its length unknown (read up to the bound) or within it."""
    if content_length is None:
        return True
    try:
        return int(content_length) <= limit
    except ValueError:
        return False


async def _read_bounded(
    chunks: AsyncIterator[bytes], limit: int = MAX_ERROR_BODY
) -> tuple[bytes, bool]:
    """Reads up to ``limit`` bytes: (the bytes, True) when that was the whole body,
    (what was read, False) when more follows (the iterator then continues after it)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts), False
    return b"".join(parts), True


async def send_held(
    send: Send, held: HeldReply, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> int:
    """Relays a held reply: its status, headers and body as the upstream sent them."""
    headers = [*held.headers, *(extra_headers or ())]
    await send({"type": "http.response.start", "status": held.status, "headers": headers})
    await send({"type": "http.response.body", "body": held.body, "more_body": False})
    return len(held.body)


async def _close_quietly(reply: UpstreamReply) -> None:
    try:
        await reply.close()
    except Exception:  # closing a broken stream may raise; nothing is left to tell anyone
        log.debug("error while closing upstream response", exc_info=True)


async def _send_failure(relay: _Relay, outcome: _Tally, exc: BaseException, what: str) -> None:
    """Answer a transport failure before any byte went out: 502/504 in the route's shape."""
    failure = classify_error(exc, relay.upstream)
    log.warning("upstream %s: %s", what, failure.message)
    outcome.status = failure.status
    error = ProxyError(failure.status, failure.message, "upstream_error", failure.code)
    if relay.handling.hold_failures:
        body = _error_body(error, relay.wire)
        outcome.held = HeldReply(failure.status, [_JSON_TYPE], body, None)
        return
    await send_bytes(relay.send, error.status, _error_body(error, relay.wire), relay.extra_headers)
    outcome.completed = True
