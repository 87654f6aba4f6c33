"""Does recall cost another tenant its checkpoint? The memory store, in process.

Tenant A's agent conversation (30 large tool results) is compacted once: a checkpoint and its
archived originals are stored. Then tenant B compacts fresh conversations of the same shape,
with ``compaction.recall`` on, one after another. After each, the memory store is looked at
(without touching its LRU order) for A's checkpoint; at the end A sends its conversation again
and the ``X-Compaction-Checkpoint`` header says whether it was still there. The store's
defaults (``store.max_entries`` 10,000; ``store.archive_max_mb`` 256, where it exists).

    python -m bench.archive_eviction [--compactions 200]

build_edge with an in-process upstream: no network, no summarizer (tool results are
trimmed and collapsed); the figures are counts, not timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

import httpx
import orjson

from compaction_proxy.app import ProxyApp, build_edge
from compaction_proxy.checkpoints import Checkpoint, MemoryStore, StoreBreaker
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream
from tests.support.processes import tiktoken_cache_dir

UPSTREAM = "http://up.bench/v1"
MODEL = "agent-8k"
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


class _Upstream(httpx.AsyncBaseTransport):
    """Every request answered with :data:`REPLY`, streamed (as a real transport's would be)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        body = orjson.dumps(REPLY)
        headers = {"content-type": "application/json", "content-length": str(len(body))}
        return httpx.Response(200, headers=headers, stream=_Stream(body))


class _Stream(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> Any:
        yield self.body


def conversation(tag: str, steps: int = 30) -> list[dict[str, Any]]:
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


def _memory(store: object) -> MemoryStore:
    backend = store.inner if isinstance(store, StoreBreaker) else store
    assert isinstance(backend, MemoryStore)
    return backend


def _checkpoint_keys(memory: MemoryStore) -> set[tuple[str, str]]:
    """The entries that are checkpoints (not archive rows, windows or the archive's key)."""
    found = set()
    for item, (_, value) in memory._entries.items():
        meta = Checkpoint.from_bytes(value).meta
        if "kind" not in meta and "secret" not in meta and meta:
            found.add(item)
    return found


async def run(compactions: int) -> dict[str, Any]:
    settings = Settings(
        upstreams=[{"name": "up", "base_url": UPSTREAM}],
        store={"backend": "memory"},
        models={MODEL: {"context_window": 8_000, "max_output_tokens": 500}},
        summarization={"enabled": False},
        compaction={"recall": {"enabled": True}, "calibration": {"enabled": False}},
    )
    upstream = httpx.AsyncClient(transport=_Upstream())
    app = ProxyApp(settings, build_edge(settings, transport=HttpxUpstream(upstream)))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")

    async def send(messages: list[dict[str, Any]], tenant: str) -> httpx.Response:
        return await client.post(
            "/v1/chat/completions",
            content=orjson.dumps({"model": MODEL, "messages": messages, "tools": TOOLS}),
            headers={
                "content-type": "application/json",
                "authorization": "Bearer sk-shared",
                "x-compaction-tenant": tenant,
            },
        )

    memory = _memory(app.state.store)
    alice = conversation("alice")
    first = await send(alice, "alice")
    mine = _checkpoint_keys(memory)
    evicted_after: int | None = None
    for n in range(1, compactions + 1):
        await send(conversation(f"bob{n}"), "bob")
        if evicted_after is None and not mine <= set(memory._entries):
            evicted_after = n
    again = await send([*alice, {"role": "user", "content": "and now?"}], "alice")
    archive = app.state.archive
    archive_memory = _memory(archive.store) if archive is not None else memory
    figures = {
        "A first": first.headers.get("x-compaction-checkpoint"),
        "B compactions": compactions,
        "A's checkpoint left the store after B's compaction": evicted_after,
        "A again": again.headers.get("x-compaction-checkpoint"),
        "checkpoint store entries": len(memory),
        "archive store": "the checkpoint store"
        if archive_memory is memory
        else f"its own: {len(archive_memory)} entries, {archive_memory.bytes / 2**20:.1f} MiB",
    }
    await client.aclose()
    await upstream.aclose()
    app.state.compactor.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.archive_eviction")
    parser.add_argument("--compactions", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())
    for name, value in asyncio.run(run(args.compactions)).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
