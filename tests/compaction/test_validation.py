from __future__ import annotations

import pytest

from compaction_proxy.compaction import validate_messages

from .helpers import a, call, s, tool, u


def test_valid_conversations_pass_including_orphans() -> None:
    assert validate_messages([s(), u(), call("c1"), tool("c1"), a()]) is None
    assert validate_messages([u(), tool("nobody-called-me")]) is None
    assert validate_messages([{"role": "developer", "content": "x"}, u()]) is None


@pytest.mark.parametrize(
    ("messages", "param", "fragment"),
    [
        ({"role": "user"}, "messages", "must be an array"),
        ([], "messages", "at least one"),
        ([u(), "text"], "messages[1]", "must be an object"),
        ([{"content": "x"}], "messages[0].role", "required"),
        ([{"role": "critic", "content": "x"}], "messages[0].role", "'critic' is not supported"),
        ([u(), {"role": "tool", "content": "x"}], "messages[1].tool_call_id", "tool_call_id"),
        ([u(), {"role": "function", "content": "x"}], "messages[1].name", "name"),
        ([{"role": "user", "content": 5}], "messages[0].content", "content must be"),
        ([u(), {"role": "assistant", "tool_calls": {}}], "messages[1].tool_calls", "array"),
        (
            [u(), {"role": "assistant", "tool_calls": [{"type": "function"}]}],
            "messages[1].tool_calls[0].id",
            "string 'id'",
        ),
    ],
)
def test_invalid_shapes(messages: object, param: str, fragment: str) -> None:
    issue = validate_messages(messages)
    assert issue is not None
    assert issue.param == param
    assert fragment in issue.message


def nested(depth: int) -> object:
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("content", "param", "fragment"),
    [
        ([nested(300)], "messages[1].content[0]", "must be a content part object"),
        ([{"type": "text", "text": "x", "extra": nested(300)}], "messages[1].content[0]", "nested"),
        (["just a string"], "messages[1].content[0]", "not a string"),
        ([{"text": "no type"}], "messages[1].content[0].type", "string 'type'"),
        ([{"type": "text", "text": 7}], "messages[1].content[0].text", "string 'text'"),
        ([{"type": "text", "text": "x"}] * 10_001, "messages[1].content", "at most 10000"),
    ],
)
def test_content_parts_are_checked(content: object, param: str, fragment: str) -> None:
    issue = validate_messages([s(), {"role": "user", "content": content}])
    assert issue is not None
    assert issue.param == param
    assert fragment in issue.message


def test_deep_nesting_outside_content_is_refused_too() -> None:
    message = {**a(), "metadata": nested(200)}
    issue = validate_messages([u(), message])
    assert issue is not None and issue.param == "messages[1].metadata"


def test_real_content_parts_pass() -> None:
    content = [
        {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},  # vLLM's own
    ]
    assert validate_messages([{"role": "user", "content": content}]) is None
    assert validate_messages([u(), {**a(), "metadata": nested(40)}]) is None


def test_size_issue_counts_entries_then_parts_across_them() -> None:
    from compaction_proxy.compaction.validation import SizeLimits, size_issue

    limits = SizeLimits(max_messages=3, max_content_parts=4)
    parts = [{"type": "text", "text": "p"}] * 2
    assert size_issue([{"content": parts}, {"content": parts}], limits, param="messages") is None
    many = size_issue([{}] * 4, limits, param="input")
    assert many is not None and (many.code, many.param) == ("too_many_messages", "input")
    assert "server.max_messages" in many.message
    three = [{"content": parts}, {"content": parts}, {"output": parts[:1]}]
    over = size_issue(three, limits, param="messages")
    assert over is not None and over.code == "too_many_content_parts"
    assert "5 content parts" in over.message and "server.max_content_parts" in over.message
    assert size_issue("a string input", limits, param="input") is None
