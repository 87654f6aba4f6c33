"""The ``model`` field of a multipart/form-data upload, read as the body arrives.

Audio transcriptions and translations, image edits and other uploads carry their model as a
form field, not in JSON; routing must read it there as surely as in a JSON body. This reads
the parts one by one as bytes come in and stops at the field asked for, so an upload whose
``model`` comes first (the SDKs send their fields before the file) is routed after a few
hundred bytes and the rest streams through; one whose ``model`` comes after the file is read
up to it (bounded by ``server.max_body_bytes``, like any body). Only part headers are parsed;
a part's content is skipped by looking for the next delimiter.

RFC 7578 (multipart/form-data) on RFC 2046 §5.1 (delimiters, preamble, epilogue).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compaction_proxy.compaction.errors import CompactionProxyError

MAX_PART_HEADERS = 16 * 1024
"""Bytes of one part's headers; past it the body is not a form this reader can follow."""

_PARAMETER = re.compile(
    r';\s*([A-Za-z0-9!#$%&\'*+.^_`|~-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)', re.DOTALL
)


def boundary_of(content_type: bytes) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type, or None when it is not one."""
    text = content_type.decode("latin-1")
    kind, _, rest = text.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    for name, value in _PARAMETER.findall(";" + rest):
        if name.lower() == "boundary":
            value = _unquote(value)
            if 1 <= len(value) <= 200:
                return value.encode("latin-1")
    return None


class Unreadable(CompactionProxyError, ValueError):
    """The bytes do not follow the multipart framing the Content-Type announced."""


@dataclass(frozen=True, slots=True)
class Field:
    """The outcome once decided: ``value`` is the field's bytes (None: the body has no such
    field)."""

    value: bytes | None


class FieldReader:
    """Feed it the body as it arrives; :meth:`feed` returns a :class:`Field` once the field
    (its first occurrence) has been read whole, or the body is known to have none."""

    def __init__(self, boundary: bytes, name: str) -> None:
        self._delimiter = b"--" + boundary
        self._name = name
        self._buffer = bytearray()
        self._position = 0  # where the next thing to read starts
        self._state = "preamble"  # preamble | after_delimiter | headers | content
        self._search = 0  # where a delimiter search resumes, so a long part is read once
        self._wanted = False

    def feed(self, chunk: bytes, *, last: bool) -> Field | None:
        """``chunk``: the next bytes of the body; ``last``: no more will come. Raises
        :class:`Unreadable` when the framing is broken."""
        self._trim()
        self._buffer += chunk
        while True:
            outcome = self._step()
            if isinstance(outcome, Field):
                return outcome
            if outcome is _MORE:
                # A body that ends before its closing delimiter has no such field (a truncated
                # body is the upstream's to refuse).
                return Field(None) if last else None

    def _trim(self) -> None:
        """Forget what is behind the reader (a long file part's bytes are only searched)."""
        skipping = self._state == "preamble" or (self._state == "content" and not self._wanted)
        cut = self._search if skipping else self._position
        if cut > 0:
            del self._buffer[:cut]
            self._position = max(0, self._position - cut)
            self._search = max(0, self._search - cut)

    def _step(self) -> Field | object | None:
        """One move of the reader: a :class:`Field` when decided, :data:`_MORE` when it needs
        more bytes, None when it moved on."""
        buffer, delimiter = self._buffer, self._delimiter
        state = self._state
        if state == "preamble":
            found = 0 if buffer.startswith(delimiter) else -1
            if found < 0:
                marker = b"\r\n" + delimiter
                found = buffer.find(marker, self._search)
                if found < 0:
                    self._search = max(0, len(buffer) - len(marker))
                    return _MORE
                found += 2
            self._position = found + len(delimiter)
            self._state = "after_delimiter"
            return None
        if state == "after_delimiter":
            if len(buffer) - self._position < 2:
                return _MORE
            if buffer.startswith(b"--", self._position):
                return Field(None)  # the closing delimiter: no such field
            end = buffer.find(b"\r\n", self._position)
            if end < 0:
                if len(buffer) - self._position > 256:
                    raise Unreadable("no line break after a delimiter")
                return _MORE
            if buffer[self._position : end].strip(b" \t"):
                raise Unreadable("text after a delimiter")
            self._position = end + 2
            self._state = "headers"
            return None
        if state == "headers":
            if buffer.startswith(b"\r\n", self._position):  # a part without headers
                headers, content = b"", self._position + 2
            else:
                end = buffer.find(b"\r\n\r\n", self._position)
                if end < 0:
                    if len(buffer) - self._position > MAX_PART_HEADERS:
                        raise Unreadable("part headers too long")
                    return _MORE
                headers, content = bytes(buffer[self._position : end]), end + 4
            self._wanted = _field_name(headers) == self._name
            self._position = self._search = content
            self._state = "content"
            return None
        # A part's content runs up to the next delimiter, which starts on a new line.
        marker = b"\r\n" + delimiter
        found = buffer.find(marker, self._search)
        if found < 0:
            self._search = max(self._position, len(buffer) - len(marker))
            return _MORE
        if self._wanted:
            return Field(bytes(buffer[self._position : found]))
        self._position = found + len(marker)
        self._state = "after_delimiter"
        return None


_MORE = object()


def _field_name(headers: bytes) -> str | None:
    """The ``name`` parameter of a part's Content-Disposition."""
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() != b"content-disposition":
            continue
        text = value.decode("utf-8", "replace")
        kind, _, rest = text.partition(";")
        if kind.strip().lower() != "form-data":
            return None
        for parameter, raw in _PARAMETER.findall(";" + rest):
            if parameter.lower() == "name":
                return _unquote(raw)
        return None
    return None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value
