"""Small plain-ASGI helpers for the hot path.

The forwarding routes are written against raw ASGI rather than Starlette's Request/Response:
no per-request task groups or memory streams (the BaseHTTPMiddleware trap), and the exact
bytes of a body are in hand so an unchanged request can go upstream untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.http._errors import ProxyError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """First value of a request header (`name` lower-case)."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def content_length(scope: Scope) -> int | None:
    raw = header(scope, b"content-length")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ProxyError(
            400, "Content-Length is not a number", code="invalid_content_length"
        ) from None
    if value < 0:
        raise ProxyError(400, "Content-Length is negative", code="invalid_content_length")
    return value


def too_large(limit: int) -> ProxyError:
    return ProxyError(
        413,
        f"request body is larger than the proxy's limit of {limit} bytes (server.max_body_bytes)",
        code="request_too_large",
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing early when it would pass `limit`.

    A declared Content-Length over the limit is refused before a byte is read; a chunked body
    is refused as soon as the running total passes it, so memory stays bounded.
    """
    declared = content_length(scope)
    if declared is not None and declared > limit:
        raise too_large(limit)
    first = await receive()
    if first["type"] == "http.disconnect":
        raise ClientGone
    body = first.get("body", b"")
    if not first.get("more_body", False):
        if len(body) > limit:
            raise too_large(limit)
        return bytes(body)
    parts = [body]
    total = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class ClientGone(CompactionProxyError):
    """The client closed the connection; nothing is left to answer."""


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"application/json",
) -> None:
    all_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Send, error: ProxyError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_bytes(send, error.status, error.body(), headers)
