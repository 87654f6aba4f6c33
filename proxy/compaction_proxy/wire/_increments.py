"""A body read from the conversation's previous one: only the bytes after the shared prefix
are parsed.

An agent re-sends its whole history after every step, so most of each body is, byte for
byte, the previous request's. When the new bytes start with the previous body's bytes up to
the end of its ``k``-th element of the items array (``messages``, ``input``), those ``k``
elements are the same JSON values: a JSON value's meaning does not depend on what follows
it. So the new body is parsed as the previous body's bytes before the array (the *head*)
followed by everything after the ``k``-th element, and the previous ``k`` parsed elements
are put in front of what that parse gives.

That is exact, not a guess, under three conditions checked here; anything else returns
``None`` and the caller parses the whole body as before:

* the items key occurs once among the earlier body's top-level members, and not among the
  new body's members after its array (a duplicate would make a JSON parser keep the other
  value); the head is the earlier body's own bytes, so its members were read then;
* what follows the shared elements is whitespace and then ``]``, or a comma and then a value
  (``[m0,]`` is invalid JSON, while the shortened ``[]`` would not be);
* the shortened body parses with the format's own parser (its verdict on a bad body is left
  to the full parse, which raises the error the client gets).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._jsonspans import ArraySpans, ScanError, keys_after, scan_array, scan_object

_CHUNK = 1 << 16
_SPACE = b" \t\n\r"


@dataclass(frozen=True, slots=True)
class Earlier:
    """A body that parsed, with where its items sit: what the next request may extend."""

    raw: bytes
    key: str
    spans: ArraySpans
    items: list[Any]

    @property
    def head_end(self) -> int:
        """One past the items array's ``[``: the bytes every extending body starts with."""
        return self.spans.start + 1


@dataclass(frozen=True, slots=True)
class Extended:
    """A body parsed from its earlier one: ``data`` equals ``parse(raw)``; ``shared`` leading
    items are the earlier body's own objects; ``spans`` are the new body's items."""

    data: dict[str, Any]
    shared: int
    spans: ArraySpans


def scanned(raw: bytes, data: dict[str, Any], key: str) -> Earlier | None:
    """``raw`` (which parsed as ``data``) as an :class:`Earlier`, or ``None`` when a later
    body could not extend it exactly (no items array, a duplicate key, bytes the scanner does
    not read as the parser did)."""
    items = data.get(key)
    if not isinstance(items, list) or not items:
        return None
    try:
        spans = scan_object(raw, expected=data, elements_of=key)
    except ScanError:
        return None
    elements = spans.elements
    if elements is None or spans.count(key) != 1 or len(elements) != len(items):
        return None
    return Earlier(raw, key, elements, items)


def common_prefix(a: bytes, b: bytes, limit: int) -> int:
    """How many leading bytes ``a`` and ``b`` share, up to ``limit``: whole chunks compared
    with one ``memcmp`` each, then the differing chunk halved until the first difference."""
    limit = min(limit, len(a), len(b))
    view = memoryview(b)
    pos = 0
    while pos < limit:
        end = min(pos + _CHUNK, limit)
        if a.startswith(view[pos:end], pos):
            pos = end
            continue
        low, high = pos, end  # a[:low] == b[:low]; they differ before `high`
        while high - low > 1:
            middle = (low + high) // 2
            if a.startswith(view[low:middle], low):
                low = middle
            else:
                high = middle
        return low
    return limit


def shared_items(raw: bytes, earlier: Earlier) -> int:
    """How many leading items of ``earlier`` are, byte for byte, where ``raw`` has them."""
    ends = earlier.spans.ends
    return bisect_right(ends, common_prefix(raw, earlier.raw, ends[-1]))


def tail_bytes(raw: bytes, earlier: Earlier, shared: int) -> int:
    """How many bytes of ``raw`` :func:`extend` parses when ``shared`` items are shared."""
    return len(raw) - earlier.spans.ends[shared - 1] if shared else len(raw)


def extend(
    raw: bytes, earlier: Earlier, parse: Callable[[bytes], dict[str, Any]], shared: int
) -> Extended | None:
    """``raw`` parsed from ``earlier``, whose first ``shared`` items it has
    (:func:`shared_items`; the module docstring), or ``None``: parse it whole."""
    if shared <= 0:
        return None
    spans = earlier.spans
    ends = spans.ends
    cut = ends[shared - 1]
    after = _after_shared(raw, cut)
    if after is None:
        return None
    try:
        head = memoryview(earlier.raw)[: earlier.head_end]
        data = parse(b"".join((head, memoryview(raw)[after:])))
    except Exception:  # the format's own error: left for the full parse to raise
        return None
    tail = data.get(earlier.key)
    if not isinstance(tail, list):
        return None
    items = [*earlier.items[:shared], *tail]
    data[earlier.key] = items
    known = ArraySpans(spans.start, -1, spans.starts[:shared], ends[:shared], _below(spans, shared))
    try:
        found = scan_array(raw, spans.start, expected=items, known=known)
    except ScanError:
        return None
    if len(found) != len(items) or earlier.key in _keys_after(raw, found.end):
        return None
    return Extended(data, shared, found)


def _keys_after(raw: bytes, end: int) -> list[str]:
    """The top-level member names after the items array (a duplicate of its key there is
    what a parser would keep instead); a body the scan cannot read counts as one."""
    try:
        return keys_after(raw, end)
    except ScanError:
        return [""]


def _after_shared(raw: bytes, cut: int) -> int | None:
    """Where the bytes after the shared elements go on in the shortened body: at the comma
    (dropped) when a value follows it, at the ``]`` when the array ends; None otherwise."""
    pos = cut
    length = len(raw)
    while pos < length and raw[pos] in _SPACE:
        pos += 1
    if pos >= length:
        return None
    if raw[pos] == ord("]"):
        return pos
    if raw[pos] != ord(","):
        return None
    value = pos + 1
    while value < length and raw[value] in _SPACE:
        value += 1
    if value >= length or raw[value] in b"],":
        return None
    return value


def _below(spans: ArraySpans, shared: int) -> list[int]:
    return [index for index in spans.differs if index < shared]


__all__ = [
    "Earlier",
    "Extended",
    "common_prefix",
    "extend",
    "scanned",
    "shared_items",
    "tail_bytes",
]
