"""What the adapter refuses before compacting a Responses request, and what it lets through.

Only what compaction reads is checked (roles, pairing ids, the content it counts or edits);
the upstream judges the rest, so unknown item types and fields must pass untouched.
"""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.wire.responses import validate_request

DEEP: Any = "x"
for _ in range(80):
    DEEP = [DEEP]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 7}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": {"text": "x"}}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]},
            "input[0].content[0].text",
        ),
        ({"input": [{"type": 5}]}, "input[0].type"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
            "input[0].arguments",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
            "input[0].output",
        ),
        (
            {"input": [{"type": "local_shell_call_output", "id": "c", "output": ["x"]}]},
            "input[0].output",
        ),
        (
            {"input": [{"type": "mcp_approval_response", "approve": True}]},
            "input[0].approval_request_id",
        ),
        ({"input": [{"type": "future_thing", "deep": DEEP}]}, "input[0]"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": "x", "tools": {"type": "function"}}, "tools"),
        ({"input": "x", "tools": ["f"]}, "tools[0]"),
    ],
)
def test_a_bad_request_names_the_field(body: dict[str, Any], param: str) -> None:
    issue = validate_request(body)
    assert issue is not None and issue.param == param, issue
    assert issue.message


def test_what_compaction_does_not_read_goes_through() -> None:
    body = {
        "model": "gpt-4o",
        "instructions": "be brief",
        "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}],
        "input": [
            {"role": "user", "content": "easy message"},
            {"type": "message", "role": "user", "content": [{"type": "input_audio", "x": 1}]},
            {"id": "msg_stored"},  # an item reference
            {"type": "future_thing", "anything": {"nested": [1, 2, 3]}},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "apply_patch_call_output", "call_id": "p1", "status": "completed"},
        ],
    }
    assert validate_request(body) is None
    assert validate_request({"input": "just text"}) is None
