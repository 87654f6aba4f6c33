"""uvicorn's httptools protocol with bounds on request headers, slow clients and connections.

Slow and idle clients, and the number of connections, are bounded here too, with nginx's
model (compaction_proxy/http/client_limits.py has the rules and defaults): a header timeout, a
body timeout between reads, the keep-alive timeout (uvicorn's own, with a log line), and a
connection limit at which the least recently active connection without a request being
answered is closed. Each one that bites logs one rate-limited line.

Header sizes:

httptools keeps a header's bytes until the header is complete and uvicorn sets no limit, so
one client could make the proxy hold a 32 MB header (and forward a 100 KB one). The bound has
to sit in the protocol: by the time the ASGI app sees ``scope["headers"]`` the memory is
spent. Two limits, answered with 431 in OpenAI's error shape and the connection closed:

- the whole header block (request line included), checked after each read that leaves the
  block unfinished, so a connection never holds more than the limit plus one read, and again
  when the block is complete;
- each header (name and value), checked as httptools completes it.

uvicorn builds the protocol itself, so the limits reach it the ways that also work with several
worker processes: the block bound in uvicorn's own ``Config.h11_max_incomplete_event_size`` (the
same meaning for its h11 protocol), the per-header bound in the environment variable that is
also the config override for ``server.max_header_field_bytes`` (``serve`` sets it).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.http._errors import error_body
from compaction_proxy.http.client_limits import bites, client_limits

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_HEADER_FIELD_BYTES = 16 * 1024
FIELD_LIMIT_ENV = "COMPACTION_PROXY_SERVER__MAX_HEADER_FIELD_BYTES"


class _HeaderTooLarge(CompactionProxyError):
    """Stops the parser inside a callback; httptools re-raises it wrapped."""


def too_large_response(total: int, per_header: int) -> bytes:
    """The 431 the protocol writes itself (there is no ASGI app to answer yet)."""
    body = error_body(
        f"request headers are too large: at most {total} bytes in all and "
        f"{per_header} bytes per header",
        type="invalid_request_error",
        code="request_header_fields_too_large",
    )
    head = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return head + body


def error_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 error in OpenAI's shape, with the connection closed after it."""
    body = error_body(
        message, type="invalid_request_error" if status < 500 else "server_error", code=code
    )
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


# Where a connection is: "new" (no byte yet), "idle" (between requests), "headers", "body"
# (the client is sending them), "busy" (a request is being answered: never evicted).
Phase = Literal["new", "idle", "headers", "body", "busy"]
_EVICTABLE = ("new", "idle", "headers", "body")


def _field_limit() -> int:
    value = os.environ.get(FIELD_LIMIT_ENV, "")
    return int(value) if value.isdigit() else DEFAULT_MAX_HEADER_FIELD_BYTES


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that refuses oversized headers (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._max_total = config.h11_max_incomplete_event_size or DEFAULT_MAX_HEADER_BYTES
        self._max_field = _field_limit()
        self._in_headers = True
        self._header_bytes = 0
        self._headers_done = 0  # header blocks completed on this connection
        self._refused = False
        self._limits = client_limits()
        self._phase: Phase = "new"
        self._active_at = 0.0  # loop time of the last byte received (or of the connection)
        self._timer: asyncio.TimerHandle | None = None

    # -- slow clients and the connection limit ------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._active_at = self.loop.time()
        self._arm(self._limits.header_timeout, self._header_timed_out)
        if len(self.connections) > self._limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, handler: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, handler)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _make_room(self) -> None:
        """At the limit: close the least recently active connection that is not being
        answered, or refuse this one when every other is."""
        victim: BoundedHttpToolsProtocol | None = None
        for other in self.connections:
            if (
                other is not self
                and isinstance(other, BoundedHttpToolsProtocol)
                and other._phase in _EVICTABLE
                and not other.transport.is_closing()
                and (victim is None or other._active_at < victim._active_at)
            ):
                victim = other
        limit = self._limits.max_connections
        if victim is None:
            bites.note(
                "connections",
                f"{limit} client connections are open and all busy: refused a new one with "
                "503 (server.max_client_connections)",
            )
            self._close_with(
                503,
                "Service Unavailable",
                f"the proxy has {limit} open connections, all busy; retry shortly",
                "too_many_connections",
            )
            return
        bites.note(
            "connections",
            f"{limit} client connections are open: closed the least recently active one "
            f"({victim._phase}) for a new one (server.max_client_connections)",
        )
        if victim._phase in ("headers", "body"):
            victim._close_with(
                503,
                "Service Unavailable",
                "the connection was closed to make room for another: the proxy is at its "
                "connection limit",
                "too_many_connections",
            )
        else:
            victim.transport.close()

    def _close_with(self, status: int, reason: str, message: str, code: str) -> None:
        """Answer ``status`` (when no response has started) and close; the app, if it is
        reading the body, sees the client gone."""
        self._disarm()
        cycle = self.cycle
        # No request dispatched yet (none, or the last one answered), or not answered yet.
        answer = cycle is None or cycle.response_complete or not cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if not self.transport.is_closing():
            if answer:
                self.transport.write(error_response(status, reason, message, code))
            self.transport.close()

    def _header_timed_out(self) -> None:
        self._timer = None
        seconds = f"{self._limits.header_timeout:g} s"
        if self._phase == "new":
            bites.note(
                "idle",
                f"closed a connection that sent no request within {seconds} "
                "(server.client_header_timeout)",
            )
            self.transport.close()
            return
        bites.note(
            "header",
            f"closed a connection whose request headers were not complete within {seconds}: "
            "408 (server.client_header_timeout)",
        )
        self._close_with(
            408,
            "Request Timeout",
            f"the request headers did not arrive within {seconds}",
            "request_timeout",
        )

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.flow.read_paused:  # we stopped reading, not the client: not its delay
            self._arm(self._limits.body_timeout, self._body_timed_out)
            return
        seconds = f"{self._limits.body_timeout:g} s"
        if self.cycle is not None and self.cycle.response_complete:
            self.transport.close()  # answered already (without reading it all): just drop it
            return
        bites.note(
            "body",
            f"closed a connection whose request body stalled for {seconds}: 408 "
            "(server.client_body_timeout)",
        )
        self._close_with(
            408,
            "Request Timeout",
            f"the request body stopped arriving: nothing for {seconds}",
            "request_timeout",
        )

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            bites.note(
                "keepalive",
                f"closed a connection idle for {self.timeout_keep_alive:g} s between requests "
                "(server.client_keepalive_timeout)",
            )
        super().timeout_keep_alive_handler()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and self._phase == "busy":
            self._phase = "idle"  # uvicorn armed its keep-alive timer

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._phase == "body":
            self._arm(self._limits.body_timeout, self._body_timed_out)

    # -- header sizes ---------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        if self._phase == "idle":  # a kept-alive connection's next request: its headers' clock
            self._arm(self._limits.header_timeout, self._header_timed_out)
        if self._phase in ("new", "idle"):
            self._phase = "headers"

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > self._max_field:
            raise _HeaderTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        # A block that arrived in one read was never counted by data_received: measure it.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self._max_total:
            raise _HeaderTooLarge
        self._in_headers = False
        self._header_bytes = 0
        self._headers_done += 1
        super().on_headers_complete()
        if self._phase == "headers":
            self._phase = "body"  # until the message completes (at once without a body)
            self._arm(self._limits.body_timeout, self._body_timed_out)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True
        if self._phase == "body":
            self._phase = "busy"
            self._disarm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._active_at = self.loop.time()
        self._unset_keepalive_if_required()
        pending = self._in_headers
        done_before = self._headers_done
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _HeaderTooLarge):
                self._refuse()
                return
            self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        # Only a chunk that left a header block unfinished, and finished none, is all header
        # bytes; a chunk that also carried a body (or a whole request) is not counted.
        if pending and self._in_headers and self._headers_done == done_before:
            self._header_bytes += len(data)
            if self._header_bytes > self._max_total:
                self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        self.logger.warning("request headers over the limit: answered 431")
        if not self.transport.is_closing():
            self.transport.write(too_large_response(self._max_total, self._max_field))
            self.transport.close()

    def _invalid(self) -> None:
        message = "Invalid HTTP request received."
        self.logger.warning(message)
        self.send_400_response(message)
