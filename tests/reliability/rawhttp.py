"""HTTP/1.1 over a plain socket: requests exactly as written, for the attacks an HTTP client
library would refuse to send (dot segments, oversized headers) or quietly fix (httpx resolves
``..`` before sending)."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    rest: bytes = b""  # what followed the first response (pipelined answers)

    def json(self) -> object:
        return orjson.loads(self.body)


def send_raw(
    port: int, request: bytes, *, timeout: float = 10.0, until_close: bool = False
) -> RawResponse | None:
    """Send ``request`` and read the answer until the server closes or the body is complete.

    ``None`` when the server closed without answering. Bounded: one connection, ``timeout``
    seconds per read, at most 16 MiB read. ``until_close``: read every response the server
    sends (pipelining) until it closes; the first one is returned, the raw rest in ``rest``.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # the server may refuse and close while we are still writing
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        data = b""
        while len(data) < 16 << 20:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
            if not until_close and _complete(data):
                break
    if not data:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    rest = b""
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        body, rest = body[: int(length)], body[int(length) :]
    return RawResponse(status, headers, body, rest)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def get(port: int, target: str, headers: dict[str, str] | None = None) -> RawResponse | None:
    lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return send_raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def post_chunked(
    port: int,
    target: str,
    chunks: list[bytes],
    headers: dict[str, str] | None = None,
) -> RawResponse | None:
    """POST ``chunks`` with ``Transfer-Encoding: chunked`` (no Content-Length), one HTTP chunk
    each, exactly as a streaming client frames an upload."""
    lines = [
        f"POST {target} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        "Transfer-Encoding: chunked",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks if chunk)
    return send_raw(port, head + body + b"0\r\n\r\n", until_close=True)


def post(
    port: int, target: str, body: bytes, headers: dict[str, str] | None = None
) -> RawResponse | None:
    """POST ``body`` with its Content-Length and only the headers given (no Content-Type
    unless one is passed)."""
    lines = [
        f"POST {target} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return send_raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
