"""The proxy and the fake upstream in the test's own process, behind the handles the integration
tests already use (``ProxyServer``, ``UpstreamServer``): no child process, no socket.

The proxy is the production factory's app (``build_edge`` + ``ProxyApp``), its upstream calls
going through the same ``HttpxUpstream`` transport a configured proxy uses, to each fake's
Starlette app over httpx's ASGI transport (one host a fake). Both apps run on one event loop in
a background thread, as a server's would; the test's synchronous clients (the OpenAI SDK, httpx)
reach them through :class:`SyncASGITransport`, which hands each request to that loop.

For what needs only HTTP semantics: long sessions, many requests. A reply is read whole before
the client sees it (httpx's ASGI transport collects it), so a test of streaming as it arrives,
slow clients, signals, sockets, logs, the CLI or several replicas keeps the real processes of
``tests/support/servers.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import httpx
import openai

from compaction_proxy.app import ProxyApp, build_edge, close_edge
from compaction_proxy.config import Settings
from compaction_proxy.upstream import HttpxUpstream
from tests.fakes.upstream import create_app
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import UpstreamControl

T = TypeVar("T")
_hosts = itertools.count(1)


class LoopThread:
    """One event loop on a daemon thread: where the apps run and their background tasks live."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 300.0) -> T:
        """``coroutine``'s result, run on the loop (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


class SyncASGITransport(httpx.BaseTransport):
    """A synchronous httpx transport to an ASGI app running on ``loop``: the request is sent
    there through httpx's own ASGI transport and its reply read whole, its bytes as the app sent
    them (a content coding is undone by the client, as over a socket)."""

    def __init__(self, app: Any, loop: LoopThread) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        content = request.read()

        async def call() -> tuple[int, httpx.Headers, bytes]:
            sent = httpx.Request(
                request.method, request.url, headers=request.headers, content=content
            )
            reply = await self._inner.handle_async_request(sent)
            assert isinstance(reply.stream, httpx.AsyncByteStream)
            body = b"".join([chunk async for chunk in reply.stream])
            return reply.status_code, reply.headers, body

        status, headers, body = self._loop.run(call())
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body))


class _Hosts(httpx.AsyncBaseTransport):
    """The proxy's upstream client: each request to the ASGI app of its URL's host."""

    def __init__(self) -> None:
        self.apps: dict[str, httpx.ASGITransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        app = self.apps.get(request.url.host)
        if app is None:
            raise httpx.ConnectError(f"no in-thread upstream at {request.url.host}")
        return await app.handle_async_request(request)


class InThreadUpstream(UpstreamControl):
    """The fake upstream (tests/fakes/upstream.py) on the loop thread, with the handle of
    ``UpstreamServer``: its control routes answered by the same app."""

    def __init__(self, loop: LoopThread, hosts: _Hosts, context_window: int | None = None):
        self.app = create_app(context_window=context_window)
        self.host = f"fake-{next(_hosts)}.test"
        self.url = f"http://{self.host}"
        hosts.apps[self.host] = httpx.ASGITransport(app=self.app)
        self._control = httpx.Client(
            base_url=self.url, transport=SyncASGITransport(self.app, loop), timeout=30.0
        )

    @property
    def client(self) -> httpx.Client:
        return self._control

    def stop(self) -> None:
        self._control.close()


class InThreadProxy:
    """The proxy built from a config dict, with the handle of ``ProxyServer`` (its clients)."""

    def __init__(self, loop: LoopThread, hosts: _Hosts, config: Mapping[str, Any]) -> None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())
        self._loop = loop
        self.settings = Settings.model_validate(dict(config))
        upstream = httpx.AsyncClient(transport=hosts, timeout=None)
        edge = build_edge(self.settings, transport=HttpxUpstream(upstream))
        self.app = ProxyApp(self.settings, edge)
        self.url = f"http://proxy-{next(_hosts)}.test"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def _transport(self) -> SyncASGITransport:
        return SyncASGITransport(self.app, self._loop)

    def openai_client(self, api_key: str = "sk-test-dummy", **kwargs: Any) -> openai.OpenAI:
        """As ``ProxyServer.openai_client``: no retries (one would hide the status)."""
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        kwargs.setdefault("http_client", httpx.Client(transport=self._transport()))
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, **kwargs)

    def http_client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 60.0)
        return httpx.Client(base_url=self.url, transport=self._transport(), **kwargs)

    def settle(self) -> None:
        """Wait for the background summaries the last replies started (an agent's think time)."""
        self._loop.run(self.app.state.flow.preparer.settled())

    def stop(self) -> None:
        self._loop.run(close_edge(self.app.state))  # its transport closes the upstream client


class InThreadServers:
    """Fakes and proxies on one loop thread, all stopped with it (a test module's fixture)."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self._hosts = _Hosts()
        self._started: list[InThreadProxy | InThreadUpstream] = []

    def upstream(self, context_window: int | None = None) -> InThreadUpstream:
        server = InThreadUpstream(self.loop, self._hosts, context_window)
        self._started.append(server)
        return server

    def proxy(self, config: Mapping[str, Any]) -> InThreadProxy:
        server = InThreadProxy(self.loop, self._hosts, config)
        self._started.append(server)
        return server

    def stop_all(self) -> None:
        for server in reversed(self._started):
            server.stop()
        self.loop.close()
