"""Routing by model, upstream URLs, header rules and error mapping.

The proxy's promise is that pointing an SDK at it changes nothing but the base URL, so this
module is conservative: it forwards what it does not understand and only removes what HTTP
says a proxy must (hop-by-hop headers) or what would leak a credential.
"""

from __future__ import annotations

import asyncio
import fnmatch
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiohttp
import httpx

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import ProxyError, Scope
from compaction_proxy.transport import UpstreamTimeout

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
# Never forwarded upstream: recomputed by the client (host, length) or ours to consume (the
# tenant header names an app's end user: it keys checkpoints, the provider need not see it).
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "x-compaction", "x-compaction-tenant"}
# Never copied back: uvicorn writes its own, and duplicates break strict clients.
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "server", "date"}


CATCH_ALL = "*"
"""The pattern that serves every model: an upstream's default `models`."""


class Router:
    """Picks the upstream for a model: the first whose `models` globs match it.

    A model no upstream lists is refused (:func:`model_not_found`), never sent to a default
    with the caller's key; an upstream that means to take every model says `models: ["*"]`
    (the default when it lists none). A request that names no model at all (`GET /v1/models`,
    a file download, a body without `model`) goes to the first upstream.
    """

    def __init__(self, upstreams: Sequence[UpstreamSettings]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self._upstreams = list(upstreams)
        self._cache: dict[str, UpstreamSettings | None] = {}
        # When the first upstream is a catch-all every request goes to it, model or not.
        self.routes_by_model = CATCH_ALL not in self._upstreams[0].models

    @property
    def default(self) -> UpstreamSettings:
        """Where a request that names no model goes."""
        return self._upstreams[0]

    @property
    def names(self) -> list[str]:
        return [u.name for u in self._upstreams]

    def for_model(self, model: str | None) -> UpstreamSettings:
        """The upstream serving ``model`` (None: the request names none, the first upstream);
        a :class:`ProxyError` 404 ``model_not_found`` when no upstream lists it."""
        if model is None:
            return self.default
        if model in self._cache:
            hit = self._cache[model]
        else:
            hit = self._match(model)
            if len(self._cache) < 4096:
                self._cache[model] = hit
        if hit is None:
            raise model_not_found(model, self.names)
        return hit

    def _match(self, model: str) -> UpstreamSettings | None:
        return next(
            (
                u
                for u in self._upstreams
                if any(fnmatch.fnmatchcase(model, pattern) for pattern in u.models)
            ),
            None,
        )


def model_not_found(model: str, upstreams: Sequence[str]) -> ProxyError:
    """OpenAI's answer to a model it does not have (404 ``model_not_found``), naming the model
    and the upstreams that were asked, so an operator sees which `models` list to extend."""
    shown = model if len(model) <= 200 else model[:200] + "..."
    return ProxyError(
        404,
        f"The model {shown!r} is not served by any upstream of this proxy (upstreams: "
        f"{', '.join(upstreams)}); an upstream serves the models its `models` patterns match, "
        'and `models: ["*"]` makes one the catch-all',
        "invalid_request_error",
        "model_not_found",
        "model",
    )


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
    if strip_authorization:
        drop = drop | {"x-api-key"}  # the proxy's own key, presented the other way
    out = [(n, v) for n, v in decoded if n not in drop]
    if upstream.api_key is not None:
        out.append(("authorization", f"Bearer {upstream.api_key.get_secret_value()}"))
    return out


def upstream_url(upstream: UpstreamSettings, scope: Scope) -> str:
    """The upstream URL for a /v1/... path: base_url already ends in /v1 (or its equivalent)."""
    path: str = scope.get("raw_path", b"").decode("latin-1").split("?", 1)[0] or scope["path"]
    suffix = path[len("/v1") :] if path.startswith("/v1") else path
    query: bytes = scope.get("query_string", b"")
    url = upstream.url + suffix
    if query:
        url += "?" + query.decode("latin-1")
    return url


def response_headers(
    raw: Sequence[tuple[bytes, bytes]] | httpx.Headers,
) -> list[tuple[bytes, bytes]]:
    """Upstream response headers as they go back to the client.

    The upstream's own `x-request-id` (OpenAI always sends one) is renamed to
    `x-upstream-request-id`: the client's `x-request-id` is the proxy's id, which the access
    log carries, and two headers of one name would be read as one joined value by the SDKs.
    """
    pairs = raw.raw if isinstance(raw, httpx.Headers) else raw
    drop: frozenset[str] | set[str] = _RESPONSE_DROP
    for name, value in pairs:
        if name.lower() == b"connection":
            listed = {t.strip().lower() for t in value.decode("latin-1").split(",") if t.strip()}
            drop = _RESPONSE_DROP | listed
    out: list[tuple[bytes, bytes]] = []
    for name, value in pairs:
        lower = name.lower()
        if lower.decode("latin-1") in drop:
            continue
        out.append((b"x-upstream-request-id" if lower == b"x-request-id" else lower, value))
    return out


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """What went wrong talking to an upstream, as the client will read it."""

    status: int
    code: str
    message: str


def classify_error(exc: BaseException, upstream: UpstreamSettings) -> UpstreamFailure:
    """Map a transport exception (httpx or aiohttp) to 502 (unreachable) or 504 (too slow).

    The cause chain decides, not the outer class: httpcore wraps the OSError that says
    whether a connection was refused or its name did not resolve.
    """
    where = f"upstream '{upstream.name}' ({upstream.display_url})"
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
    return isinstance(e, httpx.TimeoutException | asyncio.TimeoutError | aiohttp.ServerTimeoutError)


def _timeout_phase(chain: list[BaseException]) -> str:
    for e in chain:
        if isinstance(e, UpstreamTimeout):  # the transport names the timeout that ran out
            return e.description
        if isinstance(e, httpx.ConnectTimeout | aiohttp.ConnectionTimeoutError):
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
