from __future__ import annotations

import pytest

from proxy.compaction import validate_messages

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
