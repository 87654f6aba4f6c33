"""The hostile request bodies of test_hostile_bodies.py: a fixed, deterministic list.

Every case is built twice: short (a handful of messages) and padded past the 4k window of the
test model (old turns with tool calls and long results), so each one also meets the code that
counts, groups and compacts a conversation, not only the JSON parser. No randomness: the same
bytes every run, so a failure reproduces from its test id alone.

A case says what the proxy must do with it: refuse it itself (400, with the ``param`` it must
name, or ``None`` for a body that is not a JSON object at all), or ``ANY``: forward it or
refuse it, either is fine, as long as the general rules hold (no 5xx, OpenAI's error shape, a
valid forward).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODEL = "tiny-4k"
WINDOW = 4096
HOSTILE_AT = 3  # where a hostile message sits among the old messages
DEEP = 300  # nesting depth of the "deep" cases

Message = dict[str, Any]


class _Any:
    """Marker: the proxy may forward the case or refuse it."""

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
BODY = "<body>"  # the expected param of a refusal about the body as a whole (param null)


@dataclass(frozen=True)
class Case:
    """One hostile body. ``build(padded)`` returns its bytes; ``refusal`` is the param the
    proxy's 400 must name (a prefix for message paths), :data:`BODY` for a body-level 400
    with a null param, or :data:`ANY`."""

    name: str
    build: Callable[[bool], bytes]
    refusal: str | _Any
    content_type: str = "application/json"
    sdk: bool = False  # a JSON object the openai SDK can send as it is


# --------------------------------------------------------------------------- conversations


def _filler(label: str, words: int) -> str:
    """Distinct text per case and position, so no case reuses another's checkpoint."""
    return " ".join(f"{label}-{i % 97}" for i in range(words))


def conversation(padded: bool, label: str) -> list[Message]:
    """System, an opening exchange, then (padded) old turns with tool calls, then a question.

    The hostile message goes at :data:`HOSTILE_AT` (or last); the padding takes the prompt to
    about twice the test model's window, so compaction fires on every padded case.
    """
    messages: list[Message] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "what next?"},
    ]
    if padded:
        for turn in range(6):
            call_id = f"call_{label}_{turn}"
            messages += [
                {"role": "user", "content": _filler(f"{label}-q{turn}", 180)},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "x"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": _filler(f"{label}-r", 400)},
                {"role": "assistant", "content": _filler(f"{label}-a{turn}", 60)},
            ]
    messages.append({"role": "user", "content": "and now?"})
    return messages


def body_with(padded: bool, label: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": conversation(padded, label), **fields}


def dumps(value: Any) -> bytes:
    """Python's json (not orjson): it writes integers past 64 bits, which orjson refuses."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- the cases


WRONG_VALUES: dict[str, Any] = {
    "number": 5,
    "float": 2.5,
    "null": None,
    "true": True,
    "string": "oops",
    "array": [1, "two"],
    "object": {"a": 1},
}


def _top_level_cases() -> list[Case]:
    cases: list[Case] = []
    for name, value in WRONG_VALUES.items():
        if name != "string":
            cases.append(_field_case(f"model-{name}", "model", value, "model"))
        if name != "array":
            cases.append(_field_case(f"messages-{name}", "messages", value, "messages"))
    extra_wrong = {
        "tools": [5, "tools", [1], [{"type": "function", "function": 5}], [{"function": {}}]],
        "tool_choice": [5, {"type": 3}],
        "max_tokens": ["100", -5, 1e30, 10**30, True, [1]],
        "max_completion_tokens": ["x", -1, 10**30, 2.5],
        "stream": ["yes", 1, {}, None],
        "stream_options": ["x", {"include_usage": "yes"}],
        "temperature": ["hot"],
        "n": ["two"],
        "response_format": [5],
    }
    for key, values in extra_wrong.items():
        for index, value in enumerate(values):
            cases.append(_field_case(f"{key}-{index}", key, value, ANY))
    tools_schema = [
        {
            "type": "function",
            "function": {
                "name": 5,
                "parameters": {"type": "object", "properties": {"a": {"type": ["x", 5]}}},
            },
        }
    ]
    cases.append(_field_case("tools-bad-schema", "tools", tools_schema, ANY))
    cases.append(
        Case(
            "messages-empty",
            lambda padded: dumps({"model": MODEL, "messages": []}),
            ANY,
            sdk=True,
        )
    )
    cases.append(
        Case(
            "messages-missing",
            lambda padded: dumps({"model": MODEL}),
            "messages",
        )
    )
    cases.append(
        Case(
            "model-missing",
            lambda padded: dumps({"messages": conversation(padded, "model-missing")}),
            "model",
        )
    )
    return cases


def _field_case(name: str, key: str, value: Any, refusal: str | _Any) -> Case:
    def build(padded: bool) -> bytes:
        body = body_with(padded, name)
        body[key] = value
        return dumps(body)

    return Case(name, build, refusal, sdk=key not in ("model", "messages"))


MESSAGE_WRONG: list[tuple[str, Message, str | _Any]] = [
    # (name, the hostile message, the param suffix the 400 must name, or ANY)
    ("not-an-object", "just text", ""),  # type: ignore[list-item]
    ("role-number", {"role": 5, "content": "x"}, ".role"),
    ("role-null", {"role": None, "content": "x"}, ".role"),
    ("role-missing", {"content": "x"}, ".role"),
    ("role-unknown", {"role": "robot", "content": "x"}, ".role"),
    ("role-object", {"role": {"a": 1}, "content": "x"}, ".role"),
    ("content-number", {"role": "user", "content": 5}, ".content"),
    ("content-true", {"role": "user", "content": True}, ".content"),
    ("content-object", {"role": "user", "content": {"text": "x"}}, ".content"),
    ("content-part-number", {"role": "user", "content": [5]}, ".content[0]"),
    ("content-part-string", {"role": "user", "content": ["x"]}, ".content[0]"),
    ("content-part-empty", {"role": "user", "content": [{}]}, ".content[0]"),
    ("content-part-type-number", {"role": "user", "content": [{"type": 5}]}, ".content[0]"),
    (
        "content-text-number",
        {"role": "user", "content": [{"type": "text", "text": 5}]},
        ".content[0]",
    ),
    (
        "content-second-part-bad",
        {"role": "user", "content": [{"type": "text", "text": "ok"}, None]},
        ".content[1]",
    ),
    (
        "image-url-number",
        {"role": "user", "content": [{"type": "image_url", "image_url": 5}]},
        ANY,
    ),
    (
        "image-url-url-number",
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]},
        ANY,
    ),
    (
        "image-bad-base64",
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}],
        },
        ANY,
    ),
    ("tool-calls-string", {"role": "assistant", "tool_calls": "x"}, ".tool_calls"),
    ("tool-calls-number-item", {"role": "assistant", "tool_calls": [5]}, ".tool_calls[0]"),
    ("tool-calls-empty-item", {"role": "assistant", "tool_calls": [{}]}, ".tool_calls[0]"),
    ("tool-calls-id-number", {"role": "assistant", "tool_calls": [{"id": 5}]}, ".tool_calls[0]"),
    (
        "tool-calls-function-number",
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": 5}]},
        ANY,
    ),
    (
        "tool-calls-arguments-object",
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": 5, "arguments": {}}}
            ],
        },
        ANY,
    ),
    ("tool-call-id-number", {"role": "tool", "tool_call_id": 5, "content": "x"}, ".tool_call_id"),
    ("tool-call-id-missing", {"role": "tool", "content": "x"}, ".tool_call_id"),
    ("tool-content-object", {"role": "tool", "tool_call_id": "c9", "content": {}}, ".content"),
    ("function-name-number", {"role": "function", "name": 5, "content": "x"}, ".name"),
    ("name-number-user", {"role": "user", "name": 5, "content": "x"}, ANY),
    ("name-object-assistant", {"role": "assistant", "name": {"a": 1}, "content": "x"}, ANY),
    ("name-huge", {"role": "user", "name": "n" * 100_000, "content": "x"}, ANY),
    ("orphan-tool-result", {"role": "tool", "tool_call_id": "nobody", "content": "x"}, ANY),
    ("content-null-user", {"role": "user", "content": None}, ANY),
    (
        "deep-extra-field",
        {"role": "user", "content": "x", "extra": json.loads("[" * DEEP + "]" * DEEP)},
        ".extra",
    ),
]


def _message_cases() -> list[Case]:
    cases: list[Case] = []
    for name, message, suffix in MESSAGE_WRONG:
        for where in ("old", "newest"):
            cases.append(_message_case(f"msg-{name}-{where}", message, suffix, where == "newest"))
    return cases


def _message_case(name: str, message: Any, suffix: str | _Any, newest: bool) -> Case:
    def build(padded: bool) -> bytes:
        messages = conversation(padded, name)
        if newest:
            messages.append(message)
        else:
            messages.insert(HOSTILE_AT, message)
        return dumps({"model": MODEL, "messages": messages})

    if isinstance(suffix, _Any):
        refusal: str | _Any = ANY
    else:
        # The newest message's index differs between the short and the padded build: "-1"
        # stands for it (see expected_param()).
        refusal = f"messages[{'-1' if newest else HOSTILE_AT}]{suffix}"
    return Case(name, build, refusal, sdk=True)


def expected_param(case: Case, body: bytes) -> str | _Any:
    """The param a refusal of ``case`` must start with, ``messages[-1]`` resolved to the index
    of the newest message in ``body`` (it differs between the short and the padded build)."""
    refusal = case.refusal
    marker = "messages[-1]"
    if isinstance(refusal, str) and refusal.startswith(marker):
        newest = len(json.loads(body)["messages"]) - 1
        return f"messages[{newest}]" + refusal[len(marker) :]
    return refusal


def _deep(open_: bytes, close: bytes, depth: int = DEEP, inner: bytes = b"1") -> bytes:
    return open_ * depth + inner + close * depth


def _splice(padded: bool, label: str, extra: bytes) -> bytes:
    """A valid body with ``extra`` (raw JSON members) spliced in after the model."""
    messages = dumps(conversation(padded, label))
    return b'{"model": "' + MODEL.encode() + b'", ' + extra + b', "messages": ' + messages + b"}"


def _with_last_content(padded: bool, label: str, content: bytes) -> bytes:
    """A valid body whose newest user message has ``content`` (raw JSON) as its content."""
    messages = dumps(conversation(padded, label)[:-1])
    return (
        b'{"model": "'
        + MODEL.encode()
        + b'", "messages": '
        + messages[:-1]
        + b', {"role": "user", "content": '
        + content
        + b"}]}"
    )


def _image_body(padded: bool, label: str, newest: bool) -> bytes:
    """A several-MB PNG data URL, in the newest message or in an old one."""
    payload = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (3 * 4096)  # ~3 MB before base64
    url = "data:image/png;base64," + base64.b64encode(payload).decode()
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        ],
    }
    messages = conversation(padded, label)
    if newest:
        messages.append(image)
    else:
        messages[HOSTILE_AT:HOSTILE_AT] = [image, {"role": "assistant", "content": "a picture"}]
    return dumps({"model": MODEL, "messages": messages})


def _raw_cases() -> list[Case]:
    deep_arrays = _deep(b"[", b"]")
    deep_objects = _deep(b'{"a": ', b"}")
    return [
        Case(
            "deep-user-content",
            lambda p: _with_last_content(p, "duc", deep_arrays),
            "messages[-1].content[0]",
        ),
        Case("deep-unknown-field", lambda p: _splice(p, "duf", b'"x": ' + deep_arrays), ANY),
        Case("deep-unknown-object", lambda p: _splice(p, "duo", b'"x": ' + deep_objects), ANY),
        Case(
            "deep-tool-schema",
            lambda p: _splice(
                p,
                "dts",
                b'"tools": [{"type": "function", "function": {"name": "f", "parameters": '
                + deep_objects
                + b"}}]",
            ),
            ANY,
        ),
        Case(
            "deeper-than-the-parser",
            lambda p: _splice(p, "dtp", b'"x": ' + _deep(b"[", b"]", 5000)),
            ANY,
        ),
        Case(
            "huge-string-content",
            lambda p: _with_last_content(p, "hsc", b'"' + b"z" * 4_000_000 + b'"'),
            ANY,
        ),
        Case(
            "huge-words-content",
            lambda p: _with_last_content(p, "hwc", dumps(" ".join(["word"] * 600_000))),
            ANY,
        ),
        Case(
            "huge-model-name",
            lambda p: _splice(p, "hmn", b'"model": "' + b"m" * 1_000_000 + b'"'),
            ANY,
        ),
        Case(
            "huge-unknown-field",
            lambda p: _splice(p, "huf", b'"x": "' + b"y" * 3_000_000 + b'"'),
            ANY,
        ),
        Case("big-image-newest", lambda p: _image_body(p, "bin", True), ANY),
        Case("big-image-old", lambda p: _image_body(p, "bio", False), ANY),
        Case(
            "invalid-utf8-content",
            lambda p: _with_last_content(p, "iuc", b'"caf\xc3 \xff\xfe end"'),
            BODY,
        ),
        Case("invalid-utf8-key", lambda p: _splice(p, "iuk", b'"\xff": 1'), BODY),
        Case("overlong-utf8", lambda p: _with_last_content(p, "ou8", b'"\xc0\xaf"'), BODY),
        Case("lone-surrogate-escape", lambda p: _with_last_content(p, "lse", b'"\\ud800 x"'), ANY),
        Case("nul-escape", lambda p: _with_last_content(p, "nul", b'"a\\u0000b"'), ANY),
        Case("nan-literal", lambda p: _splice(p, "nan", b'"temperature": NaN'), BODY),
        Case("infinity-literal", lambda p: _splice(p, "inf", b'"max_tokens": Infinity'), BODY),
        Case("minus-infinity-literal", lambda p: _splice(p, "minf", b'"top_p": -Infinity'), BODY),
        Case("huge-exponent", lambda p: _splice(p, "hexp", b'"max_tokens": 1e999'), ANY),
        Case(
            "duplicate-messages-last-bad",
            lambda p: _splice(p, "dmb", b'"messages": "first"')[:-1] + b', "messages": "oops"}',
            "messages",
        ),
        Case(
            "duplicate-messages-first-bad",
            lambda p: _splice(p, "dmf", b'"messages": "oops"'),
            ANY,
        ),
        Case(
            "duplicate-model",
            lambda p: _splice(p, "dmo", b'"model": "gpt-4o"'),
            ANY,
        ),
        Case("empty-body", lambda p: b"", BODY),
        Case("whitespace-body", lambda p: b" \r\n\t ", BODY),
        Case("array-body", lambda p: dumps([body_with(p, "arr")]), BODY),
        Case("number-body", lambda p: b"42", BODY),
        Case("string-body", lambda p: dumps("hello"), BODY),
        Case("null-body", lambda p: b"null", BODY),
        Case("truncated-body", lambda p: dumps(body_with(p, "trunc"))[:-9], BODY),
        Case("trailing-garbage", lambda p: dumps(body_with(p, "tg")) + b" }{", BODY),
        Case("bom-prefix", lambda p: b"\xef\xbb\xbf" + dumps(body_with(p, "bom")), ANY),
        Case(
            "text-plain-json",
            lambda p: dumps(body_with(p, "tpj")),
            ANY,
            content_type="text/plain",
        ),
        Case(
            "form-encoded",
            lambda p: b"model=" + MODEL.encode() + b"&messages=hello" + (b"&x=1" * 3000 * p),
            BODY,
            content_type="application/x-www-form-urlencoded",
        ),
        Case(
            "multipart",
            lambda p: (
                b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
                + MODEL.encode()
                + b"\r\n--b--\r\n"
            ),
            BODY,
            content_type="multipart/form-data; boundary=b",
        ),
    ]


def all_cases() -> list[Case]:
    """Every case, names unique (they are test ids)."""
    cases = [*_top_level_cases(), *_message_cases(), *_raw_cases()]
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return cases


def sdk_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """``chat.completions.create`` keyword arguments for a body: model and messages as they
    are, everything else through ``extra_body`` so the SDK sends it untouched."""
    rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
    return {"model": body["model"], "messages": body["messages"], "extra_body": rest}
