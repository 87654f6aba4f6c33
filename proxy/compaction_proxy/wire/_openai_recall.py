"""What the recall sides of OpenAI's two APIs share (:mod:`compaction_proxy.wire.chat._recall`,
:mod:`compaction_proxy.wire.responses._recall`): a held SSE body cut into its events, an
event written again with new data, and the request's tool lists read leniently.

A reply the loop strips goes to the client's SDK, so the events nothing changed are kept as
the upstream's very bytes (``Event.raw``: the events joined again are the body, byte for
byte), and an event whose data changed keeps its other lines (``event:``, ``id:``, comments)
and its line ends. Events are split as the SDKs' decoders split them (lines end in CRLF, LF
or CR; a blank line ends an event), so what the proxy reads is what the client would have
read: trailing bytes without their blank line, which no SDK dispatches, are kept as they
came and never read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Event", "events", "integer", "loads", "named_list"]

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its bytes as they came (blank line included), its ``data``
    lines joined (None: it has none), that data parsed as JSON (None: not JSON, or none),
    and whether it ended with its blank line."""

    raw: bytes
    text: bytes | None
    data: Any
    complete: bool

    @property
    def done(self) -> bool:
        """Chat completions' ``data: [DONE]``."""
        return self.text is not None and self.text.strip() == b"[DONE]"

    def with_data(self, data: Any) -> bytes:
        """This event's bytes with ``data`` as its one data line (compact JSON), every other
        line and the line ends as they came."""
        lines = list(_lines(self.raw))
        end = next((e for _, e in lines if e), b"\n")
        out: list[bytes] = []
        written = False
        for line, line_end in lines:
            if not line:
                continue  # the blank line, written at the end
            if _field(line) == b"data":
                if written:
                    continue
                line, written = b"data: " + orjson.dumps(data), True
            out.append(line + (line_end or end))
        if not written:
            out.append(b"data: " + orjson.dumps(data) + end)
        return b"".join(out) + end


def events(body: bytes) -> list[Event]:
    """``body``'s events, in order; their ``raw`` bytes joined are ``body``."""
    return list(_events(body))


def integer(value: object) -> int | None:
    """``value`` when it is a JSON integer (an index, a sequence number), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def loads(raw: bytes) -> Any:
    """``raw`` parsed, or None when it is not JSON (a reply the loop cannot read is relayed
    as it came)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def named_list(body: Mapping[str, Any], key: str) -> list[Any]:
    """``body[key]`` when it is a list, else ``[]`` (a malformed member is the upstream's to
    refuse, never the proxy's to trip on)."""
    value = body.get(key)
    return value if isinstance(value, list) else []


def _lines(raw: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(line, its end)`` of ``raw``; the last one's end is ``b""`` when it has none."""
    start = 0
    for match in _LINE_END.finditer(raw):
        yield raw[start : match.start()], match.group()
        start = match.end()
    if start < len(raw):
        yield raw[start:], b""


def _field(line: bytes) -> bytes:
    return line.partition(b":")[0]


def _events(body: bytes) -> Iterator[Event]:
    start = 0
    data: list[bytes] = []
    seen = False  # any line but blank ones since the last event
    position = 0
    for line, end in _lines(body):
        position += len(line) + len(end)
        if not end:
            break  # an unterminated last line: left in the trailing bytes
        if line:
            seen = True
            if _field(line) == b"data":
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            continue
        if not seen:
            continue  # blank lines between events belong to the next event's bytes
        yield _event(body[start:position], data, complete=True)
        start, data, seen = position, [], False
    if start < len(body):
        yield Event(body[start:], None, None, complete=False)


def _event(raw: bytes, data: list[bytes], *, complete: bool) -> Event:
    if not data:
        return Event(raw, None, None, complete)
    text = b"\n".join(data)
    return Event(raw, text, loads(text), complete)
