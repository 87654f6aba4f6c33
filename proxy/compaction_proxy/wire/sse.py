"""Server-sent events as the proxy reads them: the one reader of every stream it looks into.

The recall loop reads a held reply whole (``wire/chat/_recall.py``,
``wire/responses/_recall.py``, ``wire/messages/_recall.py``); the relay cuts a reply it
forwards only at event boundaries and reads its last event (``upstream/_stream_events.py``); the
usage probe reads the events it kept of a stream's start and end (``upstream/_usage.py``). Each
reads the events here, split as the SDKs' decoders split them: lines end in CRLF, LF or CR; a
blank line ends an event; a ``data`` line's value is what follows its colon, less one leading
space, and an event's ``data`` lines are joined with LF. Which event ends a stream, and where
usage is stated, is each format's to say (``WireFormat.ends_stream``, ``usage_tokens``,
``usage_at_start``).

An event keeps its bytes as they came (:attr:`Event.raw`, its blank line included): the events
of a body joined again are the body, byte for byte, so a reply rewritten event by event is the
upstream's bytes but for the events that change (:meth:`Event.with_data`). A blank line with
nothing before it (a server that writes two) is an event of its own, with no field; the bytes
after the last blank line (a stream cut short, or whose last event lacks its blank line) are
one last event, not :attr:`~Event.complete` but read all the same: who must have a whole event
(what an SDK would dispatch) checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

__all__ = [
    "WHOLE",
    "Event",
    "events",
    "events_backwards",
    "iter_events",
    "last_boundary",
    "last_event",
]

_BLANK = frozenset({b"\n", b"\r\n", b"\r"})

WHOLE = (b"\n\n", b"\r\n\r\n")
"""How a piece of a stream that ends on an event boundary ends, as servers write them."""
_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")
"""The blank lines the relay cuts a stream after: found with one ``rfind`` each, never a line
read (a chunk's end is looked for in every chunk relayed)."""
_UNREAD: Any = object()


class Event:
    """One event: its lines as they came (the blank line that ends it included), its ``data``
    lines joined (None: it has none), that data parsed as JSON (None: not JSON, or none), and
    whether it ended with its blank line.

    Its data is read when first asked for, and once: an event looked at only for its bytes
    (most of what the relay and the usage probe keep) costs no more than its cut, and whoever
    changes the parsed value in place changes the one :attr:`data` the event has."""

    __slots__ = ("_data", "_lines", "_text", "complete", "raw")

    def __init__(self, lines: list[bytes], complete: bool) -> None:
        self._lines = lines
        self.raw = b"".join(lines)
        self.complete = complete
        self._text: Any = _UNREAD
        self._data: Any = _UNREAD

    def __repr__(self) -> str:
        return f"Event(raw={self.raw!r}, complete={self.complete})"

    @property
    def lines(self) -> tuple[bytes, ...]:
        """Its lines, each with the end it had (the last one's may have none)."""
        return tuple(self._lines)

    @property
    def text(self) -> bytes | None:
        """Its ``data`` lines' values joined with LF; None when it has none."""
        if self._text is _UNREAD:
            values = [_value(line) for line in self._lines if _is_data(line)]
            self._text = b"\n".join(values) if values else None
        text: bytes | None = self._text
        return text

    @property
    def data(self) -> Any:
        """:attr:`text` parsed as JSON; None when it is not JSON, or there is none."""
        if self._data is _UNREAD:
            self._data = _parsed(self.text)
        return self._data

    @property
    def name(self) -> str | None:
        """Its ``event:`` field (the last one, spaces stripped), or None."""
        found: str | None = None
        for line in self.lines:
            field, colon, value = line.rstrip(b"\r\n").partition(b":")
            if field == b"event" and colon:
                found = value.decode("utf-8", "replace").strip()
        return found

    @property
    def kind(self) -> str | None:
        """Its data's ``type`` (the Responses and Messages APIs name each event there)."""
        kind = self.data.get("type") if isinstance(self.data, dict) else None
        return kind if isinstance(kind, str) else None

    def with_data(self, data: Any) -> bytes:
        """This event's bytes with ``data`` (compact JSON) in place of its data line(s): the
        first one rewritten with the line end it had, any further ones left out, every other
        line (``event:``, ``id:``, comments, the blank line) as it came. An event without a
        data line gets one before its blank line."""
        lines = list(self.lines)
        at = [i for i, line in enumerate(lines) if _is_data(line)]
        if at:
            first = lines[at[0]]
            written = b"data: " + orjson.dumps(data) + (_end(first) or b"\n")
            dropped = set(at[1:])
            return b"".join(
                written if i == at[0] else line for i, line in enumerate(lines) if i not in dropped
            )
        end = next((_end(line) for line in lines if _end(line)), b"\n")
        fields, blank = (lines[:-1], lines[-1:]) if self.complete else (lines, [])
        if fields and not _end(fields[-1]):
            fields[-1] += end  # an unterminated last line ends before the new one
        return b"".join([*fields, b"data: " + orjson.dumps(data) + end, *blank])


def events(body: bytes) -> list[Event]:
    """``body``'s events, in order; their :attr:`Event.raw` joined are ``body``."""
    return list(iter_events(body))


def iter_events(body: bytes) -> Iterator[Event]:
    """:func:`events` one by one, for a reader that may stop at the first it wants."""
    lines: list[bytes] = []
    for line in body.splitlines(keepends=True):  # bytes split at CRLF, LF and CR alone
        lines.append(line)
        if line in _BLANK:
            yield Event(lines, complete=True)
            lines = []
    if lines:
        yield Event(lines, complete=False)


def events_backwards(body: bytes) -> Iterator[Event]:
    """:func:`events` last first, each made only when reached (the usage probe reads a
    stream's end back to its last usage)."""
    lines = body.splitlines(keepends=True)
    starts = [0, *(at + 1 for at, line in enumerate(lines) if line in _BLANK)]
    if starts[-1] < len(lines):
        yield Event(lines[starts[-1] :], complete=False)
    for start, end in zip(reversed(starts[:-1]), reversed(starts[1:]), strict=True):
        yield Event(lines[start:end], complete=True)


def last_boundary(data: bytes, end: int | None = None) -> int:
    """The end of the last blank line in ``data[:end]`` (an event's end), or -1."""
    stop = len(data) if end is None else end
    best = -1
    for mark in _BOUNDARIES:
        at = data.rfind(mark, 0, stop)
        if at >= 0:
            best = max(best, at + len(mark))
    return best


def last_event(data: bytes) -> Event | None:
    """The last event of ``data``, a piece of a stream that starts on an event boundary: what
    follows the piece's last boundary but one (:func:`last_boundary`), read as events; None
    for no bytes."""
    start = last_boundary(data, len(data) - 1) if len(data) > 1 else -1
    found = events(data[max(start, 0) :])
    return found[-1] if found else None


def _end(line: bytes) -> bytes:
    """The line end ``line`` has (``b""``: none)."""
    return line[len(line.rstrip(b"\r\n")) :]


def _is_data(line: bytes) -> bool:
    return line.startswith(b"data:") or line.rstrip(b"\r\n") == b"data"


def _parsed(text: bytes | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _value(line: bytes) -> bytes:
    value = line.rstrip(b"\r\n")[5:]
    return value[1:] if value.startswith(b" ") else value
