"""The body a compacted request goes upstream as: the client's bytes, one array rewritten.

When compaction changes a request (or a checkpoint stands in for its older messages), only one
member changes: ``messages`` (chat completions) or ``input`` (the Responses API). Serializing
the parsed body again would also rewrite every other field as orjson reads it: integers past
64 bits become floats (``"seed": 1180591620717411303424`` as ``1.1805916207174113e+21``),
``1.10`` becomes ``1.1``, escapes and spacing change. So the forwarded body is the client's own
bytes with only that member's value replaced (compaction_proxy/wire/_jsonspans.py finds the spans),
and within the new array every element the proxy did not change is the client's own slice
(runs of consecutive elements as one slice, separators included). Only elements the proxy
made or edited are serialized, from their parsed form.

An element counts as unchanged when it is the very object the parser made for the client's
element (the core hands back the client's own dicts), or, with ``copies``, when it equals one
(a message read back from a checkpoint stands for the client's message it was made from).

The common case costs one comparison: when the client wrote the whole array exactly as orjson
writes it (the SDKs do), orjson writes every unchanged element back as the client's bytes, so
the new array is serialized in one call and no element is looked for. Only an array written
otherwise (spacing, ``1.10``, ``\u00e9`` escapes) is taken apart element by element. (A
checkpoint copy of a message the client has since re-sent with its keys in another order goes
in the order it was first forwarded in.)

Where the bytes cannot be spliced (the member appears twice, so a parser and the upstream could
disagree on which one counts), the body is serialized whole, as before this module existed.

Another top-level member may change with it, or alone: an output limit lowered so the prompt
and the answer fit the window, or Messages' ``thinking`` with the ``block_binding`` a compacted
request needs (``members``, :meth:`ClientBody.with_members`). Its value is written in place of
the client's (added after the client's last member when the client sent none) and every other
byte stays.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

import orjson

from compaction_proxy.compaction import OutputLimit

from ._jsonspans import ObjectSpans, ScanError, scan_object

log = logging.getLogger("compaction_proxy.forwarded")


class ClientBody:
    """A client's JSON object body: its bytes, its parsed form, and the member (``key``) the
    proxy may rewrite. The spans are found once, on first use, and kept for every attempt of
    the request (a compact-and-retry splices again without scanning again)."""

    __slots__ = ("_scanned", "_spans", "data", "key", "raw")

    def __init__(self, raw: bytes, data: Mapping[str, Any], key: str) -> None:
        self.raw = raw
        self.data = data
        self.key = key
        self._spans: ObjectSpans | None = None
        self._scanned = False

    def without(self, names: Collection[str]) -> ClientBody:
        """The body without the top-level members ``names`` (each occurrence), every other
        byte the client's: what a request goes upstream as when the proxy applied one of its
        fields itself (Anthropic's ``context_management`` for a server that refuses it,
        docs/context-management.md). ``self`` when it has none of them; every attempt of the
        request splices into the result."""
        gone = {name for name in names if name in self.data}
        if not gone:
            return self
        data = {key: value for key, value in self.data.items() if key not in gone}
        spans = self.spans
        if spans is None:
            return ClientBody(orjson.dumps(data), data, self.key)
        return ClientBody(_cut(self.raw, spans, gone), data, self.key)

    @property
    def spans(self) -> ObjectSpans | None:
        """The object's member spans, with the elements of ``key``; None when the bytes are
        not what the parser read (they always are for a body orjson accepted)."""
        if not self._scanned:
            self._scanned = True
            try:
                self._spans = scan_object(
                    self.raw, expected=self.data, elements_of=self.key, whole=True
                )
            except ScanError:
                log.warning("the request body could not be scanned; it is re-serialized whole")
                self._spans = None
        return self._spans

    def with_elements(
        self,
        elements: Sequence[Any],
        *,
        copies: bool = False,
        members: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The body with ``key`` holding ``elements``, every other byte the client's.

        ``copies``: also take the client's bytes for an element equal to one of the client's
        elements not otherwise used (a message read back from a checkpoint; see
        :func:`matches`). ``members``: other top-level members whose values change too (an
        output limit lowered to fit the window), each written in place of the client's.
        """
        spans = self.spans
        member = spans.last(self.key) if spans is not None else None
        changed = dict(members or {})
        if (
            spans is None
            or member is None
            or spans.count(self.key) != 1
            or not _spliceable(spans, changed)
        ):
            return orjson.dumps({**self.data, self.key: list(elements), **changed})
        raw = self.raw
        if spans.encoded and spans.elements is None:
            # The client wrote the array as orjson writes it, so orjson writes each element
            # the client sent (or an equal copy) back as the client's very bytes: one call
            # for the whole array, and no element spans were needed.
            value = orjson.dumps(list(elements))
        else:
            value = _array_bytes(raw, spans, self.data.get(self.key), elements, copies)
        return _spliced(raw, spans, {self.key: value, **_encoded(changed)})

    def with_members(self, members: Mapping[str, Any]) -> bytes:
        """The body with only ``members``' values replaced (top-level members other than
        ``key``, such as an output limit), every other byte the client's: what a request whose
        messages compaction left alone goes upstream as when one of them changed."""
        if not members:
            return self.raw
        spans = self.spans
        if spans is None or not _spliceable(spans, members):
            return orjson.dumps({**self.data, **members})
        return _spliced(self.raw, spans, _encoded(members))


def lowered_limits(
    body: Mapping[str, Any], names: Sequence[str], limit: OutputLimit | None
) -> dict[str, int]:
    """The output-limit members of ``body`` (a format's ``output_limits``) to write when the
    report's ``limit`` was lowered: each that asks more than the limit forwarded, lowered to
    it, so no member an upstream might read is left asking more than the window leaves. A
    member that is absent, not an integer or already within it stays as the client sent it (a
    limit is never added or raised); nothing when ``limit`` was not lowered."""
    if limit is None or not limit.lowered:
        return {}
    forwarded = limit.forwarded
    return {
        name: forwarded
        for name in names
        if isinstance(value := body.get(name), int)
        and not isinstance(value, bool)
        and value > forwarded
    }


def _spliceable(spans: ObjectSpans, members: Mapping[str, Any]) -> bool:
    """Whether each of ``members`` is written at most once (so the one a parser keeps is the
    one replaced; one the client did not send is added after its last member)."""
    return all(spans.count(name) <= 1 for name in members)


def _encoded(members: Mapping[str, Any]) -> dict[str, bytes]:
    return {name: orjson.dumps(value) for name, value in members.items()}


def _spliced(raw: bytes, spans: ObjectSpans, values: Mapping[str, bytes]) -> bytes:
    """``raw`` with the value of each member named in ``values`` replaced by its bytes, and
    those the client did not send added after its last member (in ``values``' order)."""
    replaced = sorted(
        (member.start, member.end, values[member.key])
        for member in spans.members
        if member.key in values
    )
    present = {member.key for member in spans.members}
    added = [
        orjson.dumps(name) + b":" + value for name, value in values.items() if name not in present
    ]
    if added:
        # After the last member's value (or inside an empty object's brace), so the client's
        # spacing before the closing brace stays where it was.
        at = spans.members[-1].end if spans.members else spans.start + 1
        joined = b",".join(added)
        replaced.append((at, at, b"," + joined if spans.members else joined))
        replaced.sort(key=lambda part: (part[0], part[1]))
    parts: list[bytes] = []
    at = 0
    for start, end, value in replaced:
        parts += (raw[at:start], value)
        at = end
    parts.append(raw[at:])
    return b"".join(parts)


def _array_bytes(
    raw: bytes,
    spans: ObjectSpans,
    original: Any,
    elements: Sequence[Any],
    copies: bool,
) -> bytes:
    """The new array's bytes: runs of the client's elements as their own slices, the rest
    serialized."""
    found = spans.elements
    dumps = orjson.dumps
    if found is None or not isinstance(original, list) or len(found) != len(original):
        # Not an array the client sent (a string ``input``): every element is new.
        return b"[" + b",".join(dumps(element) for element in elements) + b"]"
    starts, ends = found.starts, found.ends
    indices = matches(original, elements, copies=copies)
    parts: list[bytes] = []
    first = last = -1
    for element, index in zip(elements, indices, strict=True):
        if index is not None and first >= 0 and index == last + 1:
            last = index
            continue
        if first >= 0:
            parts.append(raw[starts[first] : ends[last]])
            first = last = -1
        if index is None:
            parts.append(dumps(element))
        else:
            first = last = index
    if first >= 0:
        parts.append(raw[starts[first] : ends[last]])
    if starts:
        # The client's spacing inside the brackets stays, so an unchanged list is its bytes.
        lead, trail = raw[found.start + 1 : starts[0]], raw[ends[-1] : found.end - 1]
    else:
        lead, trail = raw[found.start + 1 : found.end - 1], b""
    return b"".join((b"[", lead, b",".join(parts), trail, b"]"))


def matches(original: list[Any], elements: Sequence[Any], *, copies: bool) -> list[int | None]:
    """For each element, the index of the client's element it is (None: the proxy's own).

    Identity decides first, the next client element first: a run the core kept is found
    without a lookup, and an object the parser shares between elements (``None``, ``true``, a
    small integer) is matched in order rather than to its last occurrence. With ``copies``, an
    element read back from a checkpoint is matched too, by equality: first to the client's
    element after the last one matched (the copies come in order, so this is most of them),
    else among the unused client elements of the same shape (:func:`_shape`), the next ones
    in order first. No element is serialized to be matched.
    """
    count = len(original)
    used: set[int] = set()
    position: dict[int, int] | None = None
    indices: list[int | None] = []
    following = 0
    for element in elements:
        found: int | None = None
        if following < count and original[following] is element and following not in used:
            found = following
        else:
            if position is None:
                # The first occurrence of an object the parser shares between elements.
                position = {id(original[at]): at for at in range(count - 1, -1, -1)}
            at = position.get(id(element))
            if at is not None:
                found = at if at not in used else _shared(original, element, used)
        if found is not None:
            used.add(found)
            following = found + 1
        indices.append(found)
    if copies and None in indices:
        _copies(original, elements, indices, used)
    return indices


def _shared(original: list[Any], element: Any, used: set[int]) -> int | None:
    """The first unused client element that is ``element`` itself."""
    return next(
        (at for at, item in enumerate(original) if item is element and at not in used), None
    )


def _copies(
    original: list[Any], elements: Sequence[Any], indices: list[int | None], used: set[int]
) -> None:
    count = len(original)
    shapes: dict[Hashable, list[int]] | None = None
    following = 0  # the client's element after the last one matched: preferred next
    for slot, element in enumerate(elements):
        matched = indices[slot]
        if matched is not None:
            following = matched + 1
            continue
        if following < count and following not in used and original[following] == element:
            match: int | None = following
        else:
            if shapes is None:
                shapes = {}
                for index in range(count):
                    if index not in used:
                        shapes.setdefault(_shape(original[index]), []).append(index)
            bucket = shapes.get(_shape(element), ())
            ordered = sorted(bucket, key=lambda index: (index < following, index))
            match = next((i for i in ordered if i not in used and original[i] == element), None)
        if match is not None:
            used.add(match)
            indices[slot] = match
            following = match + 1


def _shape(value: Any) -> Hashable:
    """What two equal elements have in common, cheap to compute: a message's size, role, type
    and content length. Only elements of one shape are compared."""
    if isinstance(value, dict):
        role, kind, content = value.get("role"), value.get("type"), value.get("content")
        return (
            len(value),
            role if isinstance(role, str) else None,
            kind if isinstance(kind, str) else None,
            len(content) if isinstance(content, str | list) else None,
        )
    return type(value).__name__


def _cut(raw: bytes, spans: ObjectSpans, gone: set[str]) -> bytes:
    """``raw`` without the members named in ``gone``: each with the separator before it (the
    first one, with the separator after it), so what is left is the same object, less them."""
    members = spans.members
    kept = [index for index, member in enumerate(members) if member.key not in gone]
    cuts: list[tuple[int, int]] = []
    for index, member in enumerate(members):
        if member.key not in gone:
            continue
        if index > 0:
            cuts.append((members[index - 1].end, member.end))
        else:
            following = next((members[k] for k in kept if k > index), None)
            cuts.append((member.key_start, following.key_start if following else member.end))
    parts: list[bytes] = []
    at = 0
    for start, end in sorted(cuts):
        if end <= at:
            continue
        parts.append(raw[at : max(start, at)])
        at = end
    parts.append(raw[at:])
    return b"".join(parts)
