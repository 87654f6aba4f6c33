"""``POST /v1/messages`` and its ``count_tokens`` through the proxy, over real processes.

One fake Anthropic upstream (tests/fakes/messages: it enforces the window, tool pairing, signed
thinking and at most four breakpoints the way Anthropic's API does) and one proxy for the
module; the official ``anthropic`` SDK (JSON and stream) and raw HTTP as clients. What a user
of Claude Code or the SDK meets: small requests go as their own bytes (headers, query and
``anthropic-*`` fields untouched), a long tool session is compacted with every request
accepted, ``count_tokens`` answers for what would be forwarded, and the proxy's own errors
come in Anthropic's shape, which the SDK raises as its own exceptions.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.fakes.messages.prompt import Counter, build_prompt
from tests.support.messages_upstream import (
    COUNT_TOKENS,
    MESSAGES,
    MessagesUpstreamServer,
    anthropic_client,
)
from tests.support.processes import run_python_module
from tests.support.servers import ProxyServer, proxy_config, upstream_entry, write_config

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

MODEL = "claude-sonnet-4-5"
DOWN = "claude-down"  # routed to an upstream nobody listens on
WINDOW = 8_000
BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("messages") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    fake.reset()
    fake.control(model_context_windows={MODEL: WINDOW})
    yield fake
    fake.reset()


@pytest.fixture(scope="module")
def proxy(
    fake: MessagesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ProxyServer:
    db = tmp_path_factory.mktemp("messages-store") / "checkpoints.db"
    config = proxy_config(
        upstream_entry(free_url() + "/v1", name="down", models=[DOWN]),
        upstream_entry(fake.url + "/v1", name="anthropic"),
        store={"backend": "sqlite", "path": str(db)},
        models={MODEL: {"context_window": WINDOW}},
    )
    server: ProxyServer = module_proxy_factory(config)
    return server


@pytest.fixture
def client(proxy: ProxyServer) -> Iterator[anthropic.Anthropic]:
    sdk = anthropic_client(proxy.url, "sk-ant-client")
    yield sdk
    sdk.close()


def free_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def session(steps: int, lines: int = 120) -> list[dict[str, Any]]:
    """A single-turn tool loop as Claude Code sends it: a task, then steps of one call each."""
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
                        "input": {"n": step},
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


def forwarded(record: Any) -> dict[str, Any]:
    body = record.json()
    assert isinstance(body, dict)
    return body


def test_a_small_request_goes_as_the_clients_own_bytes(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    # Claude Code's shape: ?beta=true, x-api-key, anthropic-version and -beta, odd spacing.
    raw = (
        b'{"model": "claude-sonnet-4-5", "max_tokens": 64, "seed_like": 1180591620717411303424,'
        b' "messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": "u1"}}'
    )
    headers = {
        "content-type": "application/json",
        "x-api-key": "sk-ant-client",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        reply = http.post(MESSAGES + "?beta=true", content=raw, headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-compaction-strategies"] == "none"
    record = upstream.messages()[-1]
    assert record.body == raw
    assert record.query == "beta=true"
    for name, value in headers.items():
        assert record.headers.get(name) == value


def test_a_long_session_is_compacted_and_every_request_is_accepted(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    history = session(40)
    compacted = 0
    for steps in range(4, 41, 6):
        messages = history[: 1 + 2 * steps]
        if steps % 2:
            with client.messages.stream(
                model=MODEL, max_tokens=256, tools=[BASH], messages=messages
            ) as stream:
                final = stream.get_final_message()
                headers = stream.response.headers
            usage = final.usage
        else:
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=256, tools=[BASH], messages=messages
            )
            usage = raw.parse().usage
            headers = raw.headers
        before = int(headers["x-compaction-tokens-before"])
        after = int(headers["x-compaction-tokens-after"])
        compacted += after < before
        assert usage.input_tokens + 256 <= WINDOW
        sent = forwarded(upstream.messages()[-1])["messages"]
        assert sent[0]["role"] == "user"
        assert sent[-1] == messages[-1]  # the newest step goes verbatim
    assert compacted >= 3


def test_count_tokens_counts_what_would_be_forwarded(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    messages = session(30)
    direct = upstream.anthropic_client()
    try:
        whole = direct.messages.count_tokens(model=MODEL, messages=messages, tools=[BASH])
    finally:
        direct.close()
    raw = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=messages, tools=[BASH]
    )
    counted = raw.parse().input_tokens
    assert counted < WINDOW < whole.input_tokens
    assert int(raw.headers["x-compaction-tokens-after"]) < int(
        raw.headers["x-compaction-tokens-before"]
    )
    assert "x-compaction-counted" not in raw.headers  # the upstream counted it
    asked = forwarded(upstream.requests(COUNT_TOKENS)[-1])
    assert len(asked["messages"]) < len(messages)
    assert asked["messages"][-1] == messages[-1]
    # The upstream counted the compacted body with its own tokenizer: the count is its count.
    assert build_prompt(asked, Counter()).total == counted
    # The request itself is compacted the same way (its own output reserve aside): it fits.
    reply = client.messages.create(model=MODEL, max_tokens=64, tools=[BASH], messages=messages)
    assert reply.usage.input_tokens + 64 <= WINDOW


def test_count_tokens_is_answered_by_the_proxy_where_the_upstream_has_no_route(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    upstream.control(count_route=False)
    small = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}]
    )
    assert small.headers["x-compaction-counted"] == "proxy"
    assert 0 < small.parse().input_tokens < 50
    big = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=session(30), tools=[BASH]
    )
    assert big.headers["x-compaction-counted"] == "proxy"
    assert big.parse().input_tokens == pytest.approx(
        int(big.headers["x-compaction-tokens-after"]), rel=0.5
    )
    assert big.parse().input_tokens < WINDOW


def test_count_tokens_off_passes_through(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    body = orjson.dumps({"model": MODEL, "messages": session(30)})
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        reply = http.post(
            COUNT_TOKENS,
            content=body,
            headers={"content-type": "application/json", "x-api-key": "k", "x-compaction": "off"},
        )
    assert reply.status_code == 200
    assert reply.json()["input_tokens"] > WINDOW
    assert upstream.requests(COUNT_TOKENS)[-1].body == body


def test_the_proxys_own_errors_are_in_anthropics_shape(
    client: anthropic.Anthropic, proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.tool_use_id" in body["error"]["message"]
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        broken = http.post(
            MESSAGES, content=b'{"model": ', headers={"content-type": "application/json"}
        )
        counted = http.post(
            COUNT_TOKENS,
            content=orjson.dumps({"model": MODEL, "messages": [{"role": "bot", "content": "x"}]}),
            headers={"content-type": "application/json"},
        )
    assert broken.status_code == 400 and broken.json()["type"] == "error"
    assert counted.status_code == 400
    assert counted.json()["error"]["message"].startswith("messages.0.role")
    assert upstream.messages() == []  # nothing bad went upstream


def test_an_upstream_that_is_down_is_a_502_in_anthropics_shape(
    client: anthropic.Anthropic,
) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(
            model=DOWN, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "api_error"
    assert "down" in body["error"]["message"]


def test_the_preview_takes_a_messages_body(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    body = {"model": MODEL, "max_tokens": 256, "tools": [BASH], "messages": session(30)}
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        reply = http.post(
            "/v1/compaction/preview",
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "x-compaction": "dry-run-local"},
        )
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["changed"] is True
    shown = answer["request"]
    assert shown["tools"] == [BASH] and shown["max_tokens"] == 256
    assert len(shown["messages"]) < len(body["messages"])
    assert shown["messages"][-1] == body["messages"][-1]
    assert all(isinstance(m["content"], list | str) for m in shown["messages"])
    assert answer["report"]["tokens_after"] < answer["report"]["tokens_before"]
    assert upstream.messages() == []  # a preview forwards nothing


def test_compact_writes_a_messages_body_back(tmp_path: Path) -> None:
    config = proxy_config(
        upstream_entry("http://127.0.0.1:9/v1", name="nowhere"),
        models={MODEL: {"context_window": WINDOW}},
    )
    path = write_config(tmp_path / "config.yaml", config)
    source = tmp_path / "session.json"
    body = {
        "model": MODEL,
        "max_tokens": 256,
        "system": [{"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}],
        "messages": session(30),
    }
    source.write_bytes(orjson.dumps(body))
    out = tmp_path / "out.json"
    result = run_python_module(
        "compaction_proxy",
        "compact",
        str(source),
        "-c",
        str(path),
        "-o",
        str(out),
        "--no-summarize",
    )
    assert result.returncode == 0, result.stderr
    written = orjson.loads(out.read_bytes())
    assert written["system"] == body["system"] and written["max_tokens"] == 256
    assert len(written["messages"]) < len(body["messages"])
    assert written["messages"][0] == body["messages"][0]  # the task is kept (first user group)
    assert written["messages"][-1] == body["messages"][-1]
    uses = [
        block["id"]
        for message in written["messages"]
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    results = [
        block["tool_use_id"]
        for message in written["messages"]
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert uses == results  # every call kept has its result, in order


def test_metrics_label_the_messages_api(
    client: anthropic.Anthropic, proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    client.messages.create(model=MODEL, max_tokens=64, tools=[BASH], messages=session(20))
    client.messages.count_tokens(model=MODEL, messages=session(2))
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        metrics = http.get("/metrics").text
    assert 'compaction_proxy_requests_total{route="messages",status="200"}' in metrics
    assert 'compaction_proxy_requests_total{route="messages_count_tokens",status="200"}' in metrics
    assert 'compaction_proxy_api_prompt_tokens_total{api="messages",stage="before"}' in metrics


def test_a_client_that_leaves_mid_stream_closes_the_upstream_stream(
    client: anthropic.Anthropic, upstream: MessagesUpstreamServer
) -> None:
    upstream.control(chunk_delay_ms=100)  # ~10 text deltas, a second in all
    with client.messages.stream(
        model=MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": "word " * 200}],
        extra_headers={"x-fake-tag": "leaves"},
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break  # the first delta: the client is gone from here
    cancelled = upstream.wait_for_event(
        lambda e: e["type"] == "stream_cancelled" and e.get("tag") == "leaves"
    )
    assert cancelled is not None, "the upstream never saw the client leave"
    assert cancelled["chunks_sent"] < 8


def test_a_passthrough_path_of_anthropics_api_takes_the_operators_key_its_way(
    fake: MessagesUpstreamServer, upstream: MessagesUpstreamServer, module_proxy_factory: Any
) -> None:
    config = proxy_config(
        upstream_entry(fake.url + "/v1", name="anthropic", api_key="sk-ant-operator"),
        allow_anonymous_spend=True,
    )
    keyed: ProxyServer = module_proxy_factory(config)
    with httpx.Client(base_url=keyed.url, trust_env=False, timeout=30) as http:
        http.get(
            "/v1/messages/batches",
            headers={"x-api-key": "sk-ant-caller", "authorization": "Bearer sk-caller"},
        )
    [seen] = upstream.requests("/v1/messages/batches")
    assert seen.headers.get("x-api-key") == "sk-ant-operator"
    assert "authorization" not in seen.headers
