"""POST /v1/responses in process: what the route does when things go wrong, and calibration.

The app is built by the production factory; the upstream is an httpx transport that records
what it was sent. Real processes and the SDK are in tests/integration/test_responses.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest

import compaction_proxy.wire.responses._format as route
from compaction_proxy.app import ProxyApp, build_edge
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream

UPSTREAM = "http://upstream.test/v1"
OVERFLOW = {
    "error": {
        "message": "Your input exceeds the context window of this model. "
        "Please adjust your input and try again.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
}


def conversation(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    for n in range(steps):
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"hit {n} " * 200},
        ]
    return items


class Upstream(httpx.AsyncBaseTransport):
    """Answers every request with ``reply``, unread as from a real server (the forwarder
    streams it), and keeps the bodies it was sent. The first ``refusals`` requests get
    OpenAI's context-overflow refusal instead."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.reply: dict[str, Any] = {"id": "resp_1", "output": []}
        self.refusals = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(await request.aread())
        status, reply = 200, self.reply
        if len(self.bodies) <= self.refusals:
            status, reply = 400, OVERFLOW
        return httpx.Response(
            status,
            headers={"content-type": "application/json"},
            stream=_Body(orjson.dumps(reply)),
        )


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


@pytest.fixture
async def app() -> AsyncIterator[Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]]]:
    opened: list[httpx.AsyncClient] = []

    def build() -> tuple[httpx.AsyncClient, Upstream, ProxyApp]:
        upstream = Upstream()
        outbound = httpx.AsyncClient(transport=upstream)
        config = Settings(
            upstreams=[{"name": "u", "base_url": UPSTREAM}],
            models={
                "tiny": {"context_window": 3_000, "max_output_tokens": 200},
                "mid": {"context_window": 8_000, "max_output_tokens": 200},
            },
            summarization={"enabled": False},
            store={"backend": "memory"},
        )
        proxy = ProxyApp(config, build_edge(config, transport=HttpxUpstream(outbound)))
        inbound = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=proxy), base_url="http://proxy"
        )
        opened.extend([outbound, inbound])
        return inbound, upstream, proxy

    yield build
    for client in opened:
        await client.aclose()


async def test_a_failure_mapping_back_forwards_the_original(
    app: Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, upstream, _ = app()

    def broken(*_: object) -> None:
        raise ValueError("the adapter disagrees with the core")

    monkeypatch.setattr(route, "lower", broken)
    body = orjson.dumps({"model": "tiny", "input": conversation(12)})
    response = await client.post(
        "/v1/responses", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert upstream.bodies == [body]  # the client's own bytes
    assert "compaction failed" in response.headers["x-compaction-warning"]


async def test_a_compacted_request_replaces_only_input(
    app: Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]],
) -> None:
    client, upstream, _ = app()
    body = {"model": "tiny", "input": conversation(12), "store": False, "metadata": {"k": "v"}}
    response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200
    sent = orjson.loads(upstream.bodies[0])
    assert {k: v for k, v in sent.items() if k != "input"} == {
        k: v for k, v in body.items() if k != "input"
    }
    assert len(sent["input"]) < len(body["input"]) and sent["input"][0] == body["input"][0]
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )


async def test_usage_input_tokens_reach_calibration(
    app: Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]],
) -> None:
    """The Responses API reports ``usage.input_tokens`` (chat says ``prompt_tokens``): it is
    read as the reply goes by, for calibration and the dashboard's "usage ÷ count"."""
    client, upstream, proxy = app()
    body = {"model": "tiny", "input": conversation(1)}
    first = await client.post("/v1/responses", json=body)
    counted = int(first.headers["x-compaction-tokens-after"])
    upstream.reply = {"id": "resp_2", "output": [], "usage": {"input_tokens": 2 * counted}}
    await client.post("/v1/responses", json=body)
    row = proxy.state.telemetry.snapshot()["recent"][0]
    assert row["upstream_prompt_tokens"] == 2 * counted and row["api"] == "responses"
    metrics = proxy.state.telemetry.exposition().decode()
    assert 'compaction_proxy_token_count_calibration_ratio_sum{model="tiny"} 2.0' in metrics


async def test_an_overflow_refusal_is_retried_with_the_input_mapped_back(
    app: Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]],
) -> None:
    client, upstream, _ = app()
    upstream.refusals = 1
    body = {"model": "mid", "input": conversation(20), "store": False}
    response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200
    assert response.headers["x-compaction-retry"] == "1"
    refused, retried = (orjson.loads(sent) for sent in upstream.bodies)
    assert len(retried["input"]) < len(refused["input"]) < len(body["input"])
    assert retried["store"] is False and retried["input"][0] == body["input"][0]


async def test_a_retry_that_cannot_be_mapped_back_relays_the_refusal(
    app: Callable[[], tuple[httpx.AsyncClient, Upstream, ProxyApp]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The retry is a compaction like the first attempt: when its messages cannot be mapped
    back to items there is nothing smaller to offer, so the client gets the upstream's
    refusal as it came rather than the original (which was already refused)."""
    client, upstream, _ = app()
    upstream.refusals = 1
    mapped: list[object] = []  # every call, the failed one included

    def lower_once(*args: Any) -> Any:
        mapped.append(args)
        if len(mapped) > 1:
            raise ValueError("the adapter disagrees with the core")
        return real_lower(*args)

    real_lower = route.lower
    monkeypatch.setattr(route, "lower", lower_once)
    body = {"model": "mid", "input": conversation(20)}
    response = await client.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json() == OVERFLOW
    assert "x-compaction-retry" not in response.headers
    assert len(upstream.bodies) == 1 and len(mapped) == 2  # the retry was made, then dropped
