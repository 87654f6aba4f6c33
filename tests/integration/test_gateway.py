"""The gateway's forwarding contract, seen by an OpenAI SDK client through the real proxy.

Compaction never fires here (small conversations, default config), so every request must reach
the fake upstream exactly as the client sent it and come back exactly as the upstream answered.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.upstream import embedding_for
from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry
from tests.support.sse import sse_data

USER: list[Any] = [{"role": "user", "content": "Hello through the proxy"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]


# --------------------------------------------------------------------------- chat, JSON


def test_non_streaming_completion(openai_client: openai.OpenAI, upstream: UpstreamServer) -> None:
    completion = openai_client.chat.completions.create(model="gpt-4o", messages=USER)
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "echo: Hello through the proxy"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    recorded = upstream.requests(CHAT_PATH)
    assert len(recorded) == 1
    assert recorded[0].method == "POST"
    assert recorded[0].json()["messages"] == USER


async def test_async_client_completion(
    async_openai_client: openai.AsyncOpenAI, upstream: UpstreamServer
) -> None:
    completion = await async_openai_client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "async hello"}]
    )
    assert completion.choices[0].message.content == "echo: async hello"
    assert upstream.last_request(CHAT_PATH).json()["model"] == "gpt-4o-mini"


def test_unknown_request_fields_reach_upstream(
    openai_client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    extra = {"vendor_option": {"nested": [1, 2, {"x": None}]}, "reasoning_effort": "low"}
    messages = [
        {"role": "developer", "content": "be brief", "name": "ops"},
        {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
    ]
    openai_client.chat.completions.create(
        model="gpt-4o",
        messages=messages,  # type: ignore[arg-type]
        temperature=0.25,
        extra_body=extra,
    )
    sent = upstream.last_request(CHAT_PATH).json()
    assert sent["messages"] == messages
    assert sent["vendor_option"] == extra["vendor_option"]
    assert sent["reasoning_effort"] == "low" and sent["temperature"] == 0.25


# --------------------------------------------------------------------------- byte identity

# Valid JSON that any re-serialization would change: spacing, key order, escapes, numbers.
ODD_BODY = (
    b'{ "zeta_unknown" : {"b":1,"a":[1.50,2e3,-0.0]},\n'
    b'\t"messages":[ {"content":"caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\/ slash","role":"user",'
    b'"x_extra":true} ],\r\n'
    b'  "model" :"gpt-4o" ,"temperature":0.70,  "n":1 }'
)
ODD_STREAM_BODY = (
    b'{"stream" : true, "stream_options":{ "include_usage":true },'
    b'"model":"gpt-4o","messages":[{"role":"user","content":"\\u65e5\\u672c  two  spaces"}],'
    b'"metadata":{"k":"v"}}'
)


@pytest.mark.parametrize("body", [ODD_BODY, ODD_STREAM_BODY], ids=["json", "stream"])
def test_unchanged_request_is_forwarded_byte_identical(
    proxy_http: httpx.Client, upstream: UpstreamServer, body: bytes
) -> None:
    orjson.loads(body)  # the fixture itself must be valid JSON
    response = proxy_http.post(
        CHAT_PATH,
        content=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-x"},
    )
    assert response.status_code == 200, response.text
    recorded = upstream.last_request(CHAT_PATH)
    assert recorded.body == body
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.headers["content-length"] == str(len(body))


# --------------------------------------------------------------------------- tool calls


def test_tool_calls_round_trip(openai_client: openai.OpenAI, upstream: UpstreamServer) -> None:
    messages: list[Any] = [{"role": "user", "content": "Please call tool for Paris"}]
    first = openai_client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name) for c in calls] == [  # type: ignore[union-attr]
        ("call_0", "get_weather"),
        ("call_1", "get_time"),
    ]
    assert upstream.last_request(CHAT_PATH).json()["tools"] == TOOLS

    follow_up = [
        *messages,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21C"},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    second = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=follow_up,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert second.choices[0].message.content == "echo tool results: sunny, 21C | 12:00"
    assert upstream.last_request(CHAT_PATH).json()["messages"] == follow_up


def test_tool_calls_streamed(openai_client: openai.OpenAI) -> None:
    stream = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "call tool please"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    names: dict[int, str] = {}
    ids: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish_reasons = []
    for chunk in stream:
        choice = chunk.choices[0]
        for call in choice.delta.tool_calls or []:
            if call.id:
                ids[call.index] = call.id
            if call.function and call.function.name:
                names[call.index] = call.function.name
            if call.function and call.function.arguments:
                arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
        if choice.finish_reason:
            finish_reasons.append(choice.finish_reason)
    assert names == {0: "get_weather", 1: "get_time"}
    assert ids == {0: "call_0", 1: "call_1"}
    assert [json.loads(arguments[i])["index"] for i in (0, 1)] == [0, 1]
    assert finish_reasons == ["tool_calls"]


# --------------------------------------------------------------------------- other routes


def test_models_pass_through(openai_client: openai.OpenAI, upstream: UpstreamServer) -> None:
    ids = [model.id for model in openai_client.models.list()]
    assert ids == upstream.control()["models"]
    assert upstream.last_request().path == "/v1/models"


@pytest.mark.parametrize("encoding_format", ["float", None], ids=["float", "sdk-default"])
def test_embeddings_pass_through(
    openai_client: openai.OpenAI, upstream: UpstreamServer, encoding_format: str | None
) -> None:
    # Without an explicit format the SDK asks for base64 and decodes it itself.
    options: dict[str, Any] = (
        {} if encoding_format is None else {"encoding_format": encoding_format}
    )
    result = openai_client.embeddings.create(
        model="text-embedding-3-small", input=["first text", "second text"], **options
    )
    assert [d.index for d in result.data] == [0, 1]
    for item, text in zip(result.data, ["first text", "second text"], strict=True):
        assert item.embedding == pytest.approx(embedding_for(text), abs=1e-6)
    sent = upstream.last_request("/v1/embeddings").json()
    assert sent["input"] == ["first text", "second text"]
    assert sent["encoding_format"] == (encoding_format or "base64")


# --------------------------------------------------------------------------- routing


def test_routing_by_model_glob(
    proxy_factory: Any, upstream: UpstreamServer, upstream_factory: Any
) -> None:
    second: UpstreamServer = upstream_factory()
    proxy: ProxyServer = proxy_factory(
        proxy_config(
            upstream_entry(upstream, name="primary", models=["gpt-*"]),
            upstream_entry(second, name="secondary", models=["claude-*", "llama-?b"]),
        )
    )
    client = proxy.openai_client()
    for model in ("claude-3-haiku", "gpt-4o", "llama-7b"):
        client.chat.completions.create(model=model, messages=USER)
    # A model no upstream lists is refused, not sent to the first one (a catch-all is `*`).
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="mistral-large", messages=USER)
    assert refused.value.code == "model_not_found"
    first_models = [r.json()["model"] for r in upstream.requests(CHAT_PATH)]
    second_models = [r.json()["model"] for r in second.requests(CHAT_PATH)]
    # First match wins.
    assert first_models == ["gpt-4o"]
    assert second_models == ["claude-3-haiku", "llama-7b"]
    assert second.last_request().headers["host"] == f"127.0.0.1:{second.port}"


# --------------------------------------------------------------------------- health, ids, logs


def test_health_and_readiness(proxy_http: httpx.Client) -> None:
    assert proxy_http.get("/healthz").status_code == 200
    assert proxy_http.get("/readyz").status_code == 200


def test_request_id_generated_and_unique(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    body = {"model": "gpt-4o", "messages": USER}
    first = proxy_http.post(CHAT_PATH, json=body)
    second = proxy_http.post(CHAT_PATH, json=body)
    ids = [first.headers.get("x-request-id"), second.headers.get("x-request-id")]
    assert all(ids) and ids[0] != ids[1]
    # The upstream sends its own x-request-id (as OpenAI does); the client still sees one id.
    assert len(first.headers.get_list("x-request-id")) == 1


def _request_id_cases() -> list[tuple[str, str, dict[str, Any] | None, dict[str, str]]]:
    chat = {"model": "gpt-4o", "messages": USER}
    return [
        ("POST", CHAT_PATH, chat, {}),
        ("POST", CHAT_PATH, {**chat, "stream": True}, {}),
        ("GET", "/v1/models", None, {}),
        ("GET", "/v1/files?limit=1", None, {}),
        ("POST", CHAT_PATH, {"model": "gpt-4o"}, {}),  # 400 from the proxy
        ("POST", CHAT_PATH, chat, {"X-Fake-Status": "500"}),  # upstream error
        ("GET", "/healthz", None, {}),
    ]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    _request_id_cases(),
    ids=["json", "stream", "models", "passthrough", "proxy-400", "upstream-500", "healthz"],
)
def test_request_id_kept_on_every_response(
    proxy_http: httpx.Client,
    upstream: UpstreamServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> None:
    request_id = f"test-{uuid.uuid4().hex}"
    response = proxy_http.request(
        method, path, json=body, headers={"X-Request-Id": request_id, **headers}
    )
    response.read()
    assert response.headers.get("x-request-id") == request_id
    assert response.headers.get_list("x-request-id") == [request_id]


def test_one_structured_log_line_per_request(proxy: ProxyServer, upstream: UpstreamServer) -> None:
    request_id = f"log-{uuid.uuid4().hex}"
    with proxy.http_client() as client:
        response = client.post(
            CHAT_PATH,
            json={"model": "gpt-4o-mini", "messages": USER},
            headers={"X-Request-Id": request_id},
        )
    assert response.status_code == 200

    def access_lines() -> list[dict[str, Any]]:
        found = []
        for line in proxy.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("request_id") == request_id:
                found.append(entry)
        return [e for e in found if "status" in e]

    deadline = time.monotonic() + 10
    lines = access_lines()
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
        lines = access_lines()
    assert len(lines) == 1, lines
    entry = lines[0]
    assert entry["model"] == "gpt-4o-mini"
    assert entry["upstream"] == "fake"
    assert entry["status"] == 200
    byte_fields = [k for k in entry if k.startswith("bytes")]
    duration_fields = [k for k in entry if k.startswith("duration")]
    assert byte_fields and duration_fields, entry
    assert any(isinstance(entry[k], int) and entry[k] > 0 for k in byte_fields), entry
    assert all(isinstance(entry[k], int | float) for k in duration_fields), entry


def test_proxy_error_has_openai_shape(proxy_http: httpx.Client) -> None:
    error = assert_openai_error(proxy_http.post(CHAT_PATH, content=b"{not json"), 400)
    assert error["param"] is None or isinstance(error["param"], str)


def test_streamed_body_is_sse_bytes(proxy_http: httpx.Client) -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": USER}
    with proxy_http.stream("POST", CHAT_PATH, json=body) as response:
        raw = response.read()
        headers = response.headers
    assert response.status_code == 200
    assert headers["content-type"].startswith("text/event-stream")
    data = sse_data(raw)
    assert data[-1] == "[DONE]"
    assert raw.endswith(b"data: [DONE]\n\n")
    text = "".join(orjson.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1])
    assert text == "echo: Hello through the proxy"
