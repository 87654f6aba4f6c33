"""The raw-JSON scanner (compaction_proxy/wire/_jsonspans.py) and the splice built on it
(compaction_proxy/wire/_forwarded.py), over bodies written every way JSON allows.

Bodies are generated as values and then written with random spacing, escapes (``\\u00e9``,
``\\/``, surrogate pairs) and number spellings (``1.10``, ``1E+2``, integers past 64 bits), so
the scanner meets what clients send rather than what orjson writes. Values are compared with
Python's json module, which keeps big integers exact.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import OutputLimit
from compaction_proxy.wire import ClientBody, lowered_limits
from compaction_proxy.wire._jsonspans import (
    REGEX_DEPTH,
    ScanError,
    decode_string,
    lenient_member,
    scan_array,
    scan_object,
)

SPACES = ["", "", "", " ", "\n", "\t", "\r\n  ", "  "]
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
)
small_scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=8))
new_values = st.recursive(
    small_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def write(value: Any, rng: random.Random) -> str:
    """``value`` as JSON text, spelled at random (every spelling parses back to ``value``)."""

    def space() -> str:
        return rng.choice(SPACES)

    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if "e" in text or "E" in text:
            mantissa, _, exponent = text.partition("e")
            if rng.random() < 0.5:
                return mantissa + rng.choice(["e", "E"]) + exponent
            return text
        if rng.random() < 0.3:
            return text + "0" * rng.randint(1, 3)  # 1.10
        if rng.random() < 0.3:
            return text + rng.choice(["e0", "E+00", "e-0"])
        return text
    if isinstance(value, str):
        return _write_string(value, rng)
    if isinstance(value, list):
        if not value:
            return "[" + space() + "]"
        inner = ("," + space()).join(space() + write(item, rng) + space() for item in value)
        return "[" + inner + "]"
    if isinstance(value, dict):
        if not value:
            return "{" + space() + "}"
        parts = [
            space() + _write_string(key, rng) + space() + ":" + space() + write(item, rng) + space()
            for key, item in value.items()
        ]
        return "{" + ",".join(parts) + "}"
    raise TypeError(type(value))


def _write_string(text: str, rng: random.Random) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        roll = rng.random()
        if char in _SHORT and (char in '"\\' or code < 0x20):
            out.append(_SHORT[char] if roll < 0.7 else f"\\u{code:04x}")
        elif code < 0x20:
            out.append(f"\\u{code:04X}")
        elif char == "/" and roll < 0.5:
            out.append("\\/")
        elif roll < 0.2:
            if code > 0xFFFF:
                high = 0xD800 + ((code - 0x10000) >> 10)
                low = 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(f"\\u{high:04x}\\u{low:04X}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def body_with(members: dict[str, Any], rng: random.Random, *, bom: bool = False) -> bytes:
    text = rng.choice(SPACES) + write(members, rng) + rng.choice(SPACES)
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


def pairs(raw: bytes) -> list[tuple[str, Any]]:
    """The object's members in order (the generated objects have no duplicate names)."""
    return list(json.loads(raw.decode("utf-8-sig")).items())


GAP_BETWEEN_ELEMENTS = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")
SPACE_ONLY = re.compile(rb"[ \t\n\r]*")


def spans_of(spans: Any) -> tuple[int, int, list[int], list[int]]:
    return spans.start, spans.end, spans.starts, spans.ends


def check_array(raw: bytes, spans: Any, expected: list[Any]) -> None:
    """Each span is its element; between them only spacing and one comma."""
    assert raw[spans.start : spans.start + 1] == b"["
    assert raw[spans.end - 1 : spans.end] == b"]"
    assert [json.loads(raw[a:b]) for a, b in zip(spans.starts, spans.ends, strict=True)] == expected
    if spans.starts:
        assert SPACE_ONLY.fullmatch(raw[spans.start + 1 : spans.starts[0]])
        assert SPACE_ONLY.fullmatch(raw[spans.ends[-1] : spans.end - 1])
    for end, start in zip(spans.ends, spans.starts[1:], strict=False):
        assert GAP_BETWEEN_ELEMENTS.fullmatch(raw[end:start])


# --------------------------------------------------------------------------- scanner


@given(st.dictionaries(st.text(max_size=6), values, max_size=6), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_members_are_the_objects_members_exactly(
    members: dict[str, Any], rng: random.Random
) -> None:
    raw = body_with(members, rng)
    spans = scan_object(raw)
    assert [(m.key, json.loads(raw[m.start : m.end])) for m in spans.members] == pairs(raw)
    previous = spans.start + 1
    for member in spans.members:
        gap = raw[previous : member.key_start]
        assert SPACE_ONLY.fullmatch(gap) or GAP_BETWEEN_ELEMENTS.fullmatch(gap)
        assert json.loads(raw[member.key_start : member.start].rstrip(b" \t\n\r:")) == member.key
        previous = member.end
    assert SPACE_ONLY.fullmatch(raw[previous : spans.end - 1])
    assert SPACE_ONLY.fullmatch(raw[spans.end :])


@given(
    st.lists(values, max_size=8),
    st.dictionaries(st.text(max_size=4), values, max_size=3),
    st.randoms(use_true_random=False),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_elements_found_alike_with_hints_without_and_resumed(
    elements: list[Any], others: dict[str, Any], rng: random.Random
) -> None:
    members = {**others, "messages": elements}
    raw = body_with(members, rng)
    plain = scan_object(raw, elements_of="messages")
    assert plain.elements is not None
    check_array(raw, plain.elements, elements)
    found = plain.elements
    assert found.differs == list(range(len(found)))  # without the parsed elements: unknown
    # The parsed elements as hints (the fast path) find the same spans, whatever the spelling,
    # and name exactly the elements that are not written as orjson writes them.
    parsed = orjson.loads(raw)
    hinted = scan_object(raw, expected=parsed, elements_of="messages")
    assert hinted.members == plain.members and hinted.elements is not None
    assert spans_of(hinted.elements) == spans_of(found)
    for index, (start, end) in enumerate(zip(found.starts, found.ends, strict=True)):
        if index not in hinted.elements.differs:
            assert raw[start:end] == orjson.dumps(parsed["messages"][index])
    # Resuming after any number of known leading elements gives the same spans.
    for known in range(len(found) + 1):
        prefix = type(found)(found.start, 0, found.starts[:known], found.ends[:known])
        assert spans_of(scan_array(raw, found.start, known=prefix)) == spans_of(found)
        resumed = scan_array(raw, found.start, expected=parsed["messages"], known=hinted.elements)
        assert resumed == hinted.elements


@given(st.lists(values, min_size=1, max_size=6), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_compact_bodies_take_the_fast_path_and_agree(
    elements: list[Any], rng: random.Random
) -> None:
    """orjson-written bodies (what most SDKs send) are matched element by element."""
    try:
        raw = orjson.dumps({"model": "m", "messages": elements})
    except TypeError:
        return  # integers past 64 bits: orjson cannot write them
    data = orjson.loads(raw)
    fast = scan_object(raw, expected=data, elements_of="messages")
    plain = scan_object(raw, elements_of="messages")
    assert fast.elements is not None and plain.elements is not None
    assert spans_of(fast.elements) == spans_of(plain.elements)
    assert fast.elements.differs == []  # every element recognised by one comparison
    assert fast.encoded and not plain.encoded
    # Asked for the whole: one comparison says so, and no element is looked for.
    whole = scan_object(raw, expected=data, elements_of="messages", whole=True)
    assert whole.encoded and whole.elements is None and whole.members == fast.members


def test_values_nested_past_the_regex_depth_are_exact() -> None:
    deep_array: Any = 1
    deep_object: Any = "x"
    for level in range(REGEX_DEPTH * 3):
        deep_array = [deep_array, level]
        deep_object = {"k": deep_object, "s": ']}[{"' * (level % 2)}
    elements = [deep_array, {"a": deep_object}, "tail"]
    raw = json.dumps({"messages": elements, "after": deep_object}, indent=1).encode()
    spans = scan_object(raw, elements_of="messages")
    assert spans.elements is not None
    check_array(raw, spans.elements, elements)
    after = spans.last("after")
    assert after is not None and json.loads(raw[after.start : after.end]) == deep_object


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b"{",
        b'{"a" 1}',
        b'{"a":1,}',
        b'{"a":1 "b":2}',
        b'{"a":[1,2}',
        b'{"a":"x}',
        b"{1:2}",
    ],
)
def test_what_is_not_an_object_is_refused(raw: bytes) -> None:
    with pytest.raises(ScanError):
        scan_object(raw, elements_of="a")


# --------------------------------------------------------------------------- lenient reads


@pytest.mark.parametrize(
    ("raw", "model"),
    [
        (b'\xef\xbb\xbf{"model":"gpt-4o","messages":[]}', "gpt-4o"),
        (b'{"messages":[{"role":"user","content":"hi"}],"seed":1e400,"model":"m-1"}', "m-1"),
        (b'{"messages":[{"role":"user","content":"\\ud800"}],"model":"m-2"}', "m-2"),
        (b'{"x":"\xff\xfe bad utf-8","model" : "m-3" }', "m-3"),
        (b'{"model":"first","model":"last"}', "last"),
        (b'{"model":"caf\\u00e9"}', "caf\u00e9"),
        (b'{"n":NaN,"model":"m-4"}', "m-4"),
    ],
    ids=["bom", "1e400", "lone-surrogate", "invalid-utf8", "duplicate", "escaped", "nan"],
)
def test_lenient_model_in_what_orjson_refuses(raw: bytes, model: str) -> None:
    value = lenient_member(raw, "model")
    assert value is not None and decode_string(value) == model


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b'{"messages":[]}', None), (b'{"model":4}', b"4"), (b'{"model":"\\udc00"}', b'"\\udc00"')],
)
def test_lenient_model_absent_or_not_text(raw: bytes, expected: bytes | None) -> None:
    value = lenient_member(raw, "model")
    assert value == expected
    assert value is None or decode_string(value) is None


# --------------------------------------------------------------------------- splice


def _client(raw: bytes, key: str = "messages") -> tuple[ClientBody, dict[str, Any]]:
    data = orjson.loads(raw)
    return ClientBody(raw, data, key), data


@given(
    st.lists(values, max_size=6),
    st.dictionaries(st.text(max_size=4), values, max_size=3),
    st.randoms(use_true_random=False),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_splicing_the_unchanged_list_gives_the_clients_bytes(
    elements: list[Any], others: dict[str, Any], rng: random.Random
) -> None:
    raw = body_with({**others, "messages": elements}, rng, bom=False)
    client, data = _client(raw)
    assert client.with_elements(data["messages"]) == raw
    assert client.with_elements(list(data["messages"]), copies=True) == raw
    # Copies (as a checkpoint gives them back) are the client's bytes too.
    copied = [orjson.loads(orjson.dumps(item)) for item in data["messages"]]
    assert client.with_elements(copied, copies=True) == raw


@given(
    st.lists(values, min_size=1, max_size=6),
    st.dictionaries(st.text(max_size=4).filter(lambda k: k != "messages"), values, max_size=3),
    st.randoms(use_true_random=False),
    st.lists(st.tuples(st.sampled_from(["keep", "drop", "new", "copy"]), new_values), max_size=10),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_changed_list_parses_as_meant_and_the_rest_stays_byte_exact(
    elements: list[Any],
    others: dict[str, Any],
    rng: random.Random,
    edits: list[tuple[str, Any]],
) -> None:
    raw = body_with({**others, "messages": elements}, rng)
    client, data = _client(raw)
    before = scan_object(raw, elements_of="messages")
    assert before.elements is not None
    exact = [raw[a:b] for a, b in zip(before.elements.starts, before.elements.ends, strict=True)]
    originals = data["messages"]
    out_elements: list[Any] = []
    meant: list[Any] = []
    cursor = 0
    for op, value in edits:
        if op in ("keep", "copy") and cursor < len(originals):
            item = originals[cursor]
            out_elements.append(item if op == "keep" else orjson.loads(orjson.dumps(item)))
            meant.append(json.loads(exact[cursor]))  # the client's own value, exactly
            cursor += 1
        elif op == "drop" and cursor < len(originals):
            cursor += 1
        elif op == "new":
            out_elements.append(value)
            meant.append(value)
    out = client.with_elements(out_elements, copies=True)
    assert json.loads(out)["messages"] == meant
    after = scan_object(out, elements_of="messages")
    # Every other member is the client's bytes, in place.
    assert [(m.key, out[m.key_start : m.end]) for m in after.members if m.key != "messages"] == [
        (m.key, raw[m.key_start : m.end]) for m in before.members if m.key != "messages"
    ]
    assert out[: after.start] == raw[: before.start]


def test_exotic_numbers_survive_in_kept_elements_and_other_members() -> None:
    raw = (
        b'{"model":"m","seed":1180591620717411303424,"temperature":1.10,"top_p":1E0,'
        b'"messages":[{"role":"system","content":"s","x":-0.0},'
        b'{"role":"user","content":"old","n":123456789012345678901234567890},'
        b'{"role":"user","content":"new","f":2.50}],"logit_bias":{"1":-100.000}}'
    )
    client, data = _client(raw)
    system, _old, new = data["messages"]
    summary = {"role": "user", "content": "<summary>old</summary>"}
    out = client.with_elements([system, summary, orjson.loads(orjson.dumps(new))], copies=True)
    assert out == (
        b'{"model":"m","seed":1180591620717411303424,"temperature":1.10,"top_p":1E0,'
        b'"messages":[{"role":"system","content":"s","x":-0.0},'
        b'{"role":"user","content":"<summary>old</summary>"},'
        b'{"role":"user","content":"new","f":2.50}],"logit_bias":{"1":-100.000}}'
    )


def test_a_string_input_becomes_the_new_array_in_place() -> None:
    raw = b'{"model":"m","input":"hello","seed":18446744073709551616}'
    client, _ = _client(raw, "input")
    out = client.with_elements([{"role": "user", "content": "hello"}])
    assert out == (
        b'{"model":"m","input":[{"role":"user","content":"hello"}],"seed":18446744073709551616}'
    )


def test_a_duplicated_member_is_written_whole() -> None:
    """Two ``messages`` members: a parser keeps the last and the upstream might keep the first,
    so the body is serialized whole rather than left ambiguous."""
    raw = b'{"messages":[{"role":"user","content":"a"}],"model":"m","messages":[]}'
    client, _ = _client(raw)
    out = client.with_elements([{"role": "user", "content": "b"}])
    assert out == b'{"messages":[{"role":"user","content":"b"}],"model":"m"}'


def test_an_array_written_as_orjson_writes_it_is_written_in_one_call() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "old", "n": 1.5},
        {"role": "user", "content": "caf\u00e9"},
    ]
    raw = b'{"seed": 1180591620717411303424, "messages":' + orjson.dumps(messages) + b"}"
    client, data = _client(raw)
    assert client.spans is not None and client.spans.encoded
    system, _old, new = data["messages"]
    summary = {"role": "user", "content": "<summary>old</summary>"}
    out = client.with_elements([system, summary, orjson.loads(orjson.dumps(new))], copies=True)
    assert out == (
        b'{"seed": 1180591620717411303424, "messages":[{"role":"system","content":"s"},'
        b'{"role":"user","content":"<summary>old</summary>"},'
        b'{"role":"user","content":"caf\xc3\xa9"}]}'
    )
    assert client.with_elements(data["messages"]) == raw


# --------------------------------------------------------------------------- an output limit


LIMITS = ("max_completion_tokens", "max_tokens")


@given(
    st.lists(values, max_size=4),
    st.dictionaries(
        st.text(max_size=4).filter(lambda k: k not in ("messages", *LIMITS)), values, max_size=3
    ),
    st.integers(min_value=1, max_value=2**40),
    st.integers(min_value=1, max_value=2**40),
    st.booleans(),
    st.randoms(use_true_random=False),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_lowered_output_limit_is_the_only_member_that_changes(
    elements: list[Any],
    others: dict[str, Any],
    asked: int,
    forwarded: int,
    with_messages: bool,
    rng: random.Random,
) -> None:
    """With the messages as the client sent them (:meth:`ClientBody.with_members`) or changed
    with it in one splice, every other member is the client's bytes, in place."""
    members = list({**others, "messages": elements, "max_tokens": asked}.items())
    rng.shuffle(members)
    raw = body_with(dict(members), rng)
    client, _ = _client(raw)
    new = [{"role": "user", "content": "<summary>s</summary>"}]
    if with_messages:
        out = client.with_elements(new, members={"max_tokens": forwarded})
    else:
        out = client.with_members({"max_tokens": forwarded})
    parsed = json.loads(out)
    assert parsed["max_tokens"] == forwarded
    assert parsed["messages"] == (new if with_messages else json.loads(raw)["messages"])
    before, after = scan_object(raw), scan_object(out)
    changed = {"max_tokens", "messages"} if with_messages else {"max_tokens"}
    assert [(m.key, out[m.key_start : m.end]) for m in after.members if m.key not in changed] == [
        (m.key, raw[m.key_start : m.end]) for m in before.members if m.key not in changed
    ]
    assert [m.key for m in after.members] == [m.key for m in before.members]
    assert out[: after.start] == raw[: before.start]
    assert out[after.end :] == raw[before.end :]


def test_nothing_to_change_is_the_clients_bytes() -> None:
    raw = b'{ "model" : "m", "messages":[], "max_tokens": 32000 , "seed":1180591620717411303424}'
    client, _ = _client(raw)
    assert client.with_members({}) == raw
    assert client.with_members({"max_tokens": 21_000}) == (
        b'{ "model" : "m", "messages":[], "max_tokens": 21000 , "seed":1180591620717411303424}'
    )


def test_a_duplicated_limit_is_written_whole() -> None:
    """Two ``max_tokens``: which one the upstream reads is unknown, so the body is written
    whole with one (as a duplicated ``messages`` is)."""
    raw = b'{"model":"m","max_tokens":32000,"messages":[],"max_tokens":32000}'
    client, _ = _client(raw)
    assert client.with_members({"max_tokens": 9000}) == (
        b'{"model":"m","max_tokens":9000,"messages":[]}'
    )


def test_the_limits_lowered_are_those_that_ask_more() -> None:
    lowered = OutputLimit(32_000, 20_000, True)
    body = {"max_completion_tokens": 32_000, "max_tokens": 16_000, "n": 1}
    assert lowered_limits(body, LIMITS, lowered) == {"max_completion_tokens": 20_000}
    both = {"max_completion_tokens": 32_000, "max_tokens": 64_000}
    assert lowered_limits(both, LIMITS, lowered) == {
        "max_completion_tokens": 20_000,
        "max_tokens": 20_000,
    }
    # Never added, never raised, never a value that is not a count.
    assert lowered_limits({"max_tokens": True, "max_completion_tokens": "9"}, LIMITS, lowered) == {}
    assert lowered_limits({}, LIMITS, lowered) == {}
    assert lowered_limits(body, LIMITS, OutputLimit(32_000, 32_000, False)) == {}
    assert lowered_limits(body, LIMITS, None) == {}
