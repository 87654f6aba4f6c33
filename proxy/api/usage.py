"""``usage.prompt_tokens`` read from an upstream reply while it is relayed.

It lives beside the forwarder because it runs inside its relay loop, once per chunk: the
upstream's own count of the prompt is what calibrates the proxy's token counts, and the only
moment to read it without holding anything back is while the bytes go by. The forwarder
reports the figure in its outcome; telemetry and calibration read it from there.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["UsageProbe"]

_JSON_LIMIT = 1 << 20
_SSE_TAIL = 4096
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


class UsageProbe:
    """Reads ``usage.prompt_tokens`` from an upstream reply as it is relayed.

    It sees each chunk after it was sent to the client and never changes or holds one back:
    a JSON body (uncompressed, at most 1 MiB) is kept until the end and parsed once; an SSE
    stream keeps only its last 4 KiB, where the usage chunk is.
    """

    __slots__ = ("_parts", "_size", "_sse", "_tail")

    def __init__(self, sse: bool) -> None:
        self._sse = sse
        self._parts: list[bytes] | None = None if sse else []
        self._size = 0
        self._tail = b""

    @classmethod
    def start(
        cls, content_type: str, content_encoding: str | None, content_length: str | None
    ) -> UsageProbe | None:
        """A probe for a reply with these headers, or None when it cannot be read cheaply
        (compressed, too long, or neither JSON nor SSE)."""
        if content_encoding and content_encoding.strip().lower() != "identity":
            return None
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            return cls(sse=True)
        if media == "application/json":
            if content_length is not None:
                try:
                    if int(content_length) > _JSON_LIMIT:
                        return None
                except ValueError:
                    return None
            return cls(sse=False)
        return None

    def feed(self, chunk: bytes) -> None:
        """One chunk, after it went to the client."""
        if self._sse:
            if len(chunk) >= _SSE_TAIL:
                self._tail = chunk[-_SSE_TAIL:]
            else:
                self._tail = (self._tail + chunk)[-_SSE_TAIL:]
            return
        parts = self._parts
        if parts is None:
            return
        self._size += len(chunk)
        if self._size > _JSON_LIMIT:
            self._parts = None
        else:
            parts.append(chunk)

    def prompt_tokens(self) -> int | None:
        """The reply's prompt tokens, once the whole body went by; None when it had none."""
        try:
            if self._sse:
                return _sse_prompt_tokens(self._tail)
            if self._parts is None:
                return None
            return _usage_prompt_tokens(orjson.loads(b"".join(self._parts)))
        except (orjson.JSONDecodeError, ValueError):
            return None


def _usage_prompt_tokens(payload: Any) -> int | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    tokens = usage.get("prompt_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return None


def _sse_prompt_tokens(tail: bytes) -> int | None:
    """The prompt tokens of the last SSE event in ``tail`` whose ``usage`` is an object."""
    end = len(tail)
    while True:
        at = tail.rfind(b'"usage"', 0, end)
        if at < 0:
            return None
        line_start = tail.rfind(b"\n", 0, at) + 1
        line_end = tail.find(b"\n", at)
        if line_end < 0:
            line_end = len(tail)
        line = tail[line_start:line_end].strip()
        tokens = None
        if line.startswith(b"data:"):
            try:
                tokens = _usage_prompt_tokens(orjson.loads(line[5:]))
            except orjson.JSONDecodeError:
                tokens = None
        if tokens is None:
            # The event began before the tail: its usage object may still be whole.
            usage = tail[at:line_end]
            if not usage[7:].lstrip(b" :").startswith(b"null"):
                found = _PROMPT_TOKENS.search(usage)
                tokens = int(found.group(1)) if found else None
        if tokens:
            return tokens
        end = at
