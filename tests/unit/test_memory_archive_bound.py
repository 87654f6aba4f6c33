"""With the memory store, recall never costs a conversation its checkpoint (issue 29, item 6;
docs/recall.md, "Where the originals live").

Each compaction with recall on archives every message it removes: tens of rows. Before issue
29 they went into the same least-recently-used table as the checkpoints (``store.max_entries``),
so one tenant's compactions evicted another tenant's checkpoint (and archive). The archive now
has a store of its own in memory, bounded by bytes (``store.archive_max_mb``), so its rows never
push out a checkpoint.

In-process (build_edge, respx as the upstream): tool-result trimming without a summarizer does
the compacting, each request a fresh agent conversation of 30 large tool results.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.app import ProxyApp
from compaction_proxy.checkpoints import MemoryStore, StoreBreaker
from compaction_proxy.compaction.ledger import is_ledger
from compaction_proxy.config import Settings
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

UPSTREAM = "http://up.test/v1"
MODEL = "agent-8k"
KEY = "sk-shared-app-key"
MAX_ENTRIES = 400
MARK = "recall id "
REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


def conversation(tag: str, steps: int = 30) -> list[dict[str, Any]]:
    """An agent conversation of ``steps`` large tool results (the trimming's work)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"task {tag}"},
    ]
    for index in range(steps):
        call_id = f"call_{tag}_{index}"
        call = {"id": call_id, "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": f"f{index}"})}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = f"{tag} result {index}: " + f"line {index} of the file " * 60
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    return messages


@dataclass
class Edge:
    app: ProxyApp
    mock: respx.MockRouter
    client: httpx.AsyncClient

    async def send(self, messages: list[dict[str, Any]], tenant: str) -> httpx.Response:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS}
        response = await self.client.post(
            "/v1/chat/completions",
            content=orjson.dumps(body),
            headers={
                "content-type": "application/json",
                "authorization": f"Bearer {KEY}",
                "x-compaction-tenant": tenant,
            },
        )
        assert response.status_code == 200, response.text
        return response

    def forwarded(self) -> dict[str, Any]:
        return dict(orjson.loads(self.mock.calls.last.request.content))


@pytest.fixture
async def edge_for() -> AsyncIterator[Any]:
    built: list[tuple[httpx.AsyncClient, httpx.AsyncClient, ProxyApp]] = []

    def build(**store: Any) -> Edge:
        settings = Settings(
            upstreams=[{"name": "up", "base_url": UPSTREAM}],
            store={"backend": "memory", "max_entries": MAX_ENTRIES, **store},
            models={MODEL: {"context_window": 8_000, "max_output_tokens": 500}},
            summarization={"enabled": False},
            compaction={"recall": {"enabled": True}, "calibration": {"enabled": False}},
        )
        mock = respx.MockRouter(assert_all_called=False, assert_all_mocked=True)
        mock.post(f"{UPSTREAM}/chat/completions").respond(200, json=REPLY)
        upstream = httpx.AsyncClient(transport=_RespxTransport(mock))
        app = in_process(settings, upstream)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
        built.append((client, upstream, app))
        return Edge(app, mock, client)

    yield build
    for client, upstream, app in built:
        await client.aclose()
        await upstream.aclose()
        app.state.compactor.close()


async def archived_messages(edge: Edge) -> float:
    metrics = (await edge.client.get("/metrics")).text
    line = next(
        line
        for line in metrics.splitlines()
        if line.startswith('compaction_proxy_archived_messages_total{api="chat"}')
    )
    return float(line.rsplit(" ", 1)[1])


def marked_ids(body: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str) and MARK in content and not is_ledger(content):
            found.append(content.rsplit(MARK, 1)[1].rstrip("]").strip())
    return found


async def test_recall_never_evicts_a_checkpoint(edge_for: Any) -> None:
    edge: Edge = edge_for()
    alice = conversation("alice")
    first = await edge.send(alice, "alice")
    assert first.headers["x-compaction-checkpoint"] == "new"
    alice_ids = marked_ids(edge.forwarded())
    assert alice_ids  # collapsed steps name their archived originals
    for n in range(10):
        response = await edge.send(conversation(f"bob{n}"), "bob")
        assert response.headers["x-compaction-checkpoint"] == "new"
    # Bob's compactions archived more rows than the checkpoints' bound holds.
    assert await archived_messages(edge) > MAX_ENTRIES
    again = await edge.send([*alice, {"role": "user", "content": "and now?"}], "alice")
    assert again.headers["x-compaction-checkpoint"] == "hit"
    # Alice's originals are still there too: the archive's own bound is far from reached.
    alice = {"authorization": f"Bearer {KEY}", "x-compaction-tenant": "alice"}
    span = await edge.client.get(f"/v1/compaction/archive/{alice_ids[0]}", headers=alice)
    assert span.status_code == 200, span.text
    texts = []
    for member in span.json()["members"]:
        read = await edge.client.get(f"/v1/compaction/archive/{member}", headers=alice)
        assert read.status_code == 200, read.text
        texts.append(str(read.json()["message"].get("content")))
    assert any("alice result" in text for text in texts)


async def test_the_memory_archive_is_bounded_by_its_own_bytes(edge_for: Any) -> None:
    """A small ``store.archive_max_mb``: the archive drops its oldest originals to stay under
    it, and the checkpoints (their own bound) are untouched."""
    edge: Edge = edge_for(archive_max_mb=0.25)
    alice = conversation("alice")
    await edge.send(alice, "alice")
    for n in range(10):
        await edge.send(conversation(f"bob{n}"), "bob")
    archive = edge.app.state.archive
    assert archive is not None
    backend = archive.store.inner if isinstance(archive.store, StoreBreaker) else archive.store
    assert isinstance(backend, MemoryStore)
    assert backend is not _memory(edge.app)
    assert 0 < backend.bytes <= 0.25 * 1024 * 1024
    again = await edge.send([*alice, {"role": "user", "content": "and now?"}], "alice")
    assert again.headers["x-compaction-checkpoint"] == "hit"


def _memory(app: ProxyApp) -> MemoryStore:
    store = app.state.store
    backend = store.inner if isinstance(store, StoreBreaker) else store
    assert isinstance(backend, MemoryStore)
    return backend
