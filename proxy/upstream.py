"""Routing by model, the one shared upstream client, header rules and error mapping.

The proxy's promise is that pointing an SDK at it changes nothing but the base URL, so this
module is conservative: it forwards what it does not understand and only removes what HTTP
says a proxy must (hop-by-hop headers) or what would leak a credential.
"""

from __future__ import annotations

import asyncio
import fnmatch
import socket
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import yarl
from httpx_aiohttp import AiohttpTransport

from proxy.config import ServerSettings, UpstreamSettings

# RFC 9110 §7.6.1, plus headers a proxy must recompute itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: recomputed by the client (host, length) or ours to consume.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "x-compaction", "x-api-key"}
# Never copied back: uvicorn writes its own, and duplicates break strict clients.
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "server", "date"}


class Router:
    """Picks the upstream for a model: first whose glob matches, else the first upstream."""

    def __init__(self, upstreams: Sequence[UpstreamSettings]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self._upstreams = list(upstreams)
        self._cache: dict[str, UpstreamSettings] = {}

    @property
    def default(self) -> UpstreamSettings:
        return self._upstreams[0]

    def for_model(self, model: str | None) -> UpstreamSettings:
        if not model:
            return self.default
        hit = self._cache.get(model)
        if hit is not None:
            return hit
        chosen = next(
            (
                u
                for u in self._upstreams
                if any(fnmatch.fnmatchcase(model, pattern) for pattern in u.models)
            ),
            self.default,
        )
        if len(self._cache) < 4096:
            self._cache[model] = chosen
        return chosen

    def by_name(self, name: str) -> UpstreamSettings | None:
        return next((u for u in self._upstreams if u.name == name), None)


def upstream_headers(
    raw_headers: Iterable[tuple[bytes, bytes]],
    upstream: UpstreamSettings,
    *,
    strip_authorization: bool,
) -> list[tuple[str, str]]:
    """Client headers as they go upstream.

    `strip_authorization` is set when the client authenticated to the proxy itself: the proxy
    key must not travel to the provider.
    """
    connection_listed: set[str] = set()
    decoded: list[tuple[str, str]] = []
    for raw_name, raw_value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name == "connection":
            connection_listed.update(t.strip().lower() for t in value.split(","))
        decoded.append((name, value))
    drop = _REQUEST_DROP | connection_listed
    if upstream.api_key is not None or strip_authorization:
        drop = drop | {"authorization"}
    out = [(n, v) for n, v in decoded if n not in drop]
    if upstream.api_key is not None:
        out.append(("authorization", f"Bearer {upstream.api_key.get_secret_value()}"))
    return out


def response_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    """Upstream response headers as they go back to the client.

    The upstream's own `x-request-id` (OpenAI always sends one) is renamed to
    `x-upstream-request-id`: the client's `x-request-id` is the proxy's id, which the access
    log carries, and two headers of one name would be read as one joined value by the SDKs.
    """
    connection_listed = {
        t.strip().lower() for t in headers.get("connection", "").split(",") if t.strip()
    }
    drop = _RESPONSE_DROP | connection_listed
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers.raw:
        lower = name.lower()
        text = lower.decode("latin-1")
        if text in drop:
            continue
        out.append((b"x-upstream-request-id" if lower == b"x-request-id" else lower, value))
    return out


def make_client(server: ServerSettings) -> httpx.AsyncClient:
    """One client per process, pooled for hundreds of concurrent streams.

    Timeouts are set per request from the chosen upstream's settings.
    """
    limits = httpx.Limits(
        max_connections=server.max_connections,
        max_keepalive_connections=server.max_keepalive_connections,
        keepalive_expiry=server.keepalive_expiry,
    )
    transport: httpx.AsyncBaseTransport
    if server.upstream_transport == "aiohttp":
        transport = _VerbatimAiohttpTransport(limits=limits)
    else:
        transport = httpx.AsyncHTTPTransport(limits=limits)
    return httpx.AsyncClient(transport=transport, timeout=None, follow_redirects=False)


with warnings.catch_warnings():
    # aiohttp discourages subclassing its session; this one changes a single argument.
    warnings.simplefilter("ignore", DeprecationWarning)

    class _VerbatimURLSession(aiohttp.ClientSession):
        """Sends the URL exactly as given.

        httpx-aiohttp hands aiohttp a string, which yarl re-normalises (`%2D` becomes `-`),
        changing query strings the client may have signed. An already-encoded URL object is
        sent as it is.
        """

        def _build_url(self, str_or_url: Any) -> yarl.URL:
            if isinstance(str_or_url, str):
                return yarl.URL(str_or_url, encoded=True)
            return super()._build_url(str_or_url)  # type: ignore[no-any-return]


class _VerbatimAiohttpTransport(AiohttpTransport):
    def get_client(self) -> aiohttp.ClientSession:
        limit = self.limits.max_connections or 0
        connector = aiohttp.TCPConnector(
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
            limit=limit,
            limit_per_host=0,
        )
        return _VerbatimURLSession(connector=connector)


def timeout_for(upstream: UpstreamSettings) -> httpx.Timeout:
    t = upstream.timeouts
    return httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """What went wrong talking to an upstream, as the client will read it."""

    status: int
    code: str
    message: str


def classify_error(exc: BaseException, upstream: UpstreamSettings) -> UpstreamFailure:
    """Map a transport exception to 502 (unreachable) or 504 (too slow).

    The aiohttp transport maps several connection errors to httpx.ConnectTimeout, so the
    original exception in the cause chain decides, not the httpx class alone.
    """
    where = f"upstream '{upstream.name}' ({upstream.url})"
    chain = list(_cause_chain(exc))
    if any(isinstance(e, socket.gaierror) for e in chain) or any(
        isinstance(e, aiohttp.ClientConnectorDNSError) for e in chain
    ):
        return UpstreamFailure(502, "upstream_dns_error", f"{where}: DNS lookup failed")
    for e in chain:
        if isinstance(e, ConnectionRefusedError) or (
            isinstance(e, aiohttp.ClientConnectorError)
            and not isinstance(e, aiohttp.ClientConnectorDNSError)
        ):
            return UpstreamFailure(
                502, "upstream_unreachable", f"{where}: connection refused or unreachable"
            )
    for e in chain:
        if isinstance(e, aiohttp.ServerDisconnectedError | httpx.RemoteProtocolError):
            return UpstreamFailure(
                502, "upstream_protocol_error", f"{where}: connection closed unexpectedly"
            )
    if any(_is_timeout(e) for e in chain):
        phase = _timeout_phase(chain)
        return UpstreamFailure(504, "upstream_timeout", f"{where}: timed out {phase}")
    if any(isinstance(e, httpx.ConnectError | OSError) for e in chain):
        return UpstreamFailure(502, "upstream_unreachable", f"{where}: cannot connect")
    return UpstreamFailure(502, "upstream_error", f"{where}: {type(exc).__name__}")


def _is_timeout(e: BaseException) -> bool:
    if isinstance(e, httpx.TimeoutException):
        # httpx_aiohttp maps every aiohttp.ClientConnectionError (a reset, a closed socket) to
        # httpx.ConnectTimeout: only an aiohttp timeout underneath makes it a real one.
        cause = e.__cause__
        return not isinstance(cause, aiohttp.ClientError) or isinstance(
            cause, aiohttp.ServerTimeoutError
        )
    return isinstance(e, asyncio.TimeoutError | aiohttp.ServerTimeoutError)


def _timeout_phase(chain: list[BaseException]) -> str:
    for e in chain:
        if isinstance(e, httpx.ConnectTimeout):
            return "while connecting"
        if isinstance(e, httpx.ReadTimeout | aiohttp.SocketTimeoutError):
            return "waiting for the response"
        if isinstance(e, httpx.PoolTimeout):
            return "waiting for a free connection"
        if isinstance(e, httpx.WriteTimeout):
            return "sending the request"
    return "waiting for the response"


def _cause_chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
