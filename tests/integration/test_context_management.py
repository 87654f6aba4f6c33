"""Anthropic's ``context_management`` through real processes: applied by the proxy for a
server that refuses the field, passed on as sent to one that applies it
(docs/context-management.md).

One fake Anthropic upstream (tests/fakes/messages), told ``unsupported_fields:
["context_management"]`` so it refuses the field with Anthropic's own wording, as a strict
local server does; one proxy with two upstream entries on it: ``local`` (the default for a
base_url that is not api.anthropic.com: emulate) and ``native`` (``context_management:
native``). Clients: raw HTTP in Claude Code's shape (streaming, ``?beta=true``, the beta header)
and the official ``anthropic`` SDK's beta messages, which take ``context_management`` as a
parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.support.messages_upstream import (
    COUNT_TOKENS,
    MESSAGES,
    MessagesUpstreamServer,
    anthropic_client,
)
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

MODEL = "claude-sonnet-4-5"
NATIVE = "claude-opus-4-1"  # routed to the upstream entry that applies the edits itself
WINDOW = 60_000
BETA = "context-management-2025-06-27"
PLACEHOLDER = "[Old tool result content cleared]"
BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
# What Claude Code sends on every request (its 2.1 series), spacing as it writes it.
CLAUDE_CODE_FIELD = (
    b'"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}'
)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("context") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    fake.reset()
    fake.control(unsupported_fields=["context_management"])
    yield fake
    fake.reset()


@pytest.fixture(scope="module")
def proxy(
    fake: MessagesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ProxyServer:
    db = tmp_path_factory.mktemp("context-store") / "checkpoints.db"
    native = {**upstream_entry(fake.url + "/v1", name="native", models=[NATIVE])}
    native["context_management"] = "native"
    config = proxy_config(
        native,
        upstream_entry(fake.url + "/v1", name="local"),
        store={"backend": "sqlite", "path": str(db)},
        models={MODEL: {"context_window": WINDOW}, NATIVE: {"context_window": WINDOW}},
        # The edits as the proxy applies them, alone: the ledger the default pipeline keeps
        # beside them is tested in tests/unit/test_ledger_formats.py (Messages too).
        compaction={"ledger": {"enabled": False}},
    )
    server: ProxyServer = module_proxy_factory(config)
    return server


@pytest.fixture
def client(proxy: ProxyServer) -> Iterator[anthropic.Anthropic]:
    sdk = anthropic_client(proxy.url, "sk-ant-client")
    yield sdk
    sdk.close()


def claude_code_body(model: str) -> bytes:
    """A Claude Code request as it writes it: context_management between its other fields."""
    return (
        b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":[{"type":'
        b'"text","text":"hello"}]}],"system":[{"type":"text","text":"You are Claude Code."}],'
        b'"max_tokens":32000,"metadata":{"user_id":"user_abc"},' + CLAUDE_CODE_FIELD + b","
        b'"stream":true}'
    )


CLAUDE_CODE_HEADERS = {
    "content-type": "application/json",
    "x-api-key": "sk-ant-client",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": f"claude-code-20250219,{BETA},interleaved-thinking-2025-05-14",
}


def post_raw(proxy_or_url: str, raw: bytes) -> httpx.Response:
    with httpx.Client(base_url=proxy_or_url, trust_env=False, timeout=60) as http:
        return http.post(MESSAGES + "?beta=true", content=raw, headers=CLAUDE_CODE_HEADERS)


def warnings(headers: Any) -> list[str]:
    return list(headers.get_list("x-compaction-warning"))


def tool_session(steps: int, lines: int = 80) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the parser. FACT-TASK-7."}]}
    ]
    for step in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {step}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{step}",
                        "name": "Bash",
                        "input": {"command": f"cat part-{step}"},
                    },
                ],
            }
        )
        output = "".join(f"step {step} line {n}: lorem ipsum dolor\n" for n in range(lines))
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": output}
                ],
            }
        )
    return messages


def test_claude_codes_request_reaches_a_server_that_refuses_the_field(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    raw = claude_code_body(MODEL)
    refused = post_raw(upstream.url, raw)  # what the same request meets without the proxy
    assert refused.status_code == 400
    assert "context_management: Extra inputs are not permitted" in refused.text
    reply = post_raw(proxy.url, raw)
    assert reply.status_code == 200, reply.text
    assert b"event: message_stop" in reply.content
    record = upstream.messages()[-1]
    assert record.body == raw.replace(CLAUDE_CODE_FIELD + b",", b"")  # every other byte kept
    assert record.query == "beta=true"
    assert record.headers["anthropic-beta"] == CLAUDE_CODE_HEADERS["anthropic-beta"]
    assert "context_management applied by the proxy (clear_thinking_20251015 keep all)" in (
        warnings(reply.headers)
    )


def test_a_native_upstream_gets_the_field_as_sent(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    upstream.control(unsupported_fields=[])  # it applies context management itself
    raw = claude_code_body(NATIVE)
    reply = post_raw(proxy.url, raw)
    assert reply.status_code == 200, reply.text
    assert upstream.messages()[-1].body == raw
    assert not any("context_management" in w for w in warnings(reply.headers))


def test_the_sdks_clear_tool_uses_is_applied_by_the_proxy(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    messages = tool_session(8)
    raw = client.beta.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=256,
        tools=[BASH],
        messages=messages,
        betas=[BETA],
        context_management={
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 3_000},
                    "keep": {"type": "tool_uses", "value": 2},
                    "clear_tool_inputs": True,
                }
            ]
        },
    )
    assert raw.parse().stop_reason is not None
    sent = upstream.messages()[-1].json()
    assert "context_management" not in sent
    results = [m["content"][0] for m in sent["messages"][2::2]]
    assert [r["content"] for r in results[:6]] == [PLACEHOLDER] * 6
    assert results[6:] == [m["content"][0] for m in messages[14::2]]
    calls = [m["content"][1] for m in sent["messages"][1::2]]
    assert [c["input"] for c in calls[:6]] == [{}] * 6
    assert [c["input"] for c in calls[6:]] == [{"command": "cat part-6"}, {"command": "cat part-7"}]
    assert [c["id"] for c in calls] == [f"toolu_{n}" for n in range(8)]
    assert raw.headers["x-compaction-strategies"] == "clear_tool_uses_20250919"
    (note,) = [w for w in warnings(raw.headers) if "context_management" in w]
    assert note.startswith(
        "context_management applied by the proxy (clear_tool_uses_20250919 cleared 6 tool result(s)"
    )


def test_clear_thinking_drops_older_turns_thinking_and_the_fake_accepts_it(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    """Signed thinking the fake made: older turns go without it, the newest with its blocks
    byte for byte (the fake checks every signature it gets back)."""
    messages: list[dict[str, Any]] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"question {turn}: FACT-Q{turn}"})
        reply = client.messages.create(
            model=MODEL,
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=messages,
        )
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        assert content[0]["type"] == "thinking"
        messages.append({"role": "assistant", "content": content})
    messages.append({"role": "user", "content": "and now?"})
    raw = client.beta.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=messages,
        betas=[BETA],
        context_management={
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
            ]
        },
    )
    assert raw.parse().content[0].type == "thinking"
    sent = upstream.messages()[-1].json()
    assert "context_management" not in sent
    turns = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert [b["type"] for b in turns[0]["content"]] == ["text"]
    assert [b["type"] for b in turns[1]["content"]] == ["text"]
    assert turns[2] == messages[5]  # the newest turn keeps its signed thinking as it was
    assert turns[0]["content"][0] == messages[1]["content"][1]
    (note,) = [w for w in warnings(raw.headers) if "context_management" in w]
    assert "clear_thinking_20251015 cleared the thinking of 2 turn(s)" in note


def test_a_malformed_edit_is_refused_in_anthropics_shape(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.beta.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            betas=[BETA],
            context_management={
                "edits": [
                    {
                        "type": "clear_thinking_20251015",
                        "keep": {"type": "thinking_turns", "value": -1},
                    }
                ]
            },
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("context_management.edits.0.keep.value: ")
    assert upstream.messages() == []


def test_an_unknown_edit_is_stripped_and_named_not_applied(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    raw = orjson.dumps(
        {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "context_management": {"edits": [{"type": "forget_everything_20270101"}]},
        }
    )
    reply = post_raw(proxy.url, raw)
    assert reply.status_code == 200, reply.text
    assert "context_management" not in upstream.messages()[-1].json()
    notes = warnings(reply.headers)
    assert "forget_everything_20270101 not applied (an edit type unknown to the proxy)" in notes
    assert "context_management stripped: none of its edits could be applied" in notes


def test_count_tokens_counts_the_request_as_the_proxy_applies_its_edits(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    messages = tool_session(8)
    edits = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 3_000},
                "keep": {"type": "tool_uses", "value": 2},
            }
        ]
    }
    raw = client.beta.messages.with_raw_response.count_tokens(
        model=MODEL, tools=[BASH], messages=messages, betas=[BETA], context_management=edits
    )
    counted = raw.parse().input_tokens
    asked = upstream.requests(COUNT_TOKENS)[-1].json()
    assert "context_management" not in asked
    assert [m["content"][0]["content"] for m in asked["messages"][2:14:2]] == [PLACEHOLDER] * 6
    whole = upstream.anthropic_client()
    try:
        uncleared = whole.messages.count_tokens(model=MODEL, tools=[BASH], messages=messages)
    finally:
        whole.close()
    assert counted < uncleared.input_tokens


def test_a_dry_run_forwards_the_request_without_the_field_and_says_so(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    raw = claude_code_body(MODEL)
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60) as http:
        reply = http.post(
            MESSAGES + "?beta=true",
            content=raw,
            headers={**CLAUDE_CODE_HEADERS, "x-compaction": "dry-run"},
        )
    assert reply.status_code == 200, reply.text
    assert upstream.messages()[-1].body == raw.replace(CLAUDE_CODE_FIELD + b",", b"")
    notes = [w for w in warnings(reply.headers) if "context_management" in w]
    assert notes == [
        "context_management stripped for an upstream that does not apply it, and not applied: "
        "the request went uncompacted (a dry run, or the compaction failed)"
    ]
