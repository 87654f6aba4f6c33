"""uvicorn's httptools protocol with a bound on request headers.

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
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_HEADER_FIELD_BYTES = 16 * 1024
FIELD_LIMIT_ENV = "COMPACTION_PROXY_SERVER__MAX_HEADER_FIELD_BYTES"


class _HeaderTooLarge(Exception):
    """Stops the parser inside a callback; httptools re-raises it wrapped."""


def too_large_response(total: int, per_header: int) -> bytes:
    """The 431 the protocol writes itself (there is no ASGI app to answer yet)."""
    body = orjson.dumps(
        {
            "error": {
                "message": (
                    f"request headers are too large: at most {total} bytes in all and "
                    f"{per_header} bytes per header"
                ),
                "type": "invalid_request_error",
                "param": None,
                "code": "request_header_fields_too_large",
            }
        }
    )
    head = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n"
    )
    return head + body


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

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True

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

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
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
