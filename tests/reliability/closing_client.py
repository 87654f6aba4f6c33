"""A raw-socket client that closes the moment it has what it came for, as Codex CLI does: right
after ``response.completed`` (or a JSON body that parses whole), without waiting for the end of
the HTTP transfer. An HTTP client library would read to the end and hide the race."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class Received:
    status: int
    headers: dict[str, str]
    body: bytes  # the body's bytes (chunked framing removed) when the client closed


def post_then_close(
    port: int,
    path: str,
    payload: object,
    *,
    done: Callable[[bytes], bool],
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Received:
    """POSTs ``payload`` as JSON and reads until ``done(body)``; then closes at once."""
    body = orjson.dumps(payload)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Authorization: Bearer sk-test-dummy",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        raw = b""
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete reply within {timeout}s: {raw[:2000]!r}")
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"the server closed before the reply was whole: {raw!r}")
            raw += chunk
            head, sep, rest = raw.partition(b"\r\n\r\n")
            if not sep:
                continue
            status, fields = _head(head)
            payload_bytes = _dechunk(rest) if _chunked(fields) else rest
            if done(payload_bytes):
                # Closed here, with the transfer's end (the last chunk) maybe still to come.
                return Received(status, fields, payload_bytes)


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), fields


def _chunked(fields: dict[str, str]) -> bool:
    return "chunked" in fields.get("transfer-encoding", "").lower()


def _dechunk(data: bytes) -> bytes:
    """The payload of the complete chunks in ``data`` (a partial chunk is left out)."""
    out = b""
    while True:
        size_line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return out
        size = int(size_line.split(b";")[0], 16)
        if size == 0 or len(rest) < size + 2:
            return out
        out += rest[:size]
        data = rest[size + 2 :]


def whole_json(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def after_event(marker: bytes) -> Callable[[bytes], bool]:
    """Done once the event holding ``marker`` has arrived whole (its blank line too)."""

    def done(body: bytes) -> bool:
        at = body.find(marker)
        return at >= 0 and body.find(b"\n\n", at) >= 0

    return done


def post_and_read(
    port: int,
    path: str,
    payload: object,
    *,
    headers: dict[str, str] | None = None,
    progress: Callable[[bytes], None] | None = None,
    timeout: float = 60.0,
) -> tuple[Received, bool]:
    """POSTs ``payload`` and reads until the server closes the connection; ``progress`` sees
    the body so far after each read. Returns the reply and whether its transfer ended properly
    (the last chunk of a chunked body, or all of a declared length)."""
    body = orjson.dumps(payload)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Authorization: Bearer sk-test-dummy",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            raw += chunk
            head, sep, rest = raw.partition(b"\r\n\r\n")
            if sep and progress is not None:
                _, fields = _head(head)
                progress(_dechunk(rest) if _chunked(fields) else rest)
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError(f"no reply: {raw!r}")
    status, fields = _head(head)
    if _chunked(fields):
        return Received(status, fields, _dechunk(rest)), rest.endswith(b"0\r\n\r\n")
    length = int(fields.get("content-length", "-1"))
    return Received(status, fields, rest), len(rest) == length
