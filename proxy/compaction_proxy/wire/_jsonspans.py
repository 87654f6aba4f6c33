"""Where the members of a JSON object and the elements of one array sit in the client's bytes.

The proxy parses a request with orjson to compact it, but forwards the client's own bytes for
everything it did not change: a parsed number is a float or a 64-bit integer
(``1180591620717411303424`` would come back as ``1.1805916207174113e+21``, ``1.10`` as
``1.1``), so re-serializing the parsed body would change fields the proxy never touched. This
module finds the byte spans the splicing needs (compaction_proxy/wire/_forwarded.py): the top-level
members of an object, and the elements of one array member (``messages``, ``input``).

It is a lexical scanner, not a parser: strings, brackets and separators are found exactly,
scalars are taken as the runs of bytes between them, and nothing inside a value is decoded or
checked. So the same scanner reads bodies the proxy parsed (exact spans) and bodies orjson
refuses (a UTF-8 BOM, ``1e400``, a lone surrogate, invalid UTF-8), where only ``model`` is read
(:func:`lenient_member`), for routing a request that goes upstream unparsed.

Speed: one regular-expression match per element, which consumes a whole nested value in C
(up to :data:`REGEX_DEPTH` levels; deeper values take a slower token loop), and, when the
caller has the parsed elements, a faster path still: an element whose bytes are exactly its
orjson encoding (what most clients send) is recognised by one comparison. The element spans
are plain integer lists so that a caller who has scanned the same leading bytes before (a
conversation's previous request) can hand them back (``known``) and have only the new tail
scanned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.compaction.errors import CompactionProxyError

REGEX_DEPTH = 12
"""How deeply nested a value one regular-expression match consumes; deeper ones are walked
token by token (still exact, slower)."""

BOM = b"\xef\xbb\xbf"


def _all_but(excluded: bytes) -> bytes:
    """A character class of every byte but ``excluded``, spelled as ranges: the regular
    expression engine tests such a class with a bitmap, about three times faster than the
    negated class ``[^...]``, which it tests one excluded byte at a time (and most of a body
    is string content run through one of these classes)."""
    ranges: list[bytes] = []
    low = 0
    for byte in [*sorted(set(excluded)), 256]:
        if byte > low:
            ranges.append(b"\\x%02x-\\x%02x" % (low, byte - 1))
        low = byte + 1
    return b"[" + b"".join(ranges) + b"]"


_WS = rb"[ \t\n\r]*+"
_PLAIN = _all_but(b'"\\')  # string content but escapes
_STRING = rb'"' + _PLAIN + rb"*+(?:\\." + _PLAIN + rb'*+)*+"'
_RUN = _all_but(b'"[]{}') + b"++"  # inside a container, between strings and brackets
_BARE = _all_but(b'"[]{},: \t\n\r') + b"++"  # a number or literal, unchecked (1e400 is one)


def _container(depth: int) -> bytes:
    """A bracketed value nested at most ``depth`` deep. Opening and closing brackets are not
    paired by kind (``[`` with ``}`` would pass): this consumes bytes a JSON parser already
    accepted, or reads a body only leniently."""
    inner = rb"[\[{](?:" + _RUN + rb"|" + _STRING + rb")*+[\]}]"
    for _ in range(depth - 1):
        inner = rb"[\[{](?:" + _RUN + rb"|" + _STRING + rb"|" + inner + rb")*+[\]}]"
    return inner


_VALUE = rb"(?:" + _STRING + rb"|" + _container(REGEX_DEPTH) + rb"|" + _BARE + rb")"
_ELEMENT = re.compile(_WS + rb"(" + _VALUE + rb")" + _WS + rb"([,\]])", re.DOTALL)
_KEY = re.compile(_WS + rb"(" + _STRING + rb")" + _WS + rb":" + _WS, re.DOTALL)
_SEPARATOR = re.compile(_WS + rb"([,\]}])")
_SPACE = re.compile(_WS)
_BARE_RE = re.compile(_BARE)
_VALUE_RE = re.compile(_VALUE, re.DOTALL)
_TOKEN = re.compile(_RUN + rb"|" + _STRING + rb"|[\[\]{}]", re.DOTALL)
_CLOSERS = {ord("["): ord("]"), ord("{"): ord("}")}
_AFTER_VALUE = frozenset(b",]} \t\n\r")
_SPACES = (b" ", b"\t", b"\n", b"\r")
_COMMA = ord(",")


class ScanError(CompactionProxyError, ValueError):
    """The bytes are not the JSON structure the scan expected (at ``position``)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at byte {position}")
        self.position = position


@dataclass(frozen=True, slots=True)
class Member:
    """One member of an object: its decoded key and where its value's bytes are."""

    key: str
    key_start: int  # the key's opening quote
    start: int  # the value's first byte
    end: int  # one past the value's last byte


@dataclass(frozen=True, slots=True)
class ArraySpans:
    """An array's elements: ``buf[starts[i]:ends[i]]`` is element ``i``, exactly as written.

    ``start`` is the ``[``, ``end`` one past the ``]``. Between two elements there is only
    whitespace and one comma. ``differs``: the indices of the elements whose bytes are not
    exactly orjson's encoding of their parsed value (every element, when the scan was not
    given the parsed elements); for the others, ``orjson.dumps`` of an equal value with the
    same key order gives back the client's bytes.
    """

    start: int
    end: int
    starts: list[int]
    ends: list[int]
    differs: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True, slots=True)
class ObjectSpans:
    """An object's members in the order written (duplicates included), and the elements of
    the member asked for (:func:`scan_object`'s ``elements_of``, its last occurrence).

    ``encoded``: that member's value is exactly orjson's encoding of its parsed value (so is
    each element, and an equal value with the same key order is written back as the client's
    bytes); with ``whole``, its element spans are then not looked for (``elements`` None).
    """

    start: int  # the "{"
    end: int  # one past the "}"
    members: tuple[Member, ...]
    elements: ArraySpans | None = None
    encoded: bool = False

    def last(self, key: str) -> Member | None:
        """The member a JSON parser keeps (orjson and Python's json keep the last)."""
        for member in reversed(self.members):
            if member.key == key:
                return member
        return None

    def count(self, key: str) -> int:
        return sum(1 for member in self.members if member.key == key)


def scan_object(
    buf: bytes,
    start: int = 0,
    *,
    expected: Mapping[str, Any] | None = None,
    elements_of: str | None = None,
    known: ArraySpans | None = None,
    whole: bool = False,
) -> ObjectSpans:
    """The members of the object whose ``{`` is at or after ``start`` (whitespace and a BOM
    before it are skipped).

    ``expected``: the parsed object, when the caller has it; values whose bytes are their
    orjson encoding are then recognised without a regular-expression walk. ``elements_of``:
    also return the element spans of that member's value (its last occurrence), when it is an
    array, found in the same pass; ``known`` is passed on to :func:`scan_array` for it.
    ``whole``: when that value is written exactly as orjson writes it (most clients), say so
    (``encoded``) and skip its elements: one comparison for the whole array.
    Raises :class:`ScanError` when the bytes are not an object.
    """
    pos = _skip_prefix(buf, start)
    if buf[pos : pos + 1] != b"{":
        raise ScanError("expected an object", pos)
    opening = pos
    pos += 1
    members: list[Member] = []
    elements: ArraySpans | None = None
    encoded_at = -1  # where the value found to be orjson's encoding starts
    closing = _SEPARATOR.match(buf, pos)
    if closing is not None and closing.group(1) == b"}":
        return ObjectSpans(opening, closing.end(), ())
    while True:
        head = _KEY.match(buf, pos)
        if head is None:
            raise ScanError("expected a member name", pos)
        key = decode_key(buf[head.start(1) : head.end(1)])
        value_start = head.end()
        if key == elements_of and buf[value_start : value_start + 1] == b"[":
            hint = expected.get(key) if expected is not None else None
            value_end = _encoded_end(buf, value_start, hint) if whole and hint else -1
            if value_end >= 0:
                encoded_at, elements = value_start, None
            else:
                elements = scan_array(
                    buf,
                    value_start,
                    expected=hint if isinstance(hint, list) else None,
                    known=known,
                )
                encoded_at = -1 if elements.differs else value_start
                value_end = elements.end
        else:
            value_end = _value_end(buf, value_start, expected, key)
        members.append(Member(key, head.start(1), value_start, value_end))
        after = _SEPARATOR.match(buf, value_end)
        if after is None or after.group(1) == b"]":
            raise ScanError("expected ',' or '}'", value_end)
        pos = after.end()
        if after.group(1) == b"}":
            break
    final = spans_start = None
    if elements_of is not None:
        last = next((m for m in reversed(members) if m.key == elements_of), None)
        final = last.start if last is not None else None
        spans_start = elements.start if elements is not None else None
    if final is None:
        return ObjectSpans(opening, pos, tuple(members))
    # An earlier duplicate may have been the array and the one a parser keeps not.
    return ObjectSpans(
        opening,
        pos,
        tuple(members),
        elements if spans_start == final else None,
        encoded_at == final,
    )


def _resume(
    buf: bytes,
    start: int,
    known: ArraySpans | None,
    starts: list[int],
    ends: list[int],
    differs: list[int],
) -> int | ArraySpans:
    """Where :func:`scan_array` goes on (``starts``, ``ends``, ``differs`` filled with the
    ``known`` leading elements it resumes after), or the whole array when there is nothing
    more to scan (it is empty, or the known elements were all of it)."""
    if known is not None and len(known) and known.start == start:
        starts.extend(known.starts)
        ends.extend(known.ends)
        differs.extend(known.differs)
        after = _SEPARATOR.match(buf, ends[-1])
        if after is not None and after.group(1) == b",":
            return after.end()
        # The known elements were the whole array (or the bytes changed): scan afresh.
        if after is not None and after.group(1) == b"]":
            return ArraySpans(start, after.end(), starts, ends, differs)
        starts.clear()
        ends.clear()
        differs.clear()
        return start + 1
    empty = _SEPARATOR.match(buf, start + 1)
    if empty is not None and empty.group(1) == b"]":
        return ArraySpans(start, empty.end(), starts, ends, differs)
    return start + 1


def scan_array(
    buf: bytes,
    start: int,
    *,
    expected: Sequence[Any] | None = None,
    known: ArraySpans | None = None,
) -> ArraySpans:
    """The elements of the array whose ``[`` is at ``start``.

    ``expected``: the parsed elements, when the caller has them; an element whose bytes are
    exactly ``orjson.dumps`` of its parsed value is then recognised by one comparison (always
    verified: a mismatch falls back to the scan, so the spans are exact whatever the client's
    formatting). ``known``: spans of leading elements already found in a scan of the same
    leading bytes, from the same ``start`` (the caller vouches that those bytes are
    unchanged); the scan resumes after the last of them. Raises :class:`ScanError`."""
    if buf[start : start + 1] != b"[":
        raise ScanError("expected an array", start)
    starts: list[int] = []
    ends: list[int] = []
    differs: list[int] = []
    resumed = _resume(buf, start, known, starts, ends, differs)
    if isinstance(resumed, ArraySpans):
        return resumed
    pos = resumed
    hints = expected if expected is not None else ()
    speculate = expected is not None
    misses = 0
    dumps = orjson.dumps
    match = _ELEMENT.match
    length = len(buf)
    while True:
        index = len(starts)
        # `hit`: the guessed bytes matched and a separator other than a bare comma follows;
        # the element then ends below, where a scanned one does (a flag, not a call).
        hit = False
        if speculate and index < len(hints):
            try:
                encoded = dumps(hints[index])
            except TypeError:
                encoded = b""
            value_start = pos
            if buf[pos : pos + 1] in _SPACES:
                value_start = _SPACE.match(buf, pos).end()  # type: ignore[union-attr]
            value_end = value_start + len(encoded)
            if encoded and buf.startswith(encoded, value_start):
                following = buf[value_end] if value_end < length else -1
                if following == _COMMA:  # compact JSON: the common case, no regex call
                    starts.append(value_start)
                    ends.append(value_end)
                    pos = value_end + 1
                    continue
                hit = following in _AFTER_VALUE
            if not hit:
                misses += 1
                if misses >= 8 and misses > len(starts) // 2:
                    speculate = False  # this client formats differently: stop paying for dumps
        if not hit:
            differs.append(index)
            found = match(buf, pos)
            if found is not None:
                starts.append(found.start(1))
                ends.append(found.end(1))
                pos = found.end()
                if found.group(2) == b"]":
                    return ArraySpans(start, pos, starts, ends, differs)
                continue
            value_start = _SPACE.match(buf, pos).end()  # type: ignore[union-attr]
            value_end = skip_value(buf, value_start)
        after = _SEPARATOR.match(buf, value_end)
        if after is None or after.group(1) == b"}":
            raise ScanError("expected ',' or ']'", value_end)
        starts.append(value_start)
        ends.append(value_end)
        pos = after.end()
        if after.group(1) == b"]":
            return ArraySpans(start, pos, starts, ends, differs)


def keys_after(buf: bytes, pos: int) -> list[str]:
    """The names of the object members that follow a member value ending at ``pos``, up to
    the object's ``}`` (their values skipped, not decoded). Raises :class:`ScanError`."""
    keys: list[str] = []
    while True:
        after = _SEPARATOR.match(buf, pos)
        if after is None or after.group(1) == b"]":
            raise ScanError("expected ',' or '}'", pos)
        if after.group(1) == b"}":
            return keys
        head = _KEY.match(buf, after.end())
        if head is None:
            raise ScanError("expected a member name", after.end())
        keys.append(decode_key(buf[head.start(1) : head.end(1)]))
        pos = _value_end(buf, head.end(), None, "")


def skip_value(buf: bytes, pos: int) -> int:
    """One past the end of the value that starts at ``pos`` (no whitespace before it)."""
    head = buf[pos : pos + 1]
    if head == b'"':
        found = _TOKEN.match(buf, pos)
        if found is None or found.end() - pos < 2 or buf[found.end() - 1] != ord('"'):
            raise ScanError("unterminated string", pos)
        return found.end()
    if head not in (b"[", b"{"):
        bare = _BARE_RE.match(buf, pos)
        if bare is None:
            raise ScanError("expected a value", pos)
        return bare.end()
    closers: list[int] = []
    cursor = pos
    length = len(buf)
    while cursor < length:
        token = _TOKEN.match(buf, cursor)
        if token is None:
            break
        first = buf[cursor]
        cursor = token.end()
        if first in _CLOSERS:
            closers.append(_CLOSERS[first])
        elif first in (ord("]"), ord("}")):
            if not closers or closers.pop() != first:
                raise ScanError("mismatched bracket", cursor - 1)
            if not closers:
                return cursor
    raise ScanError("unterminated value", pos)


def decode_key(raw: bytes) -> str:
    """A member name (its quoted bytes) as text; invalid UTF-8 and lone surrogates are kept
    as replacement characters, so such a name never equals one the proxy looks for."""
    inner = raw[1:-1]
    if b"\\" not in inner:
        return inner.decode("utf-8", "replace")
    try:
        text = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return "\ufffd"
    return text if isinstance(text, str) else "\ufffd"


def decode_string(raw: bytes) -> str | None:
    """The text of a JSON string value (its quoted bytes); None when ``raw`` is not a string
    or its text is not valid Unicode (invalid UTF-8, a lone surrogate escape)."""
    if len(raw) < 2 or raw[:1] != b'"' or raw[-1:] != b'"':
        return None
    try:
        text = json.loads(raw.decode("utf-8"))
        text.encode("utf-8")
    except (ValueError, UnicodeError):
        return None
    return text if isinstance(text, str) else None


def lenient_member(buf: bytes, key: str) -> bytes | None:
    """The raw value of the top-level member ``key`` (its last occurrence, as a JSON parser
    keeps), or None when the object has no such member. A leading UTF-8 BOM is skipped and
    nothing but the object's framing is checked. Raises :class:`ScanError` when the bytes are
    not an object."""
    spans = scan_object(buf)
    member = spans.last(key)
    return None if member is None else buf[member.start : member.end]


def _skip_prefix(buf: bytes, pos: int) -> int:
    if buf.startswith(BOM, pos):
        pos += len(BOM)
    return _SPACE.match(buf, pos).end()  # type: ignore[union-attr]


def _encoded_end(buf: bytes, pos: int, value: Any) -> int:
    """One past the value at ``pos`` when its bytes are exactly ``orjson.dumps(value)``, else
    -1."""
    try:
        encoded = orjson.dumps(value)
    except TypeError:
        return -1
    end = pos + len(encoded)
    if buf.startswith(encoded, pos) and (end >= len(buf) or buf[end] in _AFTER_VALUE):
        return end
    return -1


def _value_end(buf: bytes, pos: int, expected: Mapping[str, Any] | None, key: str) -> int:
    """One past the member value at ``pos`` (after the colon and its whitespace)."""
    if expected is not None and key in expected:
        end = _encoded_end(buf, pos, expected[key])
        if end >= 0:
            return end
    found = _VALUE_RE.match(buf, pos)
    if found is not None:
        return found.end()
    return skip_value(buf, pos)
