"""The fake upstream behaves like OpenAI where the gateway tests rely on it.

These run straight against the fake (no proxy), so a failing gateway test can be blamed on the
proxy with confidence.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.upstream import ChatReply, ChatRequest, create_app, pattern_bytes
from tests.support.servers import UpstreamServer
from tests.support.sse import sse_data

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
USER = [{"role": "user", "content": "hello fake"}]


@pytest.fixture
def direct(upstream: UpstreamServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=upstream.base_url,
        api_key="sk-direct",
        max_retries=0,
        http_client=httpx.Client(trust_env=False),
    )
    yield client
    client.close()


def test_non_streaming_echo_and_usage(direct: openai.OpenAI, upstream: UpstreamServer) -> None:
    completion = direct.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert completion.model == "gpt-4o"
    assert completion.choices[0].message.content == "echo: hello fake"
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    recorded = upstream.last_request("/v1/chat/completions")
    assert recorded.headers["authorization"] == "Bearer sk-direct"
    assert recorded.json()["messages"] == USER


def test_exact_token_counts_offline(upstream: UpstreamServer) -> None:
    assert upstream.control()["exact_token_counts"] is True


def test_stream_with_usage_chunk(direct: openai.OpenAI) -> None:
    stream = direct.chat.completions.create(
        model="gpt-4o",
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hello fake"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_tool_calls_json_and_stream(direct: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "please call tool now"}]
    completion = direct.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    calls = completion.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name) for c in calls] == [
        ("call_0", "get_weather"),
        ("call_1", "get_time"),
    ]  # type: ignore[union-attr]
    assert completion.choices[0].finish_reason == "tool_calls"

    stream = direct.chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    finish = None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            if delta_call.function and delta_call.function.name:
                names[delta_call.index] = delta_call.function.name
            if delta_call.function and delta_call.function.arguments:
                arguments[delta_call.index] = (
                    arguments.get(delta_call.index, "") + delta_call.function.arguments
                )
        finish = chunk.choices[0].finish_reason or finish
    assert names == {0: "get_weather", 1: "get_time"}
    assert [json.loads(arguments[i]) for i in (0, 1)] == [
        json.loads(c.function.arguments)  # type: ignore[union-attr]
        for c in calls
    ]
    assert finish == "tool_calls"


def test_context_window_enforced(direct: openai.OpenAI, upstream: UpstreamServer) -> None:
    upstream.control(context_window=50)
    direct.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as caught:
        direct.chat.completions.create(model="m", messages=USER, max_tokens=100)  # type: ignore[arg-type]
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 50 tokens" in caught.value.message


def test_status_header(direct: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        direct.chat.completions.create(
            model="m",
            messages=USER,  # type: ignore[arg-type]
            extra_headers={"X-Fake-Status": "429", "X-Fake-Error-Message": "slow down"},
        )
    assert "slow down" in caught.value.message


def test_timed_chunks_carry_send_times(upstream: UpstreamServer) -> None:
    headers = {"X-Fake-Chunks": "4", "X-Fake-Chunk-Delay-Ms": "100"}
    body = {"model": "m", "stream": True, "messages": USER}
    with upstream.client.stream(
        "POST", "/v1/chat/completions", json=body, headers=headers
    ) as response:
        data = sse_data(response.read())
    assert data[-1] == "[DONE]"
    sent = [
        float(m)
        for d in data[:-1]
        for m in re.findall(r"t=([0-9.]+);", orjson.dumps(orjson.loads(d)).decode())
    ]
    assert len(sent) == 4
    assert all(b - a >= 90 for a, b in itertools.pairwise(sent))


def test_cancelled_stream_is_recorded(upstream: UpstreamServer) -> None:
    headers = {"X-Fake-Chunks": "100", "X-Fake-Chunk-Delay-Ms": "50", "X-Fake-Tag": "cancel-me"}
    body = {"model": "m", "stream": True, "messages": USER}
    with (
        httpx.Client(base_url=upstream.url, trust_env=False) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        next(response.iter_lines())
    event = upstream.wait_for_event(lambda e: e["tag"] == "cancel-me")
    assert event is not None and event["type"] == "stream_cancelled"
    assert event["chunks_sent"] < 100


def test_hang_is_abandoned_on_client_timeout(upstream: UpstreamServer) -> None:
    with (
        httpx.Client(base_url=upstream.url, trust_env=False) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.get("/v1/models", headers={"X-Fake-Hang": "1", "X-Fake-Tag": "h"}, timeout=0.3)
    event = upstream.wait_for_event(lambda e: e["tag"] == "h")
    assert event is not None and event["type"] == "hang_abandoned"


def test_delay_header_delays(upstream: UpstreamServer) -> None:
    started = time.monotonic()
    upstream.client.get("/v1/models", headers={"X-Fake-Delay-Ms": "300"}).raise_for_status()
    assert time.monotonic() - started >= 0.3


def test_catch_all_echo_and_large_response(upstream: UpstreamServer) -> None:
    response = upstream.client.put("/v1/files/abc?x=1&x=2&y=%20z", content=b"\x00\xffbin")
    echoed = response.json()
    assert (echoed["method"], echoed["path"], echoed["query"]) == (
        "PUT",
        "/v1/files/abc",
        "x=1&x=2&y=%20z",
    )
    assert echoed["body_len"] == 5
    recorded = upstream.last_request()
    assert recorded.body == b"\x00\xffbin" and recorded.query == "x=1&x=2&y=%20z"
    big = upstream.client.get("/v1/files/x/content", headers={"X-Fake-Response-Bytes": "100000"})
    assert big.content == pattern_bytes(100_000)


def test_models_and_embeddings(direct: openai.OpenAI) -> None:
    assert "gpt-4o" in [m.id for m in direct.models.list()]
    as_floats = direct.embeddings.create(
        model="text-embedding-3-small", input=["a", "b"], encoding_format="float"
    )
    default = direct.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [len(d.embedding) for d in as_floats.data] == [8, 8]
    assert as_floats.data[0].embedding != as_floats.data[1].embedding
    for got, want in zip(default.data, as_floats.data, strict=True):
        assert got.embedding == pytest.approx(want.embedding, abs=1e-6)


def test_control_rejects_unknown_settings(upstream: UpstreamServer) -> None:
    response = upstream.client.post("/_control", json={"contex_window": 5})
    assert response.status_code == 400


async def test_pluggable_responder_in_process() -> None:
    def summarizer(request: ChatRequest) -> ChatReply | None:
        if "checkpoint" in str(request.messages[0].get("content", "")):
            return ChatReply(content="## Goal\nsummary")
        return None

    app = create_app(responders=[summarizer], model_context_windows={"small": 30})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        system = {"role": "system", "content": "write a checkpoint summary"}
        reply = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": [system, *USER]}
        )
        assert reply.json()["choices"][0]["message"]["content"] == "## Goal\nsummary"
        plain = await client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
        assert plain.json()["choices"][0]["message"]["content"] == "echo: hello fake"
        long = [{"role": "user", "content": "word " * 100}]
        small = await client.post("/v1/chat/completions", json={"model": "small", "messages": long})
        assert small.status_code == 400
    assert len(app.state.fake.requests) == 3


def test_context_window_from_command_line(upstream_factory: Any) -> None:
    small: UpstreamServer = upstream_factory(context_window=30)
    assert small.control()["context_window"] == 30
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 50}]}
    response = small.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert small.client.post(
        "/v1/chat/completions", json={"model": "m", "messages": USER}
    ).is_success


LONG = [{"role": "user", "content": "word " * 200}]


async def _refused(style: str, *, stream: bool) -> httpx.Response:
    app = create_app(model_context_windows={"small": 100})
    app.state.fake.settings.refusal_style = style
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        body = {"model": "small", "messages": LONG, "stream": stream, "max_tokens": 10}
        return await client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("style", "family", "window"),
    [
        ("openai", "openai", 100),
        ("vllm", "vllm", 100),
        ("vllm_new", "vllm", 100),
        ("llamacpp", "llama.cpp", 100),
        ("groq", "groq", None),
    ],
)
async def test_refusal_styles(style: str, family: str, window: int | None, stream: bool) -> None:
    """Each family's own refusal, as JSON, before any stream byte; the proxy's parser reads it."""
    from compaction_proxy.upstream import detect_overflow

    response = await _refused(style, stream=stream)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    if style == "vllm":
        assert body["object"] == "error" and body["code"] == 400
    elif style == "llamacpp":
        assert body["error"]["type"] == "exceed_context_size_error"
        assert body["error"]["n_ctx"] == 100 and body["error"]["n_prompt_tokens"] > 100
    elif style == "vllm_new":
        assert "at least" in body["error"]["message"] and body["error"]["code"] == 400
    else:
        assert body["error"]["code"] == "context_length_exceeded"
    overflow = detect_overflow(400, response.content)
    assert overflow is not None and overflow.family == family and overflow.window == window


def test_refusal_style_through_control(upstream: UpstreamServer) -> None:
    upstream.control(context_window=50, refusal_style="llamacpp")
    body = {"model": "m", "messages": LONG}
    refused = upstream.client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["n_ctx"] == 50
    response = upstream.client.post("/_control", json={"refusal_style": "nginx"})
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("style", "field"),
    [
        ("vllm", lambda e: e["max_model_len"]),
        ("openrouter", lambda e: e["context_length"]),
        ("lmstudio", lambda e: e["loaded_instances"][0]["config"]["context_length"]),
    ],
)
def test_published_windows(upstream: UpstreamServer, style: str, field: Any) -> None:
    from compaction_proxy.upstream import parse_models_listing

    upstream.control(
        models=["local-model", "gpt-4o"],
        model_context_windows={"local-model": 16_384},
        publish_windows=style,
    )
    listing = upstream.client.get("/v1/models").json()
    entries = {e["id"]: e for e in listing["data"]}
    assert field(entries["local-model"]) == 16_384
    assert "max_model_len" not in entries["gpt-4o"] and "context_length" not in entries["gpt-4o"]
    assert parse_models_listing(orjson.dumps(listing)) == {"local-model": 16_384}


def test_windows_unpublished_by_default(upstream: UpstreamServer) -> None:
    from compaction_proxy.upstream import parse_models_listing

    upstream.control(model_context_windows={"gpt-4o": 16_384})
    listing = upstream.client.get("/v1/models")
    assert parse_models_listing(listing.content) == {}
    assert upstream.client.post("/_control", json={"publish_windows": "tgi"}).status_code == 400


def test_a_prompt_that_extends_an_earlier_one_reports_cached_tokens(
    direct: openai.OpenAI, upstream: UpstreamServer
) -> None:
    upstream.reset()
    first: list[Any] = [
        {"role": "system", "content": "You are terse. " * 50},
        {"role": "user", "content": "hello fake"},
    ]
    cold = direct.chat.completions.create(model="gpt-4o", messages=first)
    assert cold.usage is not None and cold.usage.prompt_tokens_details is not None
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    longer = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    warm = direct.chat.completions.create(model="gpt-4o", messages=longer)
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached < warm.usage.prompt_tokens
    # other tools: another prefix
    other = direct.chat.completions.create(model="gpt-4o", messages=longer, tools=TOOLS)  # type: ignore[arg-type]
    assert other.usage is not None and other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_take_reads_and_clears_in_one_step(direct: openai.OpenAI, upstream: UpstreamServer) -> None:
    """What the session drivers count summarizer calls with: a request recorded between a
    read and a clear was lost (a background summary call, miscounted)."""
    for text in ("one", "two"):
        direct.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    taken = upstream.take("/v1/chat/completions")
    assert [r.json()["messages"][0]["content"] for r in taken] == ["one", "two"]
    assert upstream.requests() == []
    direct.chat.completions.create(model="m", messages=[{"role": "user", "content": "three"}])
    assert [r.json()["messages"][0]["content"] for r in upstream.take()] == ["three"]
