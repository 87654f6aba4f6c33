"""One inbound key rule for every route (docs/deploy.md, "Keys and tenants"): with
``server.api_keys``, a request is let in when any credential header it carries (``Authorization:
Bearer <key>`` or ``x-api-key: <key>``) holds one of the keys, whichever order the headers come
in and whatever the other one holds; and the proxy key never reaches an upstream, in any header.

In-process (build_edge, respx as the upstreams), every route family: chat completions,
Responses, Messages, its count_tokens, the preview, the archive, a pass-through path, and the
side routes (/metrics, /dashboard, /readyz's details). Before issue 29 a valid ``x-api-key``
beside any ``Authorization: Bearer`` was a 401 (the check read Authorization first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
import respx

from compaction_proxy.app import ProxyApp
from compaction_proxy.config import Settings
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

OPENAI = "http://openai.test/v1"
ANTHROPIC = "http://anthropic.test/v1"
PROXY_KEY = "pk-inbound-4e1b9c7d"
OTHER_PROXY_KEY = "pk-inbound-second-0a3f"
METRICS_KEY = "mk-scrape-5d2e"
JUNK = "sk-something-else-77aa"
OPENAI_OPERATOR = "sk-operator-openai-1c2d"
ANTHROPIC_OPERATOR = "sk-operator-anthropic-3e4f"
PROXY_KEYS = (PROXY_KEY, OTHER_PROXY_KEY)
SMALL = "gpt-small-8k"

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
RESPONSES = {"model": "gpt-4o", "input": "hello"}
MESSAGES = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}

CHAT_REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
}
RESPONSES_REPLY = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "model": "gpt-4o",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 8, "output_tokens": 1, "total_tokens": 9},
}
MESSAGES_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 8, "output_tokens": 1},
}


@pytest.fixture(scope="module", autouse=True)
def _offline_encodings() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())
        yield


def config() -> Settings:
    return Settings(
        server={"api_keys": list(PROXY_KEYS), "metrics_keys": [METRICS_KEY]},
        upstreams=[
            {
                "name": "openai",
                "base_url": OPENAI,
                "models": ["gpt-*"],
                "api_key": OPENAI_OPERATOR,
            },
            {
                "name": "anthropic",
                "base_url": ANTHROPIC,
                "models": ["claude-*"],
                "api_key": ANTHROPIC_OPERATOR,
            },
        ],
        store={"backend": "memory"},
        models={SMALL: {"context_window": 8_000, "max_output_tokens": 500}},
        summarization={"enabled": False},
        compaction={"recall": {"enabled": True}, "calibration": {"enabled": False}},
    )


@dataclass
class Edge:
    app: ProxyApp
    mock: respx.MockRouter
    client: httpx.AsyncClient

    def upstream_headers(self) -> list[list[tuple[str, str]]]:
        """Every request the upstreams received, as its (name, value) header pairs."""
        return [
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in call.request.headers.raw]
            for call in self.mock.calls
        ]


# One app for the module (building one warms tokenizers: most of a test's time otherwise);
# each test starts from an empty record of upstream calls.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared() -> AsyncIterator[Edge]:
    mock = respx.MockRouter(assert_all_called=False, assert_all_mocked=True)
    mock.post(f"{OPENAI}/chat/completions").respond(200, json=CHAT_REPLY)
    mock.post(f"{OPENAI}/responses").respond(200, json=RESPONSES_REPLY)
    mock.get(f"{OPENAI}/models").respond(200, json={"object": "list", "data": []})
    mock.post(f"{OPENAI}/files").respond(200, json={"id": "file-1", "object": "file"})
    mock.post(f"{ANTHROPIC}/messages").respond(200, json=MESSAGES_REPLY)
    mock.post(f"{ANTHROPIC}/messages/count_tokens").respond(200, json={"input_tokens": 8})
    upstream_client = httpx.AsyncClient(transport=_RespxTransport(mock))
    app = in_process(config(), upstream_client)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    yield Edge(app, mock, client)
    await client.aclose()
    await upstream_client.aclose()
    app.state.compactor.close()


@pytest.fixture
def edge(shared: Edge) -> Edge:
    shared.mock.reset()
    return shared


Send = Callable[[Edge, list[tuple[str, str]]], Any]


async def _post(edge: Edge, path: str, body: dict[str, Any], headers: list[tuple[str, str]]) -> Any:
    return await edge.client.post(
        path,
        content=orjson.dumps(body),
        headers=[("content-type", "application/json"), *headers],
    )


ROUTES: dict[str, tuple[str, str, dict[str, Any] | None, int]] = {
    # family: (method, path, body, the status a request let in gets)
    "chat": ("POST", "/v1/chat/completions", CHAT, 200),
    "responses": ("POST", "/v1/responses", RESPONSES, 200),
    "messages": ("POST", "/v1/messages", MESSAGES, 200),
    "count_tokens": ("POST", "/v1/messages/count_tokens", MESSAGES, 200),
    "preview": ("POST", "/v1/compaction/preview", CHAT, 200),
    "archive": ("GET", "/v1/compaction/archive/rabcdefghijk", None, 404),  # let in: not found
    "passthrough_get": ("GET", "/v1/models", None, 200),
    "passthrough_post": ("POST", "/v1/files", {"purpose": "batch"}, 200),
}
FORWARDS = {"chat", "responses", "messages", "count_tokens", "passthrough_get", "passthrough_post"}

LET_IN = {
    "x-api-key, then a foreign bearer": [
        ("x-api-key", PROXY_KEY),
        ("authorization", f"Bearer {JUNK}"),
    ],
    "a foreign bearer, then x-api-key": [
        ("authorization", f"Bearer {JUNK}"),
        ("x-api-key", PROXY_KEY),
    ],
    "bearer, then a foreign x-api-key": [
        ("authorization", f"Bearer {PROXY_KEY}"),
        ("x-api-key", JUNK),
    ],
    "a foreign x-api-key, then bearer": [
        ("x-api-key", JUNK),
        ("authorization", f"Bearer {PROXY_KEY}"),
    ],
    "both the same key": [("authorization", f"Bearer {PROXY_KEY}"), ("x-api-key", PROXY_KEY)],
    "two proxy keys": [("x-api-key", OTHER_PROXY_KEY), ("authorization", f"Bearer {PROXY_KEY}")],
    "x-api-key alone": [("x-api-key", PROXY_KEY)],
    "bearer alone": [("authorization", f"Bearer {PROXY_KEY}")],
    "x-api-key and a non-bearer authorization": [
        ("authorization", f"Basic {JUNK}"),
        ("x-api-key", PROXY_KEY),
    ],
}
KEPT_OUT = {
    "no key": [],
    "two foreign keys": [("authorization", f"Bearer {JUNK}"), ("x-api-key", JUNK)],
    "the key without the bearer scheme": [("authorization", PROXY_KEY)],
    "a metrics key": [("x-api-key", METRICS_KEY)],
    "an empty x-api-key beside a foreign bearer": [
        ("x-api-key", ""),
        ("authorization", f"Bearer {JUNK}"),
    ],
}


async def _request(edge: Edge, family: str, headers: list[tuple[str, str]]) -> httpx.Response:
    method, path, body, _ = ROUTES[family]
    if body is None:
        return await edge.client.request(method, path, headers=headers)
    return await _post(edge, path, body, headers)


def _assert_no_proxy_key_upstream(edge: Edge) -> None:
    for headers in edge.upstream_headers():
        for name, value in headers:
            for key in PROXY_KEYS:
                assert key not in value, (name, value)


@pytest.mark.parametrize("family", sorted(ROUTES))
@pytest.mark.parametrize("combination", sorted(LET_IN))
async def test_any_credential_header_holding_a_proxy_key_lets_the_request_in(
    edge: Edge, family: str, combination: str
) -> None:
    response = await _request(edge, family, LET_IN[combination])
    assert response.status_code == ROUTES[family][3], response.text
    if family in FORWARDS:
        assert len(edge.mock.calls) == 1
        headers = dict(edge.upstream_headers()[0])
        # The operator's key, the way the format sends it, and no other key.
        if family in ("messages", "count_tokens"):
            assert headers["x-api-key"] == ANTHROPIC_OPERATOR
            assert "authorization" not in headers
        else:
            assert headers["authorization"] == f"Bearer {OPENAI_OPERATOR}"
            assert "x-api-key" not in headers
        assert JUNK not in str(edge.upstream_headers())
    else:
        assert not edge.mock.calls
    _assert_no_proxy_key_upstream(edge)


@pytest.mark.parametrize("family", sorted(ROUTES))
@pytest.mark.parametrize("combination", sorted(KEPT_OUT))
async def test_no_header_holding_a_proxy_key_is_a_401(
    edge: Edge, family: str, combination: str
) -> None:
    response = await _request(edge, family, KEPT_OUT[combination])
    assert response.status_code == 401, response.text
    assert not edge.mock.calls


async def test_the_401_names_both_headers(edge: Edge) -> None:
    response = await _request(edge, "chat", [])
    message = response.json()["error"]["message"]
    assert "Authorization: Bearer" in message and "x-api-key" in message
    assert PROXY_KEY not in response.text


async def test_a_proxy_key_in_another_header_is_not_forwarded(edge: Edge) -> None:
    """A client let in by one header that repeats its key in a header the proxy does not read
    (Azure's ``api-key``, a custom one, with a scheme) does not send it upstream either."""
    headers = [
        ("x-api-key", PROXY_KEY),
        ("api-key", PROXY_KEY),
        ("x-custom-auth", f"Token {PROXY_KEY}"),
        ("x-trace", "kept"),
    ]
    for family in ("chat", "messages", "passthrough_get"):
        response = await _request(edge, family, headers)
        assert response.status_code == 200, response.text
    _assert_no_proxy_key_upstream(edge)
    assert all(dict(h).get("x-trace") == "kept" for h in edge.upstream_headers())


SIDE = {
    "/metrics": 200,
    "/dashboard": 200,
    "/dashboard/data": 200,
}


@pytest.mark.parametrize("combination", sorted(LET_IN))
@pytest.mark.parametrize("path", sorted(SIDE))
async def test_side_routes_take_the_same_rule(edge: Edge, path: str, combination: str) -> None:
    response = await edge.client.get(path, headers=LET_IN[combination])
    assert response.status_code == SIDE[path], response.text


@pytest.mark.parametrize("combination", sorted(KEPT_OUT))
async def test_side_routes_refuse_without_a_key(edge: Edge, combination: str) -> None:
    headers = KEPT_OUT[combination]
    response = await edge.client.get("/dashboard/data", headers=headers)
    assert response.status_code == 401


async def test_a_metrics_key_beside_a_foreign_bearer_reads_metrics_only(edge: Edge) -> None:
    headers = [("authorization", f"Bearer {JUNK}"), ("x-api-key", METRICS_KEY)]
    assert (await edge.client.get("/metrics", headers=headers)).status_code == 200
    assert (await edge.client.get("/dashboard/data", headers=headers)).status_code == 401
    assert (await _request(edge, "chat", headers)).status_code == 401


async def test_readyz_details_with_either_header(edge: Edge) -> None:
    for headers in LET_IN.values():
        body = (await edge.client.get("/readyz", headers=headers)).json()
        assert "checks" in body, body
    assert "checks" not in (await edge.client.get("/readyz")).json()


def _agent_conversation(steps: int = 30) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the build"}]
    for index in range(steps):
        call = {"id": f"call_{index}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": "{}"}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = f"result {index}: " + f"line {index} of the file " * 60
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": text})
    return messages


async def test_the_header_holding_the_proxy_key_names_the_checkpoints(edge: Edge) -> None:
    """A client whose own ``Authorization`` changes from request to request (a session token)
    beside the proxy key in ``x-api-key`` keeps its checkpoints: the proxy key names them."""
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    body = {"model": SMALL, "messages": _agent_conversation(), "tools": tools}
    checkpoints = []
    for token in ("session-1", "session-2"):
        headers = [("x-api-key", PROXY_KEY), ("authorization", f"Bearer {token}")]
        response = await _post(edge, "/v1/chat/completions", body, headers)
        assert response.status_code == 200, response.text
        checkpoints.append(response.headers["x-compaction-checkpoint"])
    assert checkpoints == ["new", "hit"]
    _assert_no_proxy_key_upstream(edge)
