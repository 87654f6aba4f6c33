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

Both honour every ``upstreams[].timeouts`` value and say which one ran out
(:class:`UpstreamTimeout`): ``connect`` (opening the connection), ``write`` (the request body
making no progress: an upstream that stops reading), ``read`` (the gap between two chunks of the
reply, the first one included) and ``pool`` (waiting for a free connection when
``server.max_connections`` are in use). httpx has all four; aiohttp has only the first and the
third, so the pool is a semaphore here and the write timeout a watch on the body's progress
(:class:`_WriteWatch`).
"""

from __future__ import annotations

import asyncio
import http.cookiejar
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import aiohttp
import httpx
import yarl

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.config import ServerSettings, Timeouts

Body = bytes | AsyncIterator[bytes]

# Exceptions a transport raises for network trouble; `upstream.classify_error` maps them.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    httpx.HTTPError,
    aiohttp.ClientError,
    OSError,
)


Phase = Literal["connect", "write", "read", "pool"]

PHASE_TEXT: dict[str, str] = {
    "connect": "while connecting",
    "write": "sending the request",
    "read": "waiting for the response",
    "pool": "waiting for a free connection",
}


class UpstreamTimeout(CompactionProxyError, TimeoutError):
    """One of the upstream's configured timeouts ran out; ``phase`` says which."""

    def __init__(self, phase: Phase, seconds: float) -> None:
        super().__init__(f"upstream {phase} timeout ({seconds:g} s)")
        self.phase: Phase = phase
        self.seconds = seconds

    @property
    def description(self) -> str:
        """``sending the request (timeouts.write: 5 s)``: for the client's error message."""
        return f"{PHASE_TEXT[self.phase]} (timeouts.{self.phase}: {self.seconds:g} s)"


# A body up to this size goes to aiohttp as bytes: its writer buffers up to 64 KiB without
# waiting for the socket, so a write of this size never blocks and needs no watch.
_WATCHED_BODY = 64 * 1024
_WRITE_CHUNK = 256 * 1024


@dataclass(slots=True)
class UpstreamRequest:
    """One request as a transport sends it: the URL exactly as given, the headers as they go
    on the wire, the body as bytes or a stream. One object for the transports' shared
    signature; not frozen, because a frozen dataclass costs four times as much to build (once
    a request) and nothing changes it."""

    method: str
    url: str
    headers: list[tuple[str, str]]
    content: Body


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

    async def send(self, request: UpstreamRequest, timeouts: Timeouts) -> UpstreamReply: ...

    async def aclose(self) -> None: ...


# --- aiohttp ---------------------------------------------------------------------------------


class _Slot:
    """One of ``server.max_connections``, held from the request until its reply is closed."""

    __slots__ = ("_held", "_semaphore")

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore = semaphore
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._semaphore.release()


class _WriteWatch:
    """The write timeout for aiohttp: the body is handed over in chunks, and each chunk must
    be taken within ``seconds`` of the one before (aiohttp takes the next one once the last
    is written, or buffered below its 64 KiB mark). While the upstream reads, nothing fires;
    an upstream that stops reading stalls the hand-over, and ``window`` (the
    ``asyncio.timeout`` around the request) runs out.

    Time the client's own body takes to arrive (a streamed pass-through body) is not counted:
    the clock runs only from a chunk's hand-over until aiohttp asks for the next.
    """

    __slots__ = ("_loop", "_window", "expired", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._window: asyncio.Timeout | None = None
        self._loop = asyncio.get_running_loop()

    def start(self, window: asyncio.Timeout) -> None:
        self._window = window

    def stop(self) -> None:
        """The request is answered (or failed): the window is gone, later chunks are not
        watched (the reply's own read timeout covers the rest)."""
        self._window = None

    def _arm(self) -> None:
        if self._window is not None:
            self.expired = True  # until the next chunk is asked for
            self._window.reschedule(self._loop.time() + self.seconds)

    def _disarm(self) -> None:
        self.expired = False
        if self._window is not None:
            self._window.reschedule(None)

    async def body(self, content: Body) -> AsyncIterator[bytes]:
        try:
            if isinstance(content, bytes):
                view = memoryview(content)
                for start in range(0, len(view), _WRITE_CHUNK):
                    self._arm()
                    yield view[start : start + _WRITE_CHUNK]  # type: ignore[misc]
                    self._disarm()
            else:
                async for chunk in content:
                    self._arm()
                    yield chunk
                    self._disarm()
        finally:
            self._disarm()


class _AiohttpReply:
    __slots__ = ("_done", "_response", "_slot", "raw_headers", "status")

    def __init__(self, response: aiohttp.ClientResponse, slot: _Slot) -> None:
        self._response = response
        self._slot = slot
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
        try:
            if self._done:
                self._response.release()  # fully read: the connection goes back to the pool
            else:
                self._response.close()  # abandoned mid-body: drop it, the upstream sees us leave
        finally:
            self._slot.release()


class AiohttpUpstream:
    """aiohttp with one session per process (created in the running loop).

    ``server.max_connections`` is a semaphore rather than the connector's own limit, so that
    waiting for a free connection has a timeout of its own (``timeouts.pool``) and says so.
    """

    def __init__(self, server: ServerSettings) -> None:
        self._server = server
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[int, aiohttp.ClientTimeout] = {}
        self._slots: asyncio.Semaphore | None = None

    @property
    def closed(self) -> bool:
        return self._session is not None and self._session.closed

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,  # bounded by the semaphore (see the class docstring)
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
            # `read` bounds the gap between chunks, never a whole (possibly long) stream. The
            # pool wait is the semaphore's; aiohttp's `connect` is the connection alone.
            cached = aiohttp.ClientTimeout(
                total=None,
                connect=timeouts.connect,
                sock_connect=timeouts.connect,
                sock_read=timeouts.read,
            )
            self._timeouts[id(timeouts)] = cached
        return cached

    async def send(self, request: UpstreamRequest, timeouts: Timeouts) -> UpstreamReply:
        slot = await self._slot(timeouts.pool)
        content, headers = request.content, request.headers
        watch: _WriteWatch | None = None
        data: Body | None = content if content != b"" else None
        if not isinstance(content, bytes) or len(content) > _WATCHED_BODY:
            watch = _WriteWatch(timeouts.write)
            data = watch.body(content)
            if isinstance(content, bytes):  # the same framing as for the bytes themselves
                headers = [*headers, ("content-length", str(len(content)))]
        try:
            async with asyncio.timeout(None) as window:
                if watch is not None:
                    watch.start(window)
                try:
                    response = await self._get_session().request(
                        request.method,
                        yarl.URL(request.url, encoded=True),
                        headers=headers,
                        data=data,
                        allow_redirects=False,
                        timeout=self._timeout(timeouts),
                    )
                finally:
                    if watch is not None:
                        watch.stop()
        except TimeoutError as exc:
            slot.release()
            if watch is not None and watch.expired:
                raise UpstreamTimeout("write", timeouts.write) from exc
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                raise UpstreamTimeout("connect", timeouts.connect) from exc
            if isinstance(exc, aiohttp.SocketTimeoutError):
                raise UpstreamTimeout("read", timeouts.read) from exc
            raise
        except BaseException:
            slot.release()
            raise
        return _AiohttpReply(response, slot)

    async def _slot(self, seconds: float) -> _Slot:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._server.max_connections)
        try:
            async with asyncio.timeout(seconds):
                await self._slots.acquire()
        except TimeoutError:
            raise UpstreamTimeout("pool", seconds) from None
        return _Slot(self._slots)

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

    async def send(self, request: UpstreamRequest, timeouts: Timeouts) -> UpstreamReply:
        timeout = self._timeouts.get(id(timeouts))
        if timeout is None:
            timeout = httpx.Timeout(
                connect=timeouts.connect,
                read=timeouts.read,
                write=timeouts.write,
                pool=timeouts.pool,
            )
            self._timeouts[id(timeouts)] = timeout
        built = self.client.build_request(
            request.method,
            request.url,
            headers=request.headers,
            content=request.content,
            timeout=timeout,
        )
        try:
            return _HttpxReply(await self.client.send(built, stream=True))
        except httpx.TimeoutException as exc:
            phased = _phase_of(exc, timeouts)
            if phased is None:
                raise
            raise phased from exc

    async def aclose(self) -> None:
        await self.client.aclose()


def _phase_of(exc: httpx.TimeoutException, timeouts: Timeouts) -> UpstreamTimeout | None:
    if isinstance(exc, httpx.ConnectTimeout):
        return UpstreamTimeout("connect", timeouts.connect)
    if isinstance(exc, httpx.WriteTimeout):
        return UpstreamTimeout("write", timeouts.write)
    if isinstance(exc, httpx.PoolTimeout):
        return UpstreamTimeout("pool", timeouts.pool)
    if isinstance(exc, httpx.ReadTimeout):
        return UpstreamTimeout("read", timeouts.read)
    return None


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
