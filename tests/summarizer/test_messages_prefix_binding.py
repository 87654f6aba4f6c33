"""The Messages prefix-form summary call on Anthropic's own API asks ``drop_block`` when its
prefix replays signed thinking: the forwarded request does (compaction changed what comes
before those blocks), and a model that binds thinking to its prefix would refuse the call."""

from __future__ import annotations

from typing import Any

from compaction_proxy.api._requests import native_request
from compaction_proxy.wire import Lowered, NativeRequest, PrefixCall
from compaction_proxy.wire.messages import MESSAGES
from compaction_proxy.wire.messages._summary import MESSAGES_SUMMARY

SIGNED = {"type": "thinking", "thinking": "", "signature": "c2ln"}
FORWARDED: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix the parser."},
    {
        "role": "assistant",
        "content": [SIGNED, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
]
BODY = {
    "model": "claude-fable-5-1",
    "max_tokens": 32_000,
    "thinking": {"type": "adaptive"},
    "messages": FORWARDED,
}


def call(native: bool, thinking: Any = BODY["thinking"]) -> PrefixCall:
    body = {**BODY, "thinking": thinking}
    view = MESSAGES.lift(body)
    request = NativeRequest(body, lambda _m: Lowered(FORWARDED), {}, native)
    return PrefixCall(request, view.chat["messages"], len(view.chat["messages"]), (), "Sum up.")


def prefix_body(native: bool, thinking: Any = BODY["thinking"]) -> dict[str, Any]:
    assert MESSAGES_SUMMARY.prefix is not None
    return MESSAGES_SUMMARY.prefix({}, "claude-fable-5-1", call(native, thinking), 2_000)


def test_on_anthropics_api_the_call_asks_drop_block() -> None:
    body = prefix_body(native=True)
    assert body["thinking"] == {
        "type": "adaptive",
        "block_binding": {"prefix_mismatch_behavior": "drop_block"},
    }
    assert body["messages"][1]["content"][0] is SIGNED  # the block itself, replayed


def test_elsewhere_or_by_the_clients_choice_the_thinking_goes_as_sent() -> None:
    assert prefix_body(native=False)["thinking"] == {"type": "adaptive"}
    own = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}}
    assert prefix_body(native=True, thinking=own)["thinking"] == own


def test_the_beta_is_listed_on_the_calls_repeated_headers_for_anthropics_api() -> None:
    scope = {"headers": [(b"anthropic-beta", b"claude-code-20250219")]}
    view = MESSAGES.lift(dict(BODY))
    native = native_request(scope, MESSAGES, BODY, view, native=True)
    assert native is not None
    assert native.headers["anthropic-beta"] == (
        "claude-code-20250219, thinking-binding-controls-2026-08-01"
    )
    local = native_request(scope, MESSAGES, BODY, view)
    assert local is not None and local.headers["anthropic-beta"] == "claude-code-20250219"
