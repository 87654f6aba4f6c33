"""Send one request upstream and stream the answer back as it arrives.

Shared by chat completions and the pass-through: both must relay bytes without buffering or
re-encoding, cancel the upstream call when the client goes away, and turn transport failures
into 502/504 in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy.asgi import Receive, Scope, Send, send_error
from proxy.config import UpstreamSettings
from proxy.errors import ProxyError
from proxy.metrics import UsageProbe
from proxy.transport import TRANSPORT_ERRORS, Body, UpstreamReply, UpstreamTransport
from proxy.upstream import classify_error, response_headers

log = logging.getLogger("compaction_proxy.forward")

_SSE_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]


@dataclass(slots=True)
class Outcome:
    status: int
    bytes_out: int = 0
    completed: bool = False
    client_gone: bool = False
    upstream_request_id: str | None = None
    upstream_seconds: float | None = None  # to the response headers
    prompt_tokens: int | None = None  # the reply's usage.prompt_tokens (when asked to read it)


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


async def forward(
    transport: UpstreamTransport,
    upstream: UpstreamSettings,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    content: Body,
    streamed: StreamedBody | None = None,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    read_usage: bool = False,
    on_accepted: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Forward and relay. Never raises for transport problems: the client gets 502/504.

    `on_accepted`: awaited once the upstream answered 2xx, before the response starts.
    `read_usage`: note the reply's `usage.prompt_tokens` in the outcome, from the bytes as
    they are relayed (nothing is held back or changed).
    """
    outcome = Outcome(status=0)
    watch = _DisconnectWatch(receive, streamed)
    reply: UpstreamReply | None = None
    try:
        started = time.perf_counter()
        try:
            reply = await transport.send(method, url, headers, content, upstream.timeouts)
        except ProxyError:
            raise
        except TRANSPORT_ERRORS as exc:
            # Our own request-body generator may have refused the body (413) or lost the
            # client; the transport reports that as a connection failure, which it is not.
            if streamed is not None and streamed.error is not None:
                raise streamed.error from None
            failure = classify_error(exc, upstream)
            log.warning("upstream request failed: %s", failure.message)
            outcome.status = failure.status
            await send_error(
                send,
                ProxyError(failure.status, failure.message, "upstream_error", failure.code),
                extra_headers,
            )
            outcome.completed = True
            return outcome

        outcome.upstream_seconds = time.perf_counter() - started
        out_headers = response_headers(reply.raw_headers)
        content_type = reply.header("content-type") or ""
        if content_type.startswith("text/event-stream"):
            out_headers = [h for h in out_headers if h[0] != b"cache-control"]
            out_headers.extend(_SSE_HEADERS)
        if extra_headers:
            out_headers.extend(extra_headers)
        outcome.status = reply.status
        outcome.upstream_request_id = reply.header("x-request-id")
        if on_accepted is not None and 200 <= reply.status < 300:
            # Before the client sees a byte: its next request must find what this one left.
            await on_accepted()
        await send({"type": "http.response.start", "status": reply.status, "headers": out_headers})
        probe = None
        if read_usage and reply.status == 200:
            probe = UsageProbe.start(
                content_type, reply.header("content-encoding"), reply.header("content-length")
            )
        try:
            async for chunk in reply.chunks():
                if chunk:
                    outcome.bytes_out += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if probe is not None:
                        probe.feed(chunk)
        except TRANSPORT_ERRORS as exc:
            # Headers are gone already: the only honest signal left is an aborted body.
            failure = classify_error(exc, upstream)
            log.warning(
                "upstream stream broke after %d bytes: %s", outcome.bytes_out, failure.message
            )
            return outcome
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        outcome.completed = True
        if probe is not None:
            outcome.prompt_tokens = probe.prompt_tokens()
        return outcome
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        # The client left: stop here. Closing the reply (below) drops the upstream
        # connection, which is how the provider learns to stop generating.
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        outcome.client_gone = True
        if outcome.status == 0:
            outcome.status = 499
        return outcome
    finally:
        watch.finish()
        if reply is not None:
            await _close_quietly(reply)


async def _close_quietly(reply: UpstreamReply) -> None:
    try:
        await reply.close()
    except Exception:  # closing a broken stream may raise; nothing is left to tell anyone
        log.debug("error while closing upstream response", exc_info=True)
