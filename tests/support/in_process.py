"""The proxy and the fake upstream in one process: the production factory's app over httpx's ASGI
transport, its upstream client going to `tests/fakes/upstream.py`'s app (which enforces the
window, reports usage and plays the summarizer) over another.

For sessions of many requests that the real processes of tests/integration would make slow:
everything the proxy does on a request runs (the lookup, the pipeline, prepared summaries,
checkpoints in the memory store, the summarizer's HTTP calls), but nothing crosses a socket.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from compaction_proxy.app import ProxyApp, build_edge, close_edge
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream
from tests.fakes.upstream import FakeUpstream, create_app
from tests.support.processes import tiktoken_cache_dir

UPSTREAM_URL = "http://fake.test/v1"
CHAT_PATH = "/v1/chat/completions"


@dataclass
class Exchange:
    """One request through the proxy: its response, and what the fake upstream received for it
    (the forwarded request and any summarizer calls it caused)."""

    response: httpx.Response
    received: list[bytes]


@dataclass
class InProcess:
    app: ProxyApp
    fake: FakeUpstream
    client: httpx.AsyncClient
    think_time: bool = False
    """True: after each reply, wait for the background summaries it started (as an agent's
    think time would), so a replayed session's counts do not depend on the machine's load."""

    async def chat(self, body: Mapping[str, Any], **headers: str) -> Exchange:
        """POST `body` to the proxy's chat route; what the upstream received is taken (read and
        cleared), so a background summary call made after the reply counts with the next one."""
        response = await self.client.post(CHAT_PATH, content=orjson.dumps(body), headers=headers)
        exchange = Exchange(response, self.take())
        if self.think_time:
            await self.app.state.flow.preparer.settled()
        return exchange

    def take(self) -> list[bytes]:
        recorded = self.fake.requests
        taken = [r.body for r in recorded if r.path == CHAT_PATH]
        recorded.clear()
        return taken


def upstream_entry(name: str = "fake") -> dict[str, Any]:
    """The `upstreams` entry that points at the in-process fake."""
    return {"name": name, "base_url": UPSTREAM_URL}


@asynccontextmanager
async def in_process(config: Mapping[str, Any], *, window: int) -> AsyncIterator[InProcess]:
    """The proxy built from `config` (a settings dict; its upstreams should be
    :func:`upstream_entry`) in front of a fake upstream that enforces `window`."""
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())
    fake_app = create_app(context_window=window)
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app))
    settings = Settings.model_validate(config)
    edge = build_edge(settings, transport=HttpxUpstream(upstream))
    app = ProxyApp(settings, edge)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    try:
        yield InProcess(app, fake_app.state.fake, client)
    finally:
        await client.aclose()
        await close_edge(app.state)  # its transport closes the upstream client
