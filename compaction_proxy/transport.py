"""The upstream HTTP client behind one small interface, in two implementations.

`aiohttp` (the default) talks to aiohttp directly. The benchmark (bench/results/gateway.md)
measured httpx's own transport at well under half its throughput at concurrency 16, and
httpx-aiohttp (httpx's API over aiohttp) spending a quarter of the proxy's CPU in httpx request
building before aiohttp parsed the same URL again; it also reported every connection failure
as a connect timeout. The proxy needs none of httpx's conveniences on this path: it relays
bytes. `httpx` remains for operators who prefer it and for respx-driven unit tests.

Both implementations keep no cookies (a provider's Set-Cookie must never travel to another
client's request), add no default headers of their own (no Accept-Encoding the client did not
ask for: bodies are relayed undecoded) and send the URL exactly as given.
"""

from __future__ import annotations

import http.cookiejar
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import aiohttp
import httpx
import yarl

from compaction_proxy.config import ServerSettings, Timeouts

Body = bytes | AsyncIterator[bytes]

# Exceptions a transport raises for network trouble; `upstream.classify_error` maps them.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    httpx.HTTPError,
    aiohttp.ClientError,
    OSError,
)


class UpstreamReply(Protocol):
    status: int

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    def header(self, name: str) -> str | None: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class UpstreamTransport(Protocol):
    @property
    def closed(self) -> bool: ...

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        content: Body,
        timeouts: Timeouts,
    ) -> UpstreamReply: ...

    async def aclose(self) -> None: ...


# --- aiohttp ---------------------------------------------------------------------------------


class _AiohttpReply:
    __slots__ = ("_done", "_response", "raw_headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._done = False
        self.status = response.status
        self.raw_headers = response.raw_headers

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.content.iter_any():
            yield chunk
        self._done = True

    async def close(self) -> None:
        if self._done:
            self._response.release()  # fully read: the connection goes back to the pool
        else:
            self._response.close()  # abandoned mid-body: drop it, the upstream sees us leave


class AiohttpUpstream:
    """aiohttp with one session per process (created in the running loop)."""

    def __init__(self, server: ServerSettings) -> None:
        self._server = server
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[int, aiohttp.ClientTimeout] = {}

    @property
    def closed(self) -> bool:
        return self._session is not None and self._session.closed

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._server.max_connections,
                limit_per_host=0,
                keepalive_timeout=self._server.keepalive_expiry,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                requote_redirect_url=False,
            )
        return self._session

    def _timeout(self, timeouts: Timeouts) -> aiohttp.ClientTimeout:
        cached = self._timeouts.get(id(timeouts))
        if cached is None:
            # `read` bounds the gap between chunks, never a whole (possibly long) stream.
            cached = aiohttp.ClientTimeout(
                total=None,
                connect=timeouts.pool + timeouts.connect,
                sock_connect=timeouts.connect,
                sock_read=timeouts.read,
            )
            self._timeouts[id(timeouts)] = cached
        return cached

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        content: Body,
        timeouts: Timeouts,
    ) -> UpstreamReply:
        response = await self._get_session().request(
            method,
            yarl.URL(url, encoded=True),
            headers=headers,
            data=content if content != b"" else None,
            allow_redirects=False,
            timeout=self._timeout(timeouts),
        )
        return _AiohttpReply(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


# --- httpx -----------------------------------------------------------------------------------


class _HttpxReply:
    __slots__ = ("_response", "raw_headers", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.raw_headers = response.headers.raw

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_raw():
            yield chunk

    async def close(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    """httpx's own transport (or any httpx client handed in, such as a respx-mocked one)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._timeouts: dict[int, httpx.Timeout] = {}

    @property
    def closed(self) -> bool:
        return self.client.is_closed

    async def send(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        content: Body,
        timeouts: Timeouts,
    ) -> UpstreamReply:
        timeout = self._timeouts.get(id(timeouts))
        if timeout is None:
            timeout = httpx.Timeout(
                connect=timeouts.connect,
                read=timeouts.read,
                write=timeouts.write,
                pool=timeouts.pool,
            )
            self._timeouts[id(timeouts)] = timeout
        request = self.client.build_request(
            method, url, headers=headers, content=content, timeout=timeout
        )
        return _HttpxReply(await self.client.send(request, stream=True))

    async def aclose(self) -> None:
        await self.client.aclose()


def plain_httpx_client(server: ServerSettings) -> httpx.AsyncClient:
    """An httpx client that adds no headers and keeps no cookies (see the module docstring)."""
    client = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=server.max_connections,
            max_keepalive_connections=server.max_keepalive_connections,
            keepalive_expiry=server.keepalive_expiry,
        ),
        timeout=None,
        follow_redirects=False,
    )
    for name in ("accept", "accept-encoding", "user-agent", "connection"):
        del client.headers[name]
    client.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return client


def make_transport(server: ServerSettings) -> UpstreamTransport:
    if server.upstream_transport == "aiohttp":
        return AiohttpUpstream(server)
    return HttpxUpstream(plain_httpx_client(server))
