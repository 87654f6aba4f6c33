"""Preserved thinking: the Messages format's amendment of a compacted request
(compaction_proxy/wire/messages/_binding.py), the member it writes into the client's bytes
(compaction_proxy/wire/_forwarded.py) and the beta appended to the request's header
(compaction_proxy/upstream/_headers.py)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from compaction_proxy.upstream import with_listed
from compaction_proxy.wire import ClientBody, UpstreamTraits
from compaction_proxy.wire.chat import CHAT
from compaction_proxy.wire.messages import (
    BINDING_BETA,
    MESSAGES,
    thinking_binding,
    unbound_blocks,
)
from compaction_proxy.wire.responses import RESPONSES

NATIVE = UpstreamTraits(native=True)
LOCAL = UpstreamTraits()
DROP = {"prefix_mismatch_behavior": "drop_block"}


def thought(n: int, *, text: str = "") -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": f"sig-{n}"}


def turn(n: int) -> list[dict[str, Any]]:
    """One tool step: the model's turn (signed thinking first) and its result."""
    return [
        {
            "role": "assistant",
            "content": [
                thought(n),
                {"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": f"out {n}"}],
        },
    ]


def body(thinking: Any = None, steps: int = 4) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do the task"}]
    for n in range(steps):
        messages += turn(n)
    out: dict[str, Any] = {"model": "claude-fable-5-1", "max_tokens": 1024, "messages": messages}
    if thinking is not None:
        out["thinking"] = thinking
    return out


def summarized(data: dict[str, Any], keep: int) -> list[Any]:
    """A summary in place of all but the newest ``keep`` messages (the client's own objects)."""
    summary = {"role": "user", "content": [{"type": "text", "text": "[summary]"}]}
    return [summary, *data["messages"][-keep:]]


def test_a_summary_before_signed_thinking_asks_drop_block_under_the_beta() -> None:
    data = body({"type": "adaptive", "display": "omitted"})
    amendment = thinking_binding(data, summarized(data, 4), NATIVE)
    assert amendment is not None
    assert amendment.members == {
        "thinking": {"type": "adaptive", "display": "omitted", "block_binding": DROP}
    }
    assert amendment.listed == (("anthropic-beta", BINDING_BETA),)
    assert amendment.notes == (
        "thinking.block_binding set to drop_block: compaction changed what comes before 2 "
        "signed thinking blocks; the API drops those whose prefix no longer matches",
    )
    assert data["thinking"] == {"type": "adaptive", "display": "omitted"}  # not edited


def test_a_manual_budget_is_kept_and_no_thinking_param_becomes_adaptive() -> None:
    manual = body({"type": "enabled", "budget_tokens": 2048})
    amendment = thinking_binding(manual, summarized(manual, 2), NATIVE)
    assert amendment is not None
    assert amendment.members["thinking"] == {
        "type": "enabled",
        "budget_tokens": 2048,
        "block_binding": DROP,
    }
    bare = body()
    amendment = thinking_binding(bare, summarized(bare, 2), NATIVE)
    assert amendment is not None
    assert amendment.members["thinking"] == {"type": "adaptive", "block_binding": DROP}
    assert "1 signed thinking block;" in amendment.notes[0]


@pytest.mark.parametrize(
    "thinking",
    [
        {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "error"}},
        {"type": "adaptive", "block_binding": DROP},
        {"type": "disabled"},
        "adaptive",  # not an object: the upstream's to refuse
    ],
)
def test_the_clients_own_choice_wins(thinking: Any) -> None:
    data = body(thinking)
    assert thinking_binding(data, summarized(data, 4), NATIVE) is None


def test_never_for_an_upstream_that_is_not_anthropics() -> None:
    data = body({"type": "adaptive"})
    assert thinking_binding(data, summarized(data, 4), LOCAL) is None


def test_never_when_nothing_before_a_signed_block_changed() -> None:
    data = body({"type": "adaptive"})
    same = list(data["messages"])
    assert thinking_binding(data, same, NATIVE) is None
    # A checkpoint copy equals the client's message: no change.
    assert thinking_binding(data, copy.deepcopy(same), NATIVE) is None
    # Only the newest result cleared: no thinking follows it.
    cleared = [*same[:-1], {**same[-1], "content": "[cleared]"}]
    assert thinking_binding(data, cleared, NATIVE) is None
    # The conversation opens with a string, forwarded in block form: the same prefix.
    blocks = [{"role": "user", "content": [{"type": "text", "text": "do the task"}]}, *same[1:]]
    assert unbound_blocks(same, blocks) == 0


def test_blocks_before_the_first_change_in_its_message_keep_their_prefix() -> None:
    data = body({"type": "adaptive"})
    messages = data["messages"]
    # The first turn's tool input cleared: its thinking came before the change, the later
    # turns' thinking after it.
    edited = copy.deepcopy(messages[1])
    edited["content"][1]["input"] = {}
    items = [messages[0], edited, *messages[2:]]
    assert unbound_blocks(messages, items) == 3
    # A breakpoint added on a block is no change.
    marked = copy.deepcopy(messages[1])
    marked["content"][1]["cache_control"] = {"type": "ephemeral"}
    assert unbound_blocks(messages, [messages[0], marked, *messages[2:]]) == 0
    # A thinking block left out of a turn (clear_thinking): every later block is unbound.
    stripped = {**messages[1], "content": messages[1]["content"][1:]}
    assert unbound_blocks(messages, [messages[0], stripped, *messages[2:]]) == 3


def test_redacted_thinking_is_counted_too() -> None:
    data = body({"type": "adaptive"})
    data["messages"][-2]["content"].insert(1, {"type": "redacted_thinking", "data": "opaque"})
    assert unbound_blocks(data["messages"], summarized(data, 2)) == 2


def test_only_the_messages_format_amends() -> None:
    data = body({"type": "adaptive"})
    items = summarized(data, 4)
    assert MESSAGES.amend(data, items, NATIVE) is not None
    assert CHAT.amend(data, items, NATIVE) is None
    assert RESPONSES.amend(data, items, NATIVE) is None


# --------------------------------------------------------------------------- the forwarded bytes

CLIENT = (
    b'{"model": "claude-fable-5-1", "seed": 1180591620717411303424, "temperature": 1.10,\n'
    b'  "thinking": {"type": "adaptive",  "display": "omitted"},\n'
    b'  "messages": [{"role": "user", "content": "caf\\u00e9"}], "max_tokens": 32000\n}'
)


def client_body(raw: bytes) -> ClientBody:
    return ClientBody(raw, orjson.loads(raw), "messages")


def test_thinking_is_written_in_place_and_every_other_byte_stays() -> None:
    merged = {"type": "adaptive", "display": "omitted", "block_binding": DROP}
    out = client_body(CLIENT).with_members({"thinking": merged})
    assert out == CLIENT.replace(
        b'{"type": "adaptive",  "display": "omitted"}', orjson.dumps(merged)
    )


def test_a_member_the_client_did_not_send_is_added_after_its_last() -> None:
    raw = CLIENT.replace(b'  "thinking": {"type": "adaptive",  "display": "omitted"},\n', b"")
    thinking = {"type": "adaptive", "block_binding": DROP}
    items = [{"role": "user", "content": "[summary]"}]
    out = client_body(raw).with_elements(items, members={"thinking": thinking})
    assert out == (
        b'{"model": "claude-fable-5-1", "seed": 1180591620717411303424, "temperature": 1.10,\n'
        b'  "messages": [{"role":"user","content":"[summary]"}], "max_tokens": 32000,'
        b'"thinking":{"type":"adaptive","block_binding":{"prefix_mismatch_behavior":'
        b'"drop_block"}}\n}'
    )
    assert orjson.loads(out)["seed"] == 1180591620717411303424
    assert client_body(b"{}").with_members({"thinking": {}}) == b'{"thinking":{}}'


def test_a_member_written_twice_is_serialized_whole_as_before() -> None:
    raw = b'{"thinking": {"type": "adaptive"}, "messages": [], "thinking": {"type": "adaptive"}}'
    out = client_body(raw).with_members({"thinking": {"type": "adaptive", "block_binding": DROP}})
    assert orjson.loads(out)["thinking"]["block_binding"] == DROP
    assert out.count(b'"thinking"') == 1


# --------------------------------------------------------------------------- the beta header


def test_the_beta_is_appended_to_the_clients_list_or_added() -> None:
    sent = [("x-api-key", "k"), ("anthropic-beta", "claude-code-20250219,oauth-2025-04-20")]
    listed = (("anthropic-beta", BINDING_BETA),)
    assert with_listed(sent, listed) == [
        ("x-api-key", "k"),
        ("anthropic-beta", f"claude-code-20250219,oauth-2025-04-20,{BINDING_BETA}"),
    ]
    assert sent[1][1] == "claude-code-20250219,oauth-2025-04-20"  # not edited
    assert with_listed([("x-api-key", "k")], listed) == [
        ("x-api-key", "k"),
        ("anthropic-beta", BINDING_BETA),
    ]
    already = [("anthropic-beta", f"a, {BINDING_BETA}")]
    assert with_listed(already, listed) == already
    assert with_listed([("anthropic-beta", "")], listed) == [("anthropic-beta", BINDING_BETA)]
    assert with_listed(sent, ()) == sent
