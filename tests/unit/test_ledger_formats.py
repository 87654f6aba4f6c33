"""The ledger through the edge, in process, for chat completions, Responses and Messages: what
the folded steps of an agent loop held (paths, commands with their verdicts, error lines,
numbers) and the user's rules reach the upstream in one ``<ledger>`` message; a checkpoint hit
forwards it byte-identical; an explicit Agent Framework pipeline has none.

The app is built by the production factory; the upstream is an httpx transport that records
what it was sent (as tests/responses/test_route.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.app import ProxyApp, build_edge
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream

UPSTREAM = "http://upstream.test/v1"
RULE = "Never push to main."
STEPS = 16
REPLIES = {
    "/v1/chat/completions": {
        "id": "c",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    },
    "/v1/responses": {"id": "resp_1", "object": "response", "output": []},
    "/v1/messages": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
}


def result_text(n: int) -> str:
    return (
        f"collected 12 items\n{'ok ' * 400}\n"
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}\n"
        f"p50 latency {40 + n}.5 ms\n1 failed, 11 passed in 0.{n}s"
    )


def command(n: int) -> str:
    return f"pytest -q tests/test_mod{n}.py"


def must_keep(n: int) -> list[str]:
    """What step ``n`` held that the agent needs afterwards, exactly (each step's latency too:
    a value measured again is kept beside the older one)."""
    return [
        command(n),
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}",
        f"1 failed, 11 passed in 0.{n}s",
        f"p50 latency {40 + n}.5 ms",
    ]


def chat_body(steps: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix the failing tests. {RULE}"},
    ]
    for n in range(steps):
        args = json.dumps({"command": command(n)})
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": args},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{n}", "content": result_text(n)},
        ]
    return {"model": "tiny", "messages": messages}


def responses_body(steps: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Fix the failing tests. {RULE}"},
    ]
    for n in range(steps):
        args = json.dumps({"command": command(n)})
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "bash", "arguments": args},
            {"type": "function_call_output", "call_id": f"c{n}", "output": result_text(n)},
        ]
    return {"model": "tiny", "input": items}


def messages_body(steps: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Fix the failing tests. {RULE}"}]
    for n in range(steps):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"t{n}",
                        "name": "bash",
                        "input": {"command": command(n)},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{n}", "content": result_text(n)}
                ],
            },
        ]
    return {
        "model": "tiny",
        "max_tokens": 200,
        "system": "You are a coding agent.",
        "messages": messages,
    }


BODIES: dict[str, Callable[[int], dict[str, Any]]] = {
    "/v1/chat/completions": chat_body,
    "/v1/responses": responses_body,
    "/v1/messages": messages_body,
}


class Upstream(httpx.AsyncBaseTransport):
    """Keeps the bodies it was sent and answers each route with a minimal reply."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(orjson.loads(await request.aread()))
        reply = orjson.dumps(REPLIES[request.url.path])
        return httpx.Response(
            200, headers={"content-type": "application/json"}, stream=_Body(reply)
        )


class _Body(httpx.AsyncByteStream):
    """A reply body unread, as from a real server (the forwarder streams it)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


def ledger_texts(body: dict[str, Any]) -> list[str]:
    """Every text of the forwarded body that is the ledger (any format's shape)."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            if value.startswith("<ledger>"):
                found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(body.get("messages", body.get("input")))
    return found


Build = Callable[..., tuple[httpx.AsyncClient, Upstream]]


@pytest.fixture
async def app() -> AsyncIterator[Build]:
    opened: list[httpx.AsyncClient] = []

    def build(**compaction: Any) -> tuple[httpx.AsyncClient, Upstream]:
        upstream = Upstream()
        outbound = httpx.AsyncClient(transport=upstream)
        config = Settings(
            upstreams=[{"name": "u", "base_url": UPSTREAM}],
            models={"tiny": {"context_window": 6_000, "max_output_tokens": 200}},
            summarization={"enabled": False},
            store={"backend": "memory"},
            compaction=compaction,
        )
        proxy = ProxyApp(config, build_edge(config, transport=HttpxUpstream(outbound)))
        inbound = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=proxy), base_url="http://proxy"
        )
        opened.extend([outbound, inbound])
        return inbound, upstream

    yield build
    for client in opened:
        await client.aclose()


@pytest.mark.parametrize("path", list(BODIES))
async def test_the_folded_steps_exact_strings_reach_the_upstream_in_the_ledger(
    app: Build, path: str
) -> None:
    client, upstream = app()
    response = await client.post(path, json=BODIES[path](STEPS))
    assert response.status_code == 200, response.text
    sent = upstream.bodies[-1]
    [ledger] = ledger_texts(sent)
    assert ledger.endswith("</ledger>")
    forwarded = orjson.dumps(sent).decode()
    folded = [n for n in range(STEPS) if f'"{command(n)}' not in forwarded.replace(ledger, "")]
    assert len(folded) >= STEPS // 2  # most of the loop was folded
    wanted = [s for n in folded for s in must_keep(n)]
    kept = [s for s in wanted if s in ledger]
    assert len(kept) == len(wanted), sorted(set(wanted) - set(kept))[:5]
    assert RULE in forwarded  # the task is the newest user message: verbatim, not repeated


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_checkpoint_hit_forwards_the_ledger_byte_identical(app: Build, path: str) -> None:
    client, upstream = app()
    first = await client.post(path, json=BODIES[path](STEPS))
    assert first.status_code == 200
    [ledger] = ledger_texts(upstream.bodies[-1])
    second = await client.post(path, json=BODIES[path](STEPS + 1))
    assert second.status_code == 200
    assert ledger_texts(upstream.bodies[-1]) == [ledger]


async def test_an_agent_framework_pipeline_without_the_entry_has_no_ledger(app: Build) -> None:
    pipeline = [
        {"strategy": "truncation", "trigger": {"token_ratio": 0.8}, "target": {"token_ratio": 0.5}}
    ]
    client, upstream = app(pipeline=pipeline)
    assert (await client.post("/v1/chat/completions", json=chat_body(STEPS))).status_code == 200
    assert ledger_texts(upstream.bodies[-1]) == []
    client, upstream = app(pipeline=[*pipeline, {"strategy": "ledger"}])
    assert (await client.post("/v1/chat/completions", json=chat_body(STEPS))).status_code == 200
    assert len(ledger_texts(upstream.bodies[-1])) == 1


def test_a_models_own_compaction_block_sets_its_ledger() -> None:
    from compaction_proxy.engine import Compactor

    compactor = Compactor(
        Settings.model_validate(
            {
                "upstreams": [{"name": "u", "base_url": UPSTREAM}],
                "models": {"small-*": {"compaction": {"ledger": {"share": 0.1}}}},
                "compaction": {"ledger": {"enabled": False}},
            }
        )
    )
    try:
        assert compactor.settings_for("small-1")[1].ledger_share == 0.1
        assert compactor.settings_for("big-1")[1].ledger_share is None
    finally:
        compactor.close()
