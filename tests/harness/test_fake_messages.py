"""The fake Messages upstream behaves like Anthropic's API where the proxy will rely on it.

Straight against the fake (no proxy), with the official ``anthropic`` SDK as client, so a
failing adapter test can later be blamed on the proxy with confidence. Expected token counts
come from the fake's documented rule (:mod:`tests.fakes.messages.prompt`), computed here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx
import orjson
import pytest
from anthropic.types import Message, TextBlock, ToolUseBlock, Usage

from tests.fakes.messages.prompt import Counter, build_prompt
from tests.support.messages_bodies import BASH
from tests.support.messages_upstream import COUNT_TOKENS, MESSAGES, MessagesUpstreamServer
from tests.support.sse import sse_data

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

MODEL = "claude-sonnet-4-5"
LOOKUP = {
    "name": "lookup",
    "description": "Look a key up",
    "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
}
BINDING_BETA = "thinking-binding-controls-2026-08-01"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    handle = MessagesUpstreamServer(tmp_path_factory.mktemp("messages") / "fake.log")
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def fake(server: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture
def client(fake: MessagesUpstreamServer) -> Iterator[anthropic.Anthropic]:
    sdk = fake.anthropic_client()
    yield sdk
    sdk.close()


@pytest.fixture
def raw(fake: MessagesUpstreamServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, trust_env=False, timeout=30.0) as http:
        yield http


def tokens(payload: dict[str, Any]) -> int:
    """The fake's own count of a request (see the prompt module's docstring)."""
    return build_prompt(payload, Counter()).total


def create(client: anthropic.Anthropic, **kwargs: Any) -> Message:
    """``client.messages.create`` with loosely typed arguments (the tests send odd bodies)."""
    return cast(Message, client.messages.create(**kwargs))


def text_of(reply: Message, index: int = 0) -> str:
    block = reply.content[index]
    assert isinstance(block, TextBlock), block
    return block.text


def tool_input(reply: Message, index: int) -> dict[str, Any]:
    block = reply.content[index]
    assert isinstance(block, ToolUseBlock), block
    return dict(block.input)


def parts(usage: Usage) -> tuple[int, int, int]:
    """(uncached input, cache read, cache creation) tokens of a usage."""
    return (
        usage.input_tokens,
        usage.cache_read_input_tokens or 0,
        usage.cache_creation_input_tokens or 0,
    )


def body_of(error: anthropic.APIStatusError) -> dict[str, Any]:
    assert isinstance(error.body, dict), error.body
    return error.body


def dump(blocks: Any) -> list[dict[str, Any]]:
    """An SDK reply's content as a client sends it back."""
    return [block.model_dump(exclude_none=True) for block in blocks]


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["type"] == "error", body
    return dict(body["error"])


def post(raw: httpx.Client, payload: dict[str, Any], **headers: str) -> httpx.Response:
    return raw.post(
        MESSAGES,
        content=orjson.dumps(payload),
        headers={"content-type": "application/json", "x-api-key": "k", **headers},
    )


# --------------------------------------------------------------------------- replies


def test_json_reply_usage_and_recording(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    messages = [{"role": "user", "content": "hello fake"}]
    reply = create(client, model=MODEL, max_tokens=64, messages=messages)
    assert [(b.type, getattr(b, "text", None)) for b in reply.content] == [
        ("text", "echo: hello fake")
    ]
    assert reply.stop_reason == "end_turn" and reply.model == MODEL
    expected = tokens({"model": MODEL, "messages": messages})
    assert reply.usage.input_tokens == expected
    assert reply.usage.cache_read_input_tokens == 0 == reply.usage.cache_creation_input_tokens
    recorded = fake.last_request(MESSAGES)
    # anthropic 2.x sends the key as a bearer token and a newer API version; Claude Code sends
    # x-api-key and 2023-06-01 (both recorded as sent, see the next test).
    assert recorded.headers["authorization"] == "Bearer sk-ant-test-dummy"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", recorded.headers["anthropic-version"])
    assert recorded.json()["messages"] == messages
    assert orjson.loads(recorded.body) == recorded.json()  # the exact bytes are kept


def test_beta_route_records_query_betas_and_exact_bytes(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer, raw: httpx.Client
) -> None:
    client.beta.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": "hi"}],
        betas=["context-management-2025-06-27", "interleaved-thinking-2025-05-14"],
    )
    recorded = fake.last_request(MESSAGES)
    assert recorded.headers["anthropic-beta"] == (
        "context-management-2025-06-27,interleaved-thinking-2025-05-14"
    )
    body = b'{"model": "m",  "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}'
    headers = {
        "content-type": "application/json",
        "x-api-key": "sk-ant-raw",
        "anthropic-version": "2023-06-01",
    }
    assert raw.post(MESSAGES + "?beta=true", content=body, headers=headers).status_code == 200
    recorded = fake.last_request(MESSAGES)
    assert recorded.body == body and recorded.query == "beta=true"  # Claude Code's query string
    assert (recorded.headers["x-api-key"], recorded.headers["anthropic-version"]) == (
        "sk-ant-raw",
        "2023-06-01",
    )


def test_stream_event_sequence_for_thinking_text_and_tool_use(raw: httpx.Client) -> None:
    payload = {
        "model": MODEL,
        "max_tokens": 512,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 256},
        "tools": [LOOKUP],
        "messages": [{"role": "user", "content": "fake-loop: steps=1"}],
    }
    response = post(raw, payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "event: message_start\n" in response.text  # named events, as the API sends them
    events = [orjson.loads(data) for data in sse_data(response.text)]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and "ping" in kinds
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert (
        start["usage"]["input_tokens"] == tokens(payload) and start["usage"]["output_tokens"] == 1
    )
    blocks: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "content_block_start":
            blocks[event["index"]] = {"start": event["content_block"], "deltas": []}
        elif event["type"] == "content_block_delta":
            blocks[event["index"]]["deltas"].append(event["delta"])
    kinds_of = [blocks[i]["start"]["type"] for i in sorted(blocks)]
    assert kinds_of == ["thinking", "text", "tool_use"]
    thinking = blocks[0]["deltas"]
    assert {d["type"] for d in thinking[:-1]} == {"thinking_delta"}
    assert thinking[-1]["type"] == "signature_delta" and thinking[-1]["signature"]
    tool = blocks[2]
    assert tool["start"]["input"] == {} and tool["deltas"][0] == {
        "type": "input_json_delta",
        "partial_json": "",
    }
    arguments = orjson.loads("".join(d["partial_json"] for d in tool["deltas"]))
    assert arguments["step"] == 1
    final = events[-2]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["input_tokens"] == tokens(payload)
    assert final["usage"]["output_tokens"] > 1
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]


def test_sdk_stream_and_json_agree(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 128,
        "tools": [BASH],
        "messages": [{"role": "user", "content": "fake-loop: steps=3 lines=2"}],
    }
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    direct = create(client, **kwargs)
    assert (
        [b.type for b in streamed.content]
        == [b.type for b in direct.content]
        == ["text", "tool_use"]
    )
    assert tool_input(streamed, 1) == tool_input(direct, 1)
    assert "seq -f" in tool_input(direct, 1)["command"]
    assert streamed.usage.input_tokens == direct.usage.input_tokens


# --------------------------------------------------------------------------- refusals


def long_request(size: int = 3000) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "word " * size}],
    }


def test_anthropic_refusal_json_and_stream(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer, raw: httpx.Client
) -> None:
    payload = long_request()
    prompt = tokens(payload)
    fake.control(context_window=prompt - 1)
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(client, **payload)
    assert caught.value.status_code == 400
    expected = f"prompt is too long: {prompt} tokens > {prompt - 1} maximum"
    assert body_of(caught.value) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": expected},
        "request_id": body_of(caught.value)["request_id"],
    }
    response = post(raw, {**payload, "stream": True})
    assert response.status_code == 400 and "event:" not in response.text  # before any event
    assert error_of(response)["message"] == expected
    refused = [e for e in fake.events() if e["type"] == "refused"]
    assert [(e["input_tokens"], e["window"]) for e in refused] == [(prompt, prompt - 1)] * 2
    fake.control(context_window=prompt)
    assert create(client, **payload).usage.input_tokens == prompt


def test_anthropic_refusal_counting_max_tokens(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    payload = long_request()
    prompt = tokens(payload)
    fake.control(context_window=prompt + 999, count_output=True)
    with pytest.raises(anthropic.BadRequestError, match="exceed context limit") as caught:
        create(client, **payload)
    assert body_of(caught.value)["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {prompt} + 1000 > {prompt + 999}, "
        "decrease input length or `max_tokens` and try again"
    )
    create(client, **{**payload, "max_tokens": 999})


def test_llamacpp_refusal(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    payload = long_request()
    prompt = tokens(payload)
    fake.control(context_window=prompt, refusal_style="llamacpp")  # llama.cpp: P >= n_ctx
    response = post(raw, payload)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": 400,
            "message": f"request ({prompt} tokens) exceeds the available context size "
            f"({prompt} tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": prompt,
        }
    }
    fake.control(context_window=prompt + 1)
    assert post(raw, payload).status_code == 200  # max_tokens does not count for llama.cpp


@pytest.mark.parametrize("style", ["vllm", "vllm_old"])
def test_vllm_refusals_count_the_output(
    style: str, fake: MessagesUpstreamServer, raw: httpx.Client
) -> None:
    payload = long_request()
    prompt = tokens(payload)
    window = prompt + 999  # one token short of prompt + max_tokens
    fake.control(context_window=window, refusal_style=style)
    response = post(raw, payload)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "BadRequestError"
    if style == "vllm":
        assert error["message"] == (
            f"You passed {prompt} input tokens and requested 1000 output tokens. However, the "
            f"model's context length is only {window} tokens, resulting in a maximum input "
            f"length of {prompt - 1} tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt})"
        )
    else:
        assert error["message"].startswith(
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + 1000} tokens ({prompt} in the messages, 1000 in the completion)."
        )
    fake.control(context_window=prompt + 1000)
    assert post(raw, payload).status_code == 200


def test_vllm_reports_a_floor_of_the_prompt(
    fake: MessagesUpstreamServer, raw: httpx.Client
) -> None:
    payload = long_request()
    fake.control(context_window=2000, refusal_style="vllm")  # limit 1000, prompt ~3000
    message = error_of(post(raw, payload))["message"]
    assert message.startswith("You passed 1001 input tokens")  # tokenizing stopped at W-M+1


def test_413_refusal(client: anthropic.Anthropic, fake: MessagesUpstreamServer) -> None:
    payload = long_request()
    fake.control(context_window=100, refusal_style="413")
    with pytest.raises(anthropic.APIStatusError) as caught:
        create(client, **payload)
    assert caught.value.status_code == 413
    assert body_of(caught.value)["error"] == {
        "type": "request_too_large",
        "message": "Request exceeds the maximum allowed number of bytes.",
    }


def test_windows_per_model(client: anthropic.Anthropic, fake: MessagesUpstreamServer) -> None:
    payload = long_request(500)
    fake.control(context_window=100_000, model_context_windows={"small-model": 50})
    create(client, **payload)
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        create(client, **{**payload, "model": "small-model"})


# --------------------------------------------------------------------------- count_tokens


def test_count_tokens_matches_usage_and_ignores_the_window(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    payload: dict[str, Any] = {
        "model": MODEL,
        "system": [
            {
                "type": "text",
                "text": "You are terse. " * 200,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tools": [BASH],
        "messages": [{"role": "user", "content": "count me"}],
    }
    counted = client.messages.count_tokens(**payload)
    assert counted.input_tokens == tokens(payload)
    fake.control(cache_min_tokens=1)
    usage = create(client, max_tokens=16, **payload).usage
    assert usage.cache_creation_input_tokens  # the same request, split by the cache
    assert sum(parts(usage)) == counted.input_tokens
    fake.control(context_window=10)
    assert client.messages.count_tokens(**payload).input_tokens == counted.input_tokens
    recorded = fake.last_request(COUNT_TOKENS)
    assert recorded.json()["messages"] == payload["messages"]


def test_count_tokens_validates_like_messages(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        client.messages.count_tokens(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y"}],
                }
            ],
        )


# --------------------------------------------------------------------------- prompt caching


def cached_turn(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 32,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": messages,
    }


def usage_of(client: anthropic.Anthropic, payload: dict[str, Any]) -> Usage:
    return create(client, **payload).usage


def test_breakpoint_written_then_read(client: anthropic.Anthropic) -> None:
    system = "Rules of the house. " * 300  # well above the 1,024-token minimum
    payload = cached_turn(system, [{"role": "user", "content": "first"}])
    prefix = tokens({"model": MODEL, "system": payload["system"], "messages": []})
    assert prefix >= 1024
    first = usage_of(client, payload)
    assert (first.cache_creation_input_tokens, first.cache_read_input_tokens) == (prefix, 0)
    assert first.cache_creation and first.cache_creation.ephemeral_5m_input_tokens == prefix
    second = usage_of(client, cached_turn(system, [{"role": "user", "content": "second, longer"}]))
    assert (second.cache_creation_input_tokens, second.cache_read_input_tokens) == (0, prefix)
    assert (
        second.input_tokens
        == tokens(payload | {"messages": [{"role": "user", "content": "second, longer"}]}) - prefix
    )
    changed = usage_of(client, cached_turn(system + "!", [{"role": "user", "content": "second"}]))
    assert changed.cache_read_input_tokens == 0  # one character before the breakpoint


def test_prefixes_below_the_minimum_are_not_cached(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    payload = cached_turn("short rules", [{"role": "user", "content": "hi"}])
    for _ in range(2):
        usage = usage_of(client, payload)
        assert usage.cache_creation_input_tokens == 0 == usage.cache_read_input_tokens
    fake.control(cache_min_tokens=1)
    assert parts(usage_of(client, payload))[2] > 0
    assert parts(usage_of(client, payload))[1] > 0


def agent_turns(steps: int) -> list[dict[str, Any]]:
    """A loop's messages with the breakpoint on the newest tool result, as Claude Code sends."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for step in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{step}",
                        "name": "lookup",
                        "input": {"key": str(step)},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{step}",
                        "content": f"value {step} " * 40,
                    }
                ],
            }
        )
    for message in messages[:-1]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            block.pop("cache_control", None)
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return messages


def test_moving_breakpoint_reads_the_previous_one(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(cache_min_tokens=1)
    system = "Agent rules."
    usages = []
    for steps in range(1, 6):
        payload = cached_turn(system, agent_turns(steps)) | {"tools": [LOOKUP]}
        usage = usage_of(client, payload)
        usages.append(usage)
        total = sum(parts(usage))
        assert total == tokens(payload)
        assert usage.input_tokens == 0  # everything up to the newest result is a breakpoint
    previous = cached_turn(system, agent_turns(4)) | {"tools": [LOOKUP]}
    assert usages[-1].cache_read_input_tokens == tokens(previous)  # found by the lookback
    assert all(parts(u)[1] > 0 for u in usages[1:])


def test_lookback_is_twenty_blocks(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(cache_min_tokens=1)
    usage_of(client, cached_turn("rules", agent_turns(1)))
    far = usage_of(client, cached_turn("rules", agent_turns(12)))  # 22 blocks later
    assert far.cache_read_input_tokens == tokens(cached_turn("rules", []) | {"messages": []})


def test_cache_identity_ignores_markers_and_string_form(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(cache_min_tokens=1)
    note = {
        "role": "system",
        "content": [
            {"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}
        ],
    }
    first = cached_turn("rules", [{"role": "user", "content": "task"}, note])
    usage_of(client, first)
    again = copy.deepcopy(first)
    again["messages"][1] = {"role": "system", "content": "# Environment"}  # Claude Code's 2nd form
    again["messages"].append(
        {
            "role": "user",
            "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}],
        }
    )
    usage = usage_of(client, again)
    assert usage.cache_read_input_tokens == tokens(first)


def test_thinking_change_invalidates_only_the_messages(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(cache_min_tokens=1, thinking="never")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "task " * 30, "cache_control": {"type": "ephemeral"}}
            ],
        }
    ]
    payload = cached_turn("rules " * 30, messages)
    usage_of(client, payload)
    system_only = tokens(payload | {"messages": []})
    usage = usage_of(client, payload | {"thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert usage.cache_read_input_tokens == system_only


def test_one_hour_ttl_and_more_than_four_breakpoints(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(cache_min_tokens=1)
    hour = {"type": "ephemeral", "ttl": "1h"}
    payload = cached_turn("rules", [{"role": "user", "content": "hi"}])
    payload["system"][0]["cache_control"] = hour
    usage = usage_of(client, payload)
    assert (
        usage.cache_creation
        and usage.cache_creation.ephemeral_1h_input_tokens == parts(usage)[2] > 0
    )
    blocks = [
        {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
        for i in range(4)
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        usage_of(client, cached_turn("rules", [{"role": "user", "content": blocks}]))
    assert body_of(caught.value)["error"]["message"] == (
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )
    assert fake.control()["cache_entries"] == 1  # the refused request wrote nothing


# --------------------------------------------------------------------------- structure


def tool_turn(use_ids: list[str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": i, "name": "lookup", "input": {"key": i}} for i in use_ids
        ],
    }


def results(ids: list[str]) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": i, "content": f"r {i}"} for i in ids],
    }


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [{"role": "user", "content": "go"}, tool_turn(["a", "b"]), results(["a"])],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: b. Each `tool_use` block must have a corresponding `tool_result` block in the "
            "next message.",
        ),
        (
            [
                {"role": "user", "content": "go"},
                tool_turn(["a"]),
                {"role": "user", "content": "x"},
                results(["a"]),
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: a. Each `tool_use` block must have a corresponding `tool_result` block in the "
            "next message.",
        ),
        (
            [{"role": "user", "content": "go"}, results(["z"])],
            "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: z. "
            "Each `tool_result` block must have a corresponding `tool_use` block in the previous "
            "message.",
        ),
        (
            [
                {"role": "user", "content": "go"},
                tool_turn(["a"]),
                results(["a"]),
                tool_turn(["a"]),
                results(["a"]),
            ],
            "messages.3.content.0: `tool_use` ids must be unique",
        ),
        (
            [{"role": "user", "content": ""}],
            "messages.0: all messages must have non-empty content except for the optional final "
            "assistant message",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": ""}]}],
            "messages: text content blocks must be non-empty",
        ),
        ([1, {"role": "user", "content": "x"}], "messages.0: Input should be a valid dictionary"),
        (
            [{"role": "user", "content": [{"text": "no type"}]}],
            "messages.0.content.0.type: Field required",
        ),
        (
            [{"role": "tool", "content": "x"}],
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
    ],
    ids=[
        "unanswered",
        "answered-too-late",
        "orphan-result",
        "duplicate-id",
        "empty",
        "empty-text",
        "not-an-object",
        "untyped-block",
        "role",
    ],
)
def test_structure_refusals(
    client: anthropic.Anthropic, messages: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(client, model=MODEL, max_tokens=16, messages=messages, tools=[LOOKUP])
    assert body_of(caught.value)["error"] == {"type": "invalid_request_error", "message": message}


def test_what_today_api_accepts(client: anthropic.Anthropic) -> None:
    accepted = [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two, consecutive"},
        {"role": "system", "content": "a mid-conversation system note"},
        tool_turn(["p1", "p2"]),
        results(["p1", "p2"]),  # parallel uses, answered together
        {"role": "assistant", "content": "prefill"},
    ]
    create(client, model=MODEL, max_tokens=16, messages=accepted, tools=[LOOKUP])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Field required"):
        client.post("/v1/messages", body={"model": MODEL, "messages": accepted[:1]}, cast_to=object)


def test_unsupported_fields(client: anthropic.Anthropic, fake: MessagesUpstreamServer) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "extra_body": {
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
        },
    }
    create(client, **kwargs)
    fake.control(unsupported_fields=["context_management"])
    with pytest.raises(
        anthropic.BadRequestError, match="context_management: Extra inputs are not permitted"
    ):
        create(client, **kwargs)


# --------------------------------------------------------------------------- thinking


def thinking_session(client: anthropic.Anthropic, **extra: Any) -> list[dict[str, Any]]:
    """Task, a signed thinking + tool_use turn, its result: ready for the next request."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fake-loop: steps=2"}]
    reply = create(
        client,
        model=MODEL,
        max_tokens=512,
        thinking={"type": "enabled", "budget_tokens": 256},
        tools=[LOOKUP],
        messages=messages,
        **extra,
    )
    content = dump(reply.content)
    assert content[0]["type"] == "thinking" and content[0]["signature"]
    messages.append({"role": "assistant", "content": content})
    use = next(b for b in content if b["type"] == "tool_use")
    messages.append(results([use["id"]]))
    return messages


def again(client: anthropic.Anthropic, messages: list[dict[str, Any]], **extra: Any) -> Message:
    return create(
        client,
        model=MODEL,
        max_tokens=512,
        thinking={"type": "enabled", "budget_tokens": 256},
        tools=[LOOKUP],
        messages=messages,
        **extra,
    )


def test_signed_thinking_round_trip(client: anthropic.Anthropic) -> None:
    messages = thinking_session(client)
    reply = again(client, messages)
    assert reply.content[0].type == "thinking"
    assert [b.type for b in reply.content][-1] == "tool_use"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda b: b.update(thinking=b["thinking"] + " (edited)"),
            "messages.1.content.0: Invalid `signature` in `thinking` block",
        ),
        (
            lambda b: b.update(signature=b["signature"][:-4] + "AAAA"),
            "messages.1.content.0: Invalid `signature` in `thinking` block",
        ),
        (
            lambda b: b.update(signature="not base64 at all"),
            "messages.1.content.0: Invalid `signature` in `thinking` block",
        ),
        (lambda b: b.pop("signature"), "messages.1.content.0.thinking.signature: Field required"),
    ],
    ids=["text", "forged", "garbage", "missing"],
)
def test_signature_checks(client: anthropic.Anthropic, edit: Any, message: str) -> None:
    messages = thinking_session(client)
    edit(messages[1]["content"][0])
    with pytest.raises(anthropic.BadRequestError) as caught:
        again(client, messages)
    assert body_of(caught.value)["error"]["message"] == message


def test_final_turn_must_keep_its_thinking(client: anthropic.Anthropic) -> None:
    messages = thinking_session(client)
    messages[1]["content"] = [b for b in messages[1]["content"] if b["type"] != "thinking"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        again(client, messages)
    assert body_of(caught.value)["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`."
    )
    # Without thinking the same history is fine: the API ignores the rule then.
    create(client, model=MODEL, max_tokens=64, tools=[LOOKUP], messages=messages)


def test_adaptive_thinking_rule_applies_when_the_fake_thought(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "fake-loop: steps=2"}]
    adaptive = {"type": "adaptive", "display": "omitted"}
    reply = create(
        client,
        model=MODEL,
        max_tokens=512,
        thinking=adaptive,
        tools=[LOOKUP],
        messages=messages,
    )
    content = dump(reply.content)
    assert content[0] == {"type": "thinking", "thinking": "", "signature": content[0]["signature"]}
    use = content[-1]["id"]
    kept = [*messages, {"role": "assistant", "content": content}, results([use])]
    create(client, model=MODEL, max_tokens=512, thinking=adaptive, tools=[LOOKUP], messages=kept)
    stripped = [*messages, {"role": "assistant", "content": content[1:]}, results([use])]
    with pytest.raises(anthropic.BadRequestError, match="Expected `thinking`"):
        create(
            client,
            model=MODEL,
            max_tokens=512,
            thinking=adaptive,
            tools=[LOOKUP],
            messages=stripped,
        )


def test_redacted_thinking_accepted_as_is(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(redacted_thinking=True)
    messages = thinking_session(client)
    kinds = [b["type"] for b in messages[1]["content"]]
    assert kinds[:2] == ["thinking", "redacted_thinking"]
    again(client, messages)
    messages[1]["content"][1] = {
        "type": "redacted_thinking",
        "data": "EmwKAhgBEgy3va3pzix/LafPsn4a",
    }
    again(client, messages)  # someone else's opaque data: not the fake's to judge


def test_binding_enforced_reports_where_the_prefix_changed(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(thinking_binding="enforce")
    messages = thinking_session(client)
    again(client, messages)  # unchanged: fine
    cache_moved = copy.deepcopy(messages)
    cache_moved[0] = {
        "role": "user",
        "content": [
            {"type": "text", "text": "fake-loop: steps=2", "cache_control": {"type": "ephemeral"}}
        ],
    }
    again(client, cache_moved)  # a moved breakpoint and the block form change nothing
    messages[0]["content"] = "fake-loop: steps=2 (summarized)"
    with pytest.raises(anthropic.BadRequestError) as caught:
        again(client, messages)
    assert body_of(caught.value)["error"]["message"] == (
        "messages.1.content.0: Invalid `signature` in `thinking` block. The block is bound to a "
        "different conversation. Remove the block, or set `thinking.block_binding."
        'prefix_mismatch_behavior` to "drop_block". Content before this block differs from when '
        "it was created, first at `messages.0.content.0`."
    )


def test_binding_drop_block_drops_and_reports(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(thinking_binding="enforce")
    messages = thinking_session(client)
    messages[0]["content"] = "fake-loop: steps=2 (summarized)"
    thinking = {
        "type": "enabled",
        "budget_tokens": 256,
        "block_binding": {"prefix_mismatch_behavior": "drop_block"},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(
            client,
            model=MODEL,
            max_tokens=512,
            thinking=thinking,
            tools=[LOOKUP],
            messages=messages,
        )
    assert body_of(caught.value)["error"]["message"] == (
        "thinking.enabled.block_binding: Extra inputs are not permitted"
    )
    reply = create(
        client,
        model=MODEL,
        max_tokens=512,
        thinking=thinking,
        tools=[LOOKUP],
        messages=messages,
        extra_headers={"anthropic-beta": BINDING_BETA},
    )
    extra = reply.model_extra or {}
    assert extra["input_transformations"] == [
        {
            "type": "thinking_dropped",
            "path": "messages.1.content.0",
            "reason": "prefix_binding_mismatch",
        }
    ]
    without = copy.deepcopy(messages)
    without[1]["content"] = without[1]["content"][1:]
    assert reply.usage.input_tokens == tokens(
        {"model": MODEL, "tools": [LOOKUP], "messages": without}
    )


def test_binding_recorded_but_not_enforced(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    fake.control(thinking_binding="record")
    messages = thinking_session(client)
    messages[0]["content"] = "fake-loop: steps=2 (edited)"
    quiet = again(client, messages)
    assert "input_transformations" not in (quiet.model_extra or {})
    told = again(client, messages, extra_headers={"anthropic-beta": BINDING_BETA})
    assert (told.model_extra or {})["input_transformations"] == [
        {
            "type": "thinking_mismatch_allowed",
            "path": "messages.1.content.0",
            "reason": "prefix_binding_mismatch",
        }
    ]
    fake.control(thinking_binding="off")
    assert "input_transformations" not in (again(client, messages).model_extra or {})


# --------------------------------------------------------------------------- the scripted model


def test_loop_with_parallel_calls_until_done(client: anthropic.Anthropic) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "fake-loop: steps=3 parallel=2 Ticket FACT-T1"}
    ]
    calls = 0
    for _ in range(10):
        reply = create(client, model=MODEL, max_tokens=256, tools=[LOOKUP], messages=messages)
        content = dump(reply.content)
        uses = [b for b in content if b["type"] == "tool_use"]
        if reply.stop_reason != "tool_use":
            break
        assert len(uses) == 2 and uses[0]["input"]["step"] == calls + 1
        calls += 1
        messages += [{"role": "assistant", "content": content}, results([u["id"] for u in uses])]
    assert calls == 3
    assert text_of(reply) == "fake-loop done: 3 steps. Facts: FACT-T1."


def test_loop_with_parallel_calls_on_some_steps(client: anthropic.Anthropic) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "fake-loop: steps=4 parallel=3 every=2"}
    ]
    widths = []
    while True:
        reply = create(client, model=MODEL, max_tokens=256, tools=[LOOKUP], messages=messages)
        uses = [b for b in dump(reply.content) if b["type"] == "tool_use"]
        if not uses:
            break
        widths.append(len(uses))
        messages += [
            {"role": "assistant", "content": dump(reply.content)},
            results([u["id"] for u in uses]),
        ]
    assert widths == [1, 3, 1, 3]  # parallel calls on every second step only


def test_server_wide_loop_without_a_directive(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    messages = [{"role": "user", "content": "do the thing"}]
    assert text_of(create(client, model=MODEL, max_tokens=64, tools=[BASH], messages=messages))
    fake.control(loop_steps=2, loop_lines=3)
    reply = create(client, model=MODEL, max_tokens=256, tools=[BASH], messages=messages)
    command = tool_input(reply, 1)["command"]
    assert (
        command.startswith("mkdir -p fake-steps && seq -f 'step 1 line %g:") and " 1 3 >" in command
    )
    no_tools = create(client, model=MODEL, max_tokens=64, messages=messages)
    assert text_of(no_tools) == "echo: do the thing"  # a loop needs a tool to call


def test_summary_carries_facts_and_progress_and_the_loop_resumes(
    client: anthropic.Anthropic,
) -> None:
    history = [
        {"role": "user", "content": "fake-loop: steps=5. FACT-A1 matters."},
        tool_turn(["toolu_fake_3_0_77"]),
        results(["toolu_fake_3_0_77"]),
    ]
    ask = {
        "role": "user",
        "content": history[2]["content"]
        + [
            {
                "type": "text",
                "text": "Your task is to create a detailed summary of the conversation so far.",
            }
        ],
    }
    summary = text_of(
        create(client, model=MODEL, max_tokens=512, tools=[LOOKUP], messages=[*history[:2], ask])
    )
    assert (
        "FACT-A1" in summary
        and "fake-progress: step=3" in summary
        and "fake-loop: steps=5" in summary
    )
    restarted = [{"role": "user", "content": "Summary:\n" + summary}]
    reply = create(client, model=MODEL, max_tokens=256, tools=[LOOKUP], messages=restarted)
    assert [b.input["step"] for b in reply.content if isinstance(b, ToolUseBlock)] == [4]


def test_recall_and_proxy_checkpoint_requests(client: anthropic.Anthropic) -> None:
    messages = [
        {"role": "user", "content": "Remember FACT-X1."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "fake-recall: which facts do you know? Also FACT-X2."},
    ]
    reply = create(
        client, model=MODEL, max_tokens=64, system="FACT-S0 is in the system.", messages=messages
    )
    assert text_of(reply) == "Facts: FACT-S0, FACT-X1, FACT-X2"
    marker = [
        *messages[:2],
        {"role": "user", "content": "[compaction-proxy: checkpoint request]\nSummarize."},
    ]
    text = text_of(create(client, model=MODEL, max_tokens=64, messages=marker))
    assert text.startswith("<summary>") and "- FACT-X1" in text


RECALL = {
    "name": "compaction_recall",
    "description": "Get back what compaction removed",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


def test_a_question_is_answered_from_the_prompt_or_by_a_recall_call(
    client: anthropic.Anthropic, fake: MessagesUpstreamServer
) -> None:
    """The scripted model's recall (tests/fakes/recall_policy.py) on this API: a ``tool_use``
    of the recall tool after its thinking, answered from the ``tool_result`` next round, with
    preserved thinking enforced (the round's thinking is bound to the tools it was offered)."""
    fake.control(thinking_binding="enforce")
    adaptive = {"type": "adaptive"}
    seen = [
        {"role": "user", "content": "Note: KEY-3 = VALUE-seen"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "QUESTION: what is KEY-3?"},
    ]
    reply = create(client, model=MODEL, max_tokens=256, tools=[LOOKUP, RECALL], messages=seen)
    assert text_of(reply) == "KEY-3 = VALUE-seen"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "QUESTION: what is KEY-3?"}]
    ask = {"model": MODEL, "max_tokens": 256, "thinking": adaptive, "tools": [LOOKUP, RECALL]}
    with client.messages.stream(**ask, messages=messages) as stream:  # type: ignore[arg-type]
        first = stream.get_final_message()
    content = dump(first.content)
    assert [b["type"] for b in content] == ["thinking", "tool_use"]
    assert first.stop_reason == "tool_use"
    assert content[1]["name"] == "compaction_recall" and content[1]["input"] == {"query": "KEY-3"}
    # Not offered, or tool_choice none: no call, and the fact is not known.
    plain = create(client, model=MODEL, max_tokens=256, tools=[LOOKUP], messages=messages)
    assert text_of(plain) == "KEY-3 is not in what I can see"
    closed = create(client, **ask, tool_choice={"type": "none"}, messages=messages)
    assert [b.type for b in closed.content] == ["thinking", "text"]
    assert text_of(closed, 1) == "KEY-3 is not in what I can see"
    answered = [
        *messages,
        {"role": "assistant", "content": content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": content[1]["id"],
                    "content": "KEY-3 = VALUE-x",
                }
            ],
        },
    ]
    second = create(client, **ask, messages=answered)
    assert text_of(second, 1) == "KEY-3 = VALUE-x"
    mixed = [{"role": "user", "content": "QUESTION: what is KEY-3? (mixed)"}]
    both = create(client, **ask, messages=mixed)
    assert [(b.type, getattr(b, "name", None)) for b in both.content] == [
        ("thinking", None),
        ("tool_use", "compaction_recall"),
        ("tool_use", "lookup"),
    ]


# --------------------------------------------------------------------------- steering and routes


def test_status_and_stream_errors(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    payload = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    overloaded = post(raw, payload, **{"x-fake-status": "529"})
    assert overloaded.status_code == 529
    assert error_of(overloaded)["type"] == "overloaded_error"
    streamed = post(raw, {**payload, "stream": True}, **{"x-fake-stream-error": "overloaded_error"})
    assert streamed.status_code == 200
    events = [orjson.loads(d) for d in sse_data(streamed.text)]
    assert [e["type"] for e in events] == ["message_start", "ping", "error"]
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_cut_stream_is_recorded(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    """``X-Fake-Cut-After: N`` drops the connection after N events, as a crashed server does."""
    payload = {
        "model": MODEL,
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with pytest.raises(httpx.RemoteProtocolError):
        post(raw, payload, **{"x-fake-cut-after": "2", "x-fake-tag": "cut"})
    event = fake.wait_for_event(lambda e: e["type"] == "stream_cut")
    assert event is not None and (event["chunks_sent"], event["tag"]) == (2, "cut")


def test_other_paths_are_recorded_and_404(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    response = raw.get("/api/oauth/profile")
    assert response.status_code == 404 and error_of(response)["type"] == "not_found_error"
    assert [r.path for r in fake.requests()] == ["/api/oauth/profile"]
    models = raw.get("/v1/models").json()
    assert [m["id"] for m in models["data"]][:1] == ["claude-sonnet-4-5"] and models[
        "has_more"
    ] is False


def test_requests_can_be_taken(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    raw.get("/first")
    assert [r.path for r in fake.take()] == ["/first"]
    raw.get("/second")
    assert [r.path for r in fake.requests()] == ["/second"]  # taken means cleared


def test_control_rejects_unknown_settings(fake: MessagesUpstreamServer, raw: httpx.Client) -> None:
    assert raw.post("/_control", json={"refusal_style": "openai"}).status_code == 400
    assert raw.post("/_control", json={"windows": 1}).status_code == 400
    assert fake.control()["refusal_style"] == "anthropic"
    assert fake.control()["exact_token_counts"] is True


def test_the_fake_runs_alone(tmp_path: Path) -> None:
    """``python -m tests.fakes.messages`` with its flags, as a developer would start it."""
    alone = MessagesUpstreamServer(
        tmp_path / "alone.log",
        context_window=50,
        extra_args=["--refusal-style", "llamacpp", "--cache-min-tokens", "7"],
    )
    alone.start()
    try:
        settings = alone.control()
        assert (
            settings["context_window"],
            settings["refusal_style"],
            settings["cache_min_tokens"],
        ) == (50, "llamacpp", 7)
    finally:
        alone.stop()
