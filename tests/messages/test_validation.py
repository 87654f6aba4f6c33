"""What the Messages format refuses before compacting a request, and what it lets through.

Only what compaction reads is checked (roles, the blocks that pair, the content it counts or
edits): a request failing a check would fail upstream too, and gets a 400 naming the field.
Anthropic's error shape has no ``param``, so the message itself must name the path. Block
types and fields the proxy does not read are the upstream's to judge and pass untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.compaction.validation import MAX_CONTENT_PARTS
from compaction_proxy.http import ProxyError
from compaction_proxy.wire.messages import MESSAGES, validate_request
from compaction_proxy.wire.messages._validation import MAX_MESSAGES

DEEP: Any = "x"
for _ in range(80):
    DEEP = [DEEP]

OK_USER = {"role": "user", "content": "go"}
CALLED = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
}


def block(**fields: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", **fields}


def use(**fields: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}, **fields}


def at_three(*content: Any, role: str = "user") -> dict[str, Any]:
    """A body whose fourth message (``messages.3``) holds ``content``."""
    return {
        "model": "claude-sonnet-4-5",
        "messages": [
            OK_USER,
            CALLED,
            {"role": "user", "content": [block()]},
            {"role": role, "content": list(content)},
        ],
    }


CASES: list[tuple[dict[str, Any], str]] = [
    ({"model": "m"}, "messages"),
    ({"messages": {"role": "user"}}, "messages"),
    ({"messages": [OK_USER] * (MAX_MESSAGES + 1)}, "messages"),
    ({"messages": [OK_USER, "hi"]}, "messages.1"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages.0.content"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1),
                }
            ]
        },
        "messages.0.content",
    ),
    (at_three({"text": "no type"}), "messages.3.content.0.type"),
    (at_three({"type": 5}), "messages.3.content.0.type"),
    (at_three("a bare string"), "messages.3.content.0.type"),
    (at_three({"type": "text", "text": 3}), "messages.3.content.0.text"),
    (at_three({"type": "text"}), "messages.3.content.0.text"),
    (at_three(use()), "messages.3.content.0"),  # a tool_use in a user message
    (at_three(use(id=""), role="assistant"), "messages.3.content.0.id"),
    (at_three(use(id=7), role="assistant"), "messages.3.content.0.id"),
    (at_three(use(name=None), role="assistant"), "messages.3.content.0.name"),
    (at_three(use(input="{}"), role="assistant"), "messages.3.content.0.input"),
    (
        at_three({"type": "tool_use", "id": "t", "name": "n"}, role="assistant"),
        "messages.3.content.0.input",
    ),
    (at_three(block(), role="assistant"), "messages.3.content.0"),  # a result from the model
    (at_three(block(tool_use_id="")), "messages.3.content.0.tool_use_id"),
    (at_three({"type": "tool_result", "content": "x"}), "messages.3.content.0.tool_use_id"),
    (at_three(block(content=3)), "messages.3.content.0.content"),
    (at_three(block(content={"type": "text", "text": "x"})), "messages.3.content.0.content"),
    (at_three(block(content=[{"text": "x"}])), "messages.3.content.0.content.0.type"),
    (at_three(block(content=["x"])), "messages.3.content.0.content.0.type"),
    ({"messages": [{"role": "user", "content": "x", "deep": DEEP}]}, "messages.0"),
    (at_three({"type": "future_block", "deep": DEEP}), "messages.3"),
    ({"messages": [OK_USER], "system": 7}, "system"),
    ({"messages": [OK_USER], "system": {"type": "text", "text": "s"}}, "system"),
    ({"messages": [OK_USER], "system": ["s"]}, "system.0"),
    ({"messages": [OK_USER], "system": [{"type": "image", "source": {}}]}, "system.0"),
    ({"messages": [OK_USER], "system": [{"type": "text", "text": None}]}, "system.0"),
    ({"messages": [OK_USER], "tools": {"name": "Bash"}}, "tools"),
    ({"messages": [OK_USER], "tools": ["Bash"]}, "tools.0"),
    ({"messages": [OK_USER], "system": [{"type": "text", "text": "s", "x": DEEP}]}, "system"),
    ({"messages": [OK_USER], "tools": [{"name": "Bash", "input_schema": DEEP}]}, "tools"),
]


@pytest.mark.parametrize(("body", "param"), CASES)
def test_a_bad_request_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ProxyError) as info:
        MESSAGES.lift(body)
    error = info.value
    assert (error.status, error.param, error.code) == (400, param, "invalid_messages"), error
    assert error.type == "invalid_request_error"
    # Anthropic's shape has no param: its message names the path
    sent = orjson.loads(MESSAGES.error_body(error.message, type=error.type, code=error.code))
    assert sent["error"]["type"] == "invalid_request_error"
    assert names(sent["error"]["message"], param), sent
    issue = validate_request(body)
    assert issue is not None and issue.param == param


def names(message: str, param: str) -> bool:
    """``message`` names ``param``: whole, or as its element and the field in question
    ("messages.3.content.0 must be an object with a string 'type'")."""
    element, _, field = param.rpartition(".")
    return param in message or (bool(element) and element in message and f"'{field}'" in message)


def test_lift_checks_even_when_asked_not_to() -> None:
    with pytest.raises(ProxyError):
        MESSAGES.lift({"messages": [{"role": "robot", "content": "x"}]}, check=False)


def test_what_compaction_does_not_read_goes_through() -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "tools": [
            {"name": "Bash", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
            {"type": "future_tool"},
        ],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "future_field": {"anything": [1, 2, 3]},
        "messages": [
            {"role": "system", "content": "a note"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "citations": None},
                    {"type": "image", "source": {"type": "file", "file_id": "f"}},
                    {"type": "document", "source": {"type": "url", "url": "https://e.x"}},
                    {"type": "future_block", "payload": {"nested": [1]}},
                    {"type": "search_result", "source": "s", "title": "t", "content": []},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": ""},
                    {"type": "redacted_thinking"},
                    {
                        "type": "server_tool_use",
                        "id": "srvtoolu_1",
                        "name": "web_search",
                        "input": {},
                    },
                    {
                        "type": "web_search_tool_result",
                        "tool_use_id": "srvtoolu_1",
                        "content": {"x": 1},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"a": [1]},
                        "extra": 1,
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_9",
                        "content": [{"type": "future"}],
                    },
                    {"type": "text", "text": "<system-reminder>r</system-reminder>"},
                ],
                "x-extra": True,
            },
            {"role": "assistant", "content": ""},
            {"role": "user", "content": []},
        ],
    }
    assert validate_request(body) is None
    view = MESSAGES.lift(body)
    assert all(
        a is b
        for a, b in zip(view.lower(view.chat["messages"]).items, body["messages"], strict=True)
    )
    assert validate_request({"messages": []}) is None
