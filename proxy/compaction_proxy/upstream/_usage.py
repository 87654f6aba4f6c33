"""The prompt's size an upstream reply reports (``usage``), read while it is relayed.

It lives beside the forwarder because it runs inside its relay loop, once per chunk: the
upstream's own count of the prompt is what calibrates the proxy's token counts, and the only
moment to read it without holding anything back is while the bytes go by. The forwarder
reports the figure in its outcome; telemetry and calibration read it from there.

Compressed replies are read too. The OpenAI SDKs send ``Accept-Encoding: gzip, deflate`` and
the proxy relays bodies undecoded, so an upstream that compresses (OpenAI's JSON replies, any
server behind a compressing gateway) would otherwise never calibrate anything. The other way
out, asking the upstream for ``identity``, would send the client several times the bytes it
asked for; decompressing here costs microseconds per reply (``bench/usage_probe.py``,
docs/observability.md).

Where a stream states it is its format's to say (``WireFormat.usage_tokens``,
``WireFormat.usage_at_start``): OpenAI's streams in their last chunk or event, Anthropic's in
the first event (``message_start``) and, on some servers, again at the end (``message_delta``,
cumulative; llama.cpp's states only the output there). So the probe keeps a stream's last
4 KiB and, when the format says so, its first 16 KiB: bounded, and never a byte held back.
What it kept is read as events by the one SSE reader (compaction_proxy/wire/sse.py).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from compaction_proxy.wire import DEFAULT_FORMAT
from compaction_proxy.wire.sse import Event, events_backwards, iter_events, last_boundary

__all__ = ["UsageFormat", "UsageProbe", "UsageReader"]

UsageReader = Callable[[Any], "int | None"]
"""The prompt tokens a reply's JSON (or one SSE event's data) reports: its format's reader."""


class UsageFormat(Protocol):
    """How a reply's format states usage: the part of ``WireFormat`` the relay reads."""

    def usage_tokens(self, payload: Any) -> int | None: ...

    @property
    def usage_at_start(self) -> bool: ...


_JSON_LIMIT = 1 << 20
"""Largest JSON body (decompressed) that is kept and parsed; larger replies are not read."""
_SSE_TAIL = 4096
"""Bytes of a stream kept at its end: its usage chunk is the last event before ``[DONE]``."""
_SSE_HEAD = 16384
"""Bytes of a stream kept from its start, when its format states usage there: Anthropic's
``message_start`` is a few hundred bytes, and a ``ping`` may follow it."""
_SSE_INFLATE_LIMIT = 256 << 20
"""Decompressed bytes of a stream after which the probe gives up (a runaway or a bomb)."""
_INFLATE_STEP = 1 << 16
"""Largest piece one decompress call may produce, so one small chunk cannot allocate much."""
# Chat completions count the prompt in `prompt_tokens`, the Responses API in `input_tokens`.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')

# zlib's window bits: 16 + MAX_WBITS reads a gzip stream; 32 + MAX_WBITS reads zlib or gzip,
# whichever the header says (HTTP's "deflate" is zlib-wrapped, though some servers send gzip).
_WBITS = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": 32 + zlib.MAX_WBITS,
}


class UsageProbe:
    """Reads the prompt's tokens from an upstream reply as it is relayed.

    It sees each chunk after it was sent to the client and never changes or holds one back:
    a JSON body (at most 1 MiB once decompressed) is kept until the end and parsed once; an
    SSE stream keeps its last 4 KiB (decompressed), where a final usage event is, and with
    ``at_start`` also its first 16 KiB, where Anthropic's ``message_start`` is. A gzip or
    deflate body is decompressed on the side: a JSON body once at the end, a stream chunk by
    chunk (a compressed stream cannot be read from its middle).
    """

    __slots__ = ("_head", "_inflate", "_parts", "_read", "_size", "_sse", "_tail", "_wbits")

    def __init__(
        self,
        sse: bool,
        wbits: int | None = None,
        read: UsageReader | None = None,
        *,
        at_start: bool = False,
    ) -> None:
        # How the reply's format states the prompt's size (WireFormat.usage_tokens).
        self._read: UsageReader = read or DEFAULT_FORMAT.usage_tokens
        self._sse = sse
        self._wbits = wbits
        self._parts: list[bytes] | None = None if sse else []
        self._size = 0
        self._tail = b""
        # The stream's first bytes, while fewer than _SSE_HEAD (WireFormat.usage_at_start).
        self._head: bytearray | None = bytearray() if sse and at_start else None
        self._inflate: Any = zlib.decompressobj(wbits) if sse and wbits is not None else None

    @classmethod
    def start(
        cls,
        content_type: str,
        content_encoding: str | None,
        content_length: str | None,
        read: UsageReader | None = None,
        *,
        at_start: bool = False,
    ) -> UsageProbe | None:
        """A probe for a reply with these headers, or None when it cannot be read cheaply
        (an encoding other than gzip or deflate, too long, or neither JSON nor SSE).
        ``read``, ``at_start``: how the reply's format states usage (its
        ``usage_tokens``, ``usage_at_start``)."""
        wbits: int | None = None
        if content_encoding:
            coding = content_encoding.strip().lower()
            if coding != "identity":
                wbits = _WBITS.get(coding)
                if wbits is None:
                    return None  # br, zstd, or several codings stacked: not worth reading
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            return cls(sse=True, wbits=wbits, read=read, at_start=at_start)
        if media == "application/json":
            if content_length is not None:
                try:
                    if int(content_length) > _JSON_LIMIT:
                        return None
                except ValueError:
                    return None
            return cls(sse=False, wbits=wbits, read=read)
        return None

    def feed(self, chunk: bytes) -> None:
        """One chunk, after it went to the client."""
        if self._sse:
            if self._inflate is not None:
                self._feed_compressed_stream(chunk)
            else:
                self._keep(chunk)
            return
        parts = self._parts
        if parts is None:
            return
        # A compressed body is kept compressed (it is smaller) and bounded by the same limit.
        self._size += len(chunk)
        if self._size > _JSON_LIMIT:
            self._parts = None
        else:
            parts.append(chunk)

    def _keep(self, data: bytes) -> None:
        """A decompressed piece of the stream: the head takes what it still lacks, the tail
        its last bytes."""
        head = self._head
        if head is not None and len(head) < _SSE_HEAD:
            head += data[: _SSE_HEAD - len(head)]
        if len(data) >= _SSE_TAIL:
            self._tail = data[-_SSE_TAIL:]
        else:
            self._tail = (self._tail + data)[-_SSE_TAIL:]

    def _feed_compressed_stream(self, chunk: bytes) -> None:
        inflate = self._inflate
        data = chunk
        try:
            while data:
                out = inflate.decompress(data, _INFLATE_STEP)
                self._size += len(out)
                if self._size > _SSE_INFLATE_LIMIT:
                    self._give_up()
                    return
                if out:
                    self._keep(out)
                data = inflate.unconsumed_tail
        except zlib.error:
            self._give_up()

    def _give_up(self) -> None:
        self._inflate = None
        self._sse = False  # from now on feed() keeps nothing and prompt_tokens() is None
        self._parts = None
        self._head = None

    def complete(self) -> bool:
        """Whether the JSON body seen so far is whole: it parses, or its compressed stream
        ended. (A client that has it may close before the upstream's transfer ends.)"""
        if self._sse or self._parts is None:
            return False
        body = b"".join(self._parts)
        if self._wbits is not None:
            return _inflate_bounded(body, self._wbits) is not None
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            return False
        return True

    def prompt_tokens(self) -> int | None:
        """The reply's prompt tokens, once the whole body went by; None when it had none."""
        try:
            if self._sse:
                return self._stream_tokens()
            if self._parts is None:
                return None
            body = b"".join(self._parts)
            if self._wbits is not None:
                inflated = _inflate_bounded(body, self._wbits)
                if inflated is None:
                    return None
                body = inflated
            return self._read(orjson.loads(body))
        except (orjson.JSONDecodeError, ValueError, zlib.error):
            return None

    def _stream_tokens(self) -> int | None:
        """The last whole usage event's count; then, when the head is kept, the first one's
        there; then what a usage object cut at the tail's start still shows."""
        head = self._head
        if head is None:
            return _sse_prompt_tokens(self._tail, self._read)
        return (
            _sse_prompt_tokens(self._tail, self._read, lenient=False)
            or _sse_head_tokens(bytes(head), self._read)
            or _sse_prompt_tokens(self._tail, self._read)
        )


def _inflate_bounded(data: bytes, wbits: int) -> bytes | None:
    """``data`` decompressed, or None when it is not a whole stream or exceeds the limit."""
    inflate = zlib.decompressobj(wbits)
    out = inflate.decompress(data, _JSON_LIMIT + 1)
    if len(out) > _JSON_LIMIT or inflate.unconsumed_tail or not inflate.eof:
        return None
    return out


def _read(event: Event, read: UsageReader) -> int | None:
    """What the format's reader finds in ``event``'s data, when the data states ``usage`` (and
    parses: an event cut at the head's bound is no JSON object, so it is never read)."""
    text = event.text
    if text is None or b'"usage"' not in text or event.data is None:
        return None
    return read(event.data)


def _sse_head_tokens(head: bytes, read: UsageReader) -> int | None:
    """The prompt tokens of the first event in ``head`` that states them."""
    for event in iter_events(head):
        tokens = _read(event, read)
        if tokens:
            return tokens
    return None


def _sse_prompt_tokens(tail: bytes, read: UsageReader, *, lenient: bool = True) -> int | None:
    """The prompt tokens of the last SSE event in ``tail`` whose ``usage`` is an object.

    ``lenient``: a usage object the format's reader cannot see (in an event that began before
    the tail, or one the format does not read) is read by its ``prompt_tokens`` /
    ``input_tokens`` field alone."""
    first = tail.find(b'"usage"')
    if first < 0:
        return None
    # The events before the one holding the first "usage" state none: they are not cut.
    for event in events_backwards(tail[max(last_boundary(tail, first), 0) :]):
        if b'"usage"' not in event.raw:
            continue
        tokens = _read(event, read)
        if tokens is None and lenient:
            tokens = _cut_usage(event.raw)
        if tokens:
            return tokens
    return None


def _cut_usage(raw: bytes) -> int | None:
    """The first count a ``"usage"`` object in ``raw`` shows, read from its last one back:
    from the key to the end of its line (the event may have begun before the tail, so its
    data is not whole)."""
    end = len(raw)
    while (at := raw.rfind(b'"usage"', 0, end)) >= 0:
        line_end = raw.find(b"\n", at)
        usage = raw[at : line_end if line_end >= 0 else len(raw)]
        if not usage[7:].lstrip(b" :").startswith(b"null"):
            found = _PROMPT_TOKENS.search(usage)
            if found and int(found.group(1)):
                return int(found.group(1))
        end = at
    return None
