"""The ASGI app in-process: a scripted ASGI server on one side, respx as the upstream.

The app is called directly with scripted `receive`/`send`, so each test sees the exact ASGI
message sequence the proxy produces (one body message per upstream chunk, `more_body` flags)
and can make the client disappear at a chosen moment.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.app import ProxyApp, build_edge
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream

OPENAI = "http://openai.test/v1"
LOCAL = "http://local.test/v1"


def settings(**server: Any) -> Settings:
    return Settings(
        server={"max_body_bytes": 1024, **server},
        upstreams=[
            {"name": "openai", "base_url": OPENAI, "models": ["gpt-*"]},
            {"name": "local", "base_url": LOCAL, "models": ["llama-*"], "api_key": "sk-local"},
        ],
    )


@dataclass
class Harness:
    app: ProxyApp
    mock: respx.MockRouter
    client: httpx.AsyncClient


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.body:
            yield self.body


class _RespxTransport(httpx.AsyncBaseTransport):
    """Like httpx.MockTransport over a respx router, but every answer arrives unread, as from a
    real transport (httpx.Response(content=...) is pre-read and cannot be streamed again)."""

    def __init__(self, mock: respx.MockRouter) -> None:
        self.mock = mock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        response = await self.mock.async_handler(request)
        if isinstance(response.stream, httpx.ByteStream):
            return httpx.Response(
                response.status_code, headers=response.headers, stream=_Chunks(response.content)
            )
        return response


def in_process(config: Settings, client: httpx.AsyncClient) -> ProxyApp:
    """The app built by the production factory around `client` (respx as the upstream), which
    carries the forwarded traffic as well as the proxy's own calls."""
    edge = build_edge(config, transport=HttpxUpstream(client))
    return ProxyApp(config, edge)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Harness]]:
    clients: list[httpx.AsyncClient] = []

    def build(**server: Any) -> Harness:
        mock = respx.MockRouter(assert_all_called=False, assert_all_mocked=True)
        client = httpx.AsyncClient(transport=_RespxTransport(mock))
        app = in_process(settings(**server), client)
        clients.append(client)
        return Harness(app, mock, client)

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
def h(make: Callable[..., Harness]) -> Harness:
    return make()


@dataclass
class Result:
    messages: list[dict[str, Any]]
    receive_calls: int = 0

    @property
    def start(self) -> dict[str, Any]:
        assert self.messages[0]["type"] == "http.response.start"
        return self.messages[0]

    @property
    def status(self) -> int:
        return int(self.start["status"])

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.start["headers"])

    def header(self, name: str) -> str | None:
        values = self.header_all(name)
        return values[0] if values else None

    def header_all(self, name: str) -> list[str]:
        return [v.decode() for k, v in self.headers if k.decode().lower() == name]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return self.messages[1:]

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.bodies)

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def complete(self) -> bool:
        return bool(self.bodies) and self.bodies[-1].get("more_body", False) is False


@dataclass
class Client:
    """A scripted ASGI server connection: body messages, then a disconnect on demand."""

    body_messages: list[dict[str, Any]]
    disconnect: asyncio.Event = field(default_factory=asyncio.Event)
    sent: list[dict[str, Any]] = field(default_factory=list)
    receive_calls: int = 0

    async def receive(self) -> dict[str, Any]:
        self.receive_calls += 1
        if self.body_messages:
            return self.body_messages.pop(0)
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(dict(message))


def scope(
    method: str,
    path: str,
    headers: list[tuple[str, str]] | None = None,
    query: bytes = b"",
    raw_path: bytes | None = None,
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path if raw_path is not None else path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers or []],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }


async def call(
    app: ProxyApp,
    method: str,
    path: str,
    body: bytes | list[bytes] = b"",
    headers: list[tuple[str, str]] | None = None,
    *,
    content_length: bool = True,
    query: bytes = b"",
    raw_path: bytes | None = None,
    client: Client | None = None,
) -> Result:
    parts = body if isinstance(body, list) else [body]
    all_headers = list(headers or [])
    if content_length and not isinstance(body, list):
        all_headers.append(("content-length", str(len(body))))
    if client is None:
        messages = [
            {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
            for i, part in enumerate(parts)
        ]
        client = Client(messages)
    await asyncio.wait_for(
        app(scope(method, path, all_headers, query, raw_path), client.receive, client.send),
        timeout=5,
    )
    return Result(client.sent, client.receive_calls)


CHAT = b'{"model": "gpt-4o",  "messages": [{"role":"user","content":"h\\u00e9 \xc3\xa9"}], "z": 1}'
JSON = [("content-type", "application/json")]


class ScriptedStream(httpx.AsyncByteStream):
    """An upstream body that yields chunk by chunk, optionally waiting on gates in between."""

    def __init__(self, chunks: list[bytes], *, gates: list[asyncio.Event] | None = None) -> None:
        self.chunks = chunks
        self.gates = gates or []
        self.yielded = 0
        self.closed = False
        self.cancelled = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            for i, chunk in enumerate(self.chunks):
                if i < len(self.gates):
                    await self.gates[i].wait()
                self.yielded += 1
                yield chunk
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def aclose(self) -> None:
        self.closed = True


# --- forwarding -----------------------------------------------------------------------------------


async def test_chat_forwards_original_bytes(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, json={"id": "cmpl-1"}, headers={"x-upstream": "yes"}
    )
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.status == 200
    assert result.json == {"id": "cmpl-1"}
    assert result.header("x-upstream") == "yes"
    sent = route.calls.last.request
    assert sent.content == CHAT  # not re-serialised: spacing, escapes and key order intact
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["content-length"] == str(len(CHAT))
    assert result.complete


async def test_chat_routes_by_model_and_uses_upstream_key(h: Harness) -> None:
    route = h.mock.post(f"{LOCAL}/chat/completions").respond(200, json={})
    body = b'{"model": "llama-3", "messages": []}'
    headers = [*JSON, ("authorization", "Bearer sk-client")]
    result = await call(h.app, "POST", "/v1/chat/completions", body, headers)
    assert result.status == 200
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-local"


async def test_client_authorization_passes_through(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200, json={})
    headers = [*JSON, ("authorization", "Bearer sk-client"), ("x-compaction", "off")]
    await call(h.app, "POST", "/v1/chat/completions", CHAT, headers)
    request = route.calls.last.request
    assert request.headers["authorization"] == "Bearer sk-client"
    assert "x-compaction" not in request.headers


async def test_upstream_error_passes_through(h: Harness) -> None:
    upstream_body = b'{"error": {"message": "slow down", "type": "rate_limit"}}  '
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        429,
        content=upstream_body,
        headers={"content-type": "application/json", "retry-after": "7"},
    )
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.status == 429
    assert result.body == upstream_body
    assert result.header("retry-after") == "7"


async def test_response_hop_by_hop_and_length_dropped(h: Harness) -> None:
    h.mock.get(f"{OPENAI}/models").respond(
        200,
        content=b"{}",
        headers={"server": "upstream", "date": "x", "connection": "keep-alive", "x-kept": "1"},
    )
    result = await call(h.app, "GET", "/v1/models")
    names = [k.decode() for k, _ in result.headers]
    assert "server" not in names
    assert "date" not in names
    assert "connection" not in names
    assert "content-length" not in names
    assert result.header("x-kept") == "1"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (httpx.ConnectError("All connection attempts failed"), 502, "upstream_unreachable"),
        (httpx.RemoteProtocolError("Server disconnected"), 502, "upstream_protocol_error"),
        (httpx.ConnectTimeout("timed out"), 504, "upstream_timeout"),
        (httpx.ReadTimeout("timed out"), 504, "upstream_timeout"),
        (httpx.PoolTimeout("timed out"), 504, "upstream_timeout"),
    ],
)
async def test_transport_errors_map_to_502_504(
    h: Harness, error: Exception, status: int, code: str
) -> None:
    h.mock.post(f"{OPENAI}/chat/completions").mock(side_effect=error)
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.status == status
    assert result.header("content-type") == "application/json"
    payload = result.json
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["type"] == "upstream_error"
    assert payload["error"]["code"] == code
    assert "upstream 'openai'" in payload["error"]["message"]
    assert re.fullmatch(r"[0-9a-f]{32}", result.header("x-request-id") or "")


async def test_transport_error_on_passthrough(h: Harness) -> None:
    h.mock.get(f"{OPENAI}/models").mock(side_effect=httpx.ReadTimeout("slow"))
    result = await call(h.app, "GET", "/v1/models")
    assert result.status == 504


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_json"),
        (b"{nope", "invalid_json"),
        (b"[1]", "invalid_json"),
        (b'{"model": "gpt-4o"}', "missing_required_parameter"),
        (b'{"model": 5, "messages": []}', "invalid_type"),
    ],
)
async def test_bad_chat_body_is_400_and_not_forwarded(h: Harness, body: bytes, code: str) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200)
    result = await call(h.app, "POST", "/v1/chat/completions", body, JSON)
    assert result.status == 400
    assert result.json["error"]["code"] == code
    assert result.json["error"]["type"] == "invalid_request_error"
    assert not route.called


async def test_bad_content_length_is_400(h: Harness) -> None:
    result = await call(
        h.app,
        "POST",
        "/v1/chat/completions",
        CHAT,
        [*JSON, ("content-length", "abc")],
        content_length=False,
    )
    assert result.status == 400
    assert result.json["error"]["code"] == "invalid_content_length"


# --- pass-through ---------------------------------------------------------------------------------


async def test_passthrough_keeps_query_string_and_raw_path(h: Harness) -> None:
    route = h.mock.get(url__regex=r"^http://openai\.test/v1/files/.*").respond(200, json=[])
    await call(
        h.app,
        "GET",
        "/v1/files/file/abc",
        query=b"limit=2&after=a%20b&order=desc",
        raw_path=b"/v1/files/file%2Fabc",
    )
    url = route.calls.last.request.url
    assert url.raw_path == b"/v1/files/file%2Fabc?limit=2&after=a%20b&order=desc"
    assert url.host == "openai.test"


async def test_passthrough_routes_small_json_by_model(h: Harness) -> None:
    route = h.mock.post(f"{LOCAL}/embeddings").respond(200, json={"data": []})
    body = b'{"model": "llama-embed", "input": "x"}'
    result = await call(h.app, "POST", "/v1/embeddings", body, JSON)
    assert result.status == 200
    assert route.calls.last.request.content == body
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-local"


async def test_passthrough_streams_chunked_body(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/files").respond(200, json={"id": "file-1"})
    parts = [b"--b\r\n", b"part-one", b"part-two\r\n--b--"]
    result = await call(
        h.app, "POST", "/v1/files", parts, [("content-type", "multipart/form-data; boundary=b")]
    )
    assert result.status == 200
    assert route.calls.last.request.content == b"".join(parts)


async def test_passthrough_other_methods(h: Harness) -> None:
    route = h.mock.delete(f"{OPENAI}/files/file-1").respond(200, json={"deleted": True})
    result = await call(h.app, "DELETE", "/v1/files/file-1")
    assert result.status == 200
    assert route.calls.last.request.content == b""


# --- body limits ----------------------------------------------------------------------------------


async def test_413_on_declared_length_before_reading(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200)
    big = b"x" * 2000
    result = await call(h.app, "POST", "/v1/chat/completions", big, JSON)
    assert result.status == 413
    assert result.json["error"]["code"] == "request_too_large"
    assert "1024" in result.json["error"]["message"]
    assert result.receive_calls == 0
    assert not route.called


async def test_413_on_chunked_chat_body(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200)
    parts = [b"x" * 400, b"x" * 400, b"x" * 400, b"never read"]
    client = Client([{"type": "http.request", "body": part, "more_body": True} for part in parts])
    result = await call(h.app, "POST", "/v1/chat/completions", [], JSON, client=client)
    assert result.status == 413
    assert client.receive_calls == 3  # refused as soon as the total passed the limit
    assert not route.called


async def test_chunked_body_at_limit_accepted(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200, json={})
    head, tail = b'{"model": "gpt-4o", "messages": [], "pad": "', b'"}'
    body = head + b"x" * (1024 - len(head) - len(tail)) + tail
    assert len(body) == 1024
    result = await call(h.app, "POST", "/v1/chat/completions", [body[:500], body[500:]], JSON)
    assert result.status == 200
    assert route.calls.last.request.content == body


async def test_413_on_declared_length_passthrough(h: Harness) -> None:
    result = await call(h.app, "POST", "/v1/files", b"y" * 1025, [("content-type", "text/plain")])
    assert result.status == 413
    assert result.receive_calls == 0


async def test_413_on_chunked_passthrough_body(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/files").respond(200)
    parts = [b"y" * 600, b"y" * 600, b"y"]
    result = await call(h.app, "POST", "/v1/files", parts, [("content-type", "text/plain")])
    assert result.status == 413
    assert result.json["error"]["code"] == "request_too_large"
    assert not route.called


# --- inbound auth ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("authorization", "Bearer wrong")],
        [("authorization", "Bearer proxy-key-2x")],
        [("authorization", "Basic proxy-key-1")],
        [("x-api-key", "nope")],
        [("authorization", "Bearer ")],
    ],
)
async def test_401_without_valid_key(
    make: Callable[..., Harness], headers: list[tuple[str, str]]
) -> None:
    h = make(api_keys=["proxy-key-1", "proxy-key-2"])
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200)
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, [*JSON, *headers])
    assert result.status == 401
    assert result.json["error"]["code"] == "invalid_api_key"
    assert result.json["error"]["type"] == "invalid_request_error"
    assert "proxy-key" not in result.body.decode()
    assert result.header("x-request-id")
    assert not route.called


async def test_401_on_passthrough_too(make: Callable[..., Harness]) -> None:
    h = make(api_keys=["proxy-key-1"])
    route = h.mock.get(f"{OPENAI}/models").respond(200)
    result = await call(h.app, "GET", "/v1/models")
    assert result.status == 401
    assert not route.called


@pytest.mark.parametrize(
    "headers",
    [
        [("authorization", "Bearer proxy-key-2")],
        [("authorization", "bearer proxy-key-1")],
        [("authorization", "Bearer  proxy-key-1 ")],
        [("x-api-key", "proxy-key-1")],
    ],
)
async def test_valid_proxy_key_accepted_and_not_forwarded(
    make: Callable[..., Harness], headers: list[tuple[str, str]]
) -> None:
    h = make(api_keys=["proxy-key-1", "proxy-key-2"])
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200, json={})
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, [*JSON, *headers])
    assert result.status == 200
    forwarded = route.calls.last.request.headers
    assert "authorization" not in forwarded
    assert "x-api-key" not in forwarded


async def test_proxy_key_replaced_by_upstream_key(make: Callable[..., Harness]) -> None:
    h = make(api_keys=["proxy-key-1"])
    route = h.mock.post(f"{LOCAL}/chat/completions").respond(200, json={})
    body = b'{"model": "llama-3", "messages": []}'
    headers = [*JSON, ("authorization", "Bearer proxy-key-1")]
    await call(h.app, "POST", "/v1/chat/completions", body, headers)
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-local"


async def test_no_proxy_keys_means_open(h: Harness) -> None:
    h.mock.get(f"{OPENAI}/models").respond(200, json={})
    assert (await call(h.app, "GET", "/v1/models")).status == 200


async def test_health_needs_no_key(make: Callable[..., Harness]) -> None:
    h = make(api_keys=["proxy-key-1"])
    result = await call(h.app, "GET", "/healthz")
    assert result.status == 200
    assert result.json == {"status": "ok"}


async def test_readyz_reflects_client(h: Harness) -> None:
    assert (await call(h.app, "GET", "/readyz")).status == 200
    await h.client.aclose()
    result = await call(h.app, "GET", "/readyz")
    assert result.status == 503
    assert result.json["checks"]["upstream_client"] == "not ready"


# --- request ids ----------------------------------------------------------------------------------


async def test_request_id_kept(h: Harness) -> None:
    route = h.mock.get(f"{OPENAI}/models").respond(200, json={})
    result = await call(h.app, "GET", "/v1/models", headers=[("x-request-id", "client-id_1.2:3")])
    assert result.header_all("x-request-id") == ["client-id_1.2:3"]
    assert route.calls.last.request.headers["x-request-id"] == "client-id_1.2:3"


async def test_request_id_generated(h: Harness) -> None:
    h.mock.get(f"{OPENAI}/models").respond(200, json={})
    first = (await call(h.app, "GET", "/v1/models")).header("x-request-id")
    second = (await call(h.app, "GET", "/v1/models")).header("x-request-id")
    assert first and re.fullmatch(r"[0-9a-f]{32}", first)
    assert second and second != first


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "new\\nline", ""])
async def test_malformed_request_id_replaced(h: Harness, bad: str) -> None:
    h.mock.get(f"{OPENAI}/models").respond(200, json={})
    result = await call(h.app, "GET", "/v1/models", headers=[("x-request-id", bad)])
    assert result.header_all("x-request-id") != [bad]
    assert re.fullmatch(r"[0-9a-f]{32}", result.header("x-request-id") or "")


async def test_request_id_on_proxy_errors_and_fastapi_routes(h: Harness) -> None:
    headers = [("x-request-id", "rid-1")]
    error = await call(h.app, "POST", "/v1/chat/completions", b"{}", [*JSON, *headers])
    assert error.status == 400
    assert error.header("x-request-id") == "rid-1"
    health = await call(h.app, "GET", "/healthz", headers=headers)
    assert health.header_all("x-request-id") == ["rid-1"]


# --- streaming ------------------------------------------------------------------------------------

SSE_CHUNKS = [
    b'data: {"choices":[{"delta":{"content":"He"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n',
    b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n',
    b"data: [DONE]\n\n",
]


async def test_stream_relayed_chunk_by_chunk(h: Harness) -> None:
    client = Client([{"type": "http.request", "body": CHAT, "more_body": False}])
    gates = [asyncio.Event() for _ in SSE_CHUNKS]
    stream = ScriptedStream(SSE_CHUNKS, gates=gates)
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, headers={"content-type": "text/event-stream"}, stream=stream
    )

    async def release() -> None:
        # Each chunk must reach the client before the upstream produces the next one:
        # nothing is buffered.
        for i, gate in enumerate(gates):
            gate.set()
            while len([m for m in client.sent if m.get("body")]) < i + 1:
                await asyncio.sleep(0)

    releaser = asyncio.create_task(release())
    result = await call(
        h.app,
        "POST",
        "/v1/chat/completions",
        headers=[*JSON, ("content-length", str(len(CHAT)))],
        content_length=False,
        client=client,
    )
    await asyncio.wait_for(releaser, 1)
    assert [m["type"] for m in result.messages] == ["http.response.start"] + [
        "http.response.body"
    ] * (len(SSE_CHUNKS) + 1)
    assert [m["body"] for m in result.bodies] == [*SSE_CHUNKS, b""]
    assert [m["more_body"] for m in result.bodies] == [True] * len(SSE_CHUNKS) + [False]
    assert stream.closed


async def test_sse_headers_added(h: Harness) -> None:
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200,
        headers={"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store"},
        stream=ScriptedStream(SSE_CHUNKS[:1]),
    )
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.header("x-accel-buffering") == "no"
    assert result.header_all("cache-control") == ["no-cache"]
    assert result.header("content-type") == "text/event-stream; charset=utf-8"


async def test_sse_headers_not_added_to_json(h: Harness) -> None:
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, json={}, headers={"cache-control": "private"}
    )
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.header("x-accel-buffering") is None
    assert result.header_all("cache-control") == ["private"]


async def test_upstream_break_mid_stream_aborts_body(h: Harness) -> None:
    class Broken(ScriptedStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield SSE_CHUNKS[0]
            raise httpx.ReadError("connection reset")

    stream = Broken([])
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, headers={"content-type": "text/event-stream"}, stream=stream
    )
    result = await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON)
    assert result.status == 200
    assert [m["body"] for m in result.bodies] == [SSE_CHUNKS[0]]
    assert not result.complete  # no clean end: the client sees a truncated stream
    assert stream.closed


async def test_client_disconnect_stops_relay_and_closes_upstream(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    never = asyncio.Event()
    stream = ScriptedStream(SSE_CHUNKS, gates=[asyncio.Event(), never])
    stream.gates[0].set()
    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, headers={"content-type": "text/event-stream"}, stream=stream
    )
    client = Client([{"type": "http.request", "body": CHAT, "more_body": False}])

    async def leave_after_first_chunk() -> None:
        while not any(m.get("body") for m in client.sent):
            await asyncio.sleep(0)
        client.disconnect.set()

    leaver = asyncio.create_task(leave_after_first_chunk())
    with caplog.at_level(logging.INFO, logger="compaction_proxy.access"):
        result = await call(
            h.app,
            "POST",
            "/v1/chat/completions",
            headers=[*JSON, ("content-length", str(len(CHAT)))],
            content_length=False,
            client=client,
        )
    await leaver
    assert [m["body"] for m in result.bodies] == [SSE_CHUNKS[0]]
    assert not result.complete
    assert stream.yielded == 1
    assert stream.cancelled  # the upstream read was interrupted, not left running
    assert stream.closed  # and the upstream response closed
    access = [r for r in caplog.records if r.name == "compaction_proxy.access"]
    assert access and orjson.loads(access[-1].getMessage())["status"] == 499


async def test_client_disconnect_while_waiting_for_headers(h: Harness) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return httpx.Response(200)  # pragma: no cover

    h.mock.post(f"{OPENAI}/chat/completions").mock(side_effect=slow)
    client = Client([{"type": "http.request", "body": CHAT, "more_body": False}])

    async def leave() -> None:
        await started.wait()
        client.disconnect.set()

    leaver = asyncio.create_task(leave())
    result = await call(
        h.app,
        "POST",
        "/v1/chat/completions",
        headers=[*JSON, ("content-length", str(len(CHAT)))],
        content_length=False,
        client=client,
    )
    await leaver
    assert result.messages == []  # nothing to answer: the client is gone
    assert cancelled.is_set()


async def test_client_disconnect_during_request_body(h: Harness) -> None:
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200)
    client = Client(
        [
            {"type": "http.request", "body": b'{"model":', "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    result = await call(h.app, "POST", "/v1/chat/completions", headers=JSON, client=client)
    assert result.messages == []
    assert not route.called


# --- lifespan -------------------------------------------------------------------------------------


async def test_lifespan_creates_and_closes_client() -> None:
    app = ProxyApp(settings(upstream_transport="httpx"))
    client = app.state.transport
    assert not client.closed
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        outbox.append(message)

    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    while not outbox:
        await asyncio.sleep(0)
    assert outbox[0]["type"] == "lifespan.startup.complete"
    assert not client.closed
    assert app.state.ready
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(task, 5)
    assert outbox[-1]["type"] == "lifespan.shutdown.complete"
    assert client.closed
    assert not app.state.ready
