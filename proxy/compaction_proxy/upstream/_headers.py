"""What crosses to an upstream and back: its URL for a path, the client's headers as they go
up, the upstream's as they come back.

The proxy's promise is that pointing an SDK at it changes nothing but the base URL, so this
module is conservative: it forwards what it does not understand and only removes what HTTP
says a proxy must (hop-by-hop headers) or what would leak a credential.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import httpx

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import Scope
from compaction_proxy.wire import BEARER, UpstreamAuth

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


CALLER_KEY_HEADERS = frozenset({"authorization", "x-api-key"})
"""Every header a client of any API the proxy serves sends its key in."""


def upstream_headers(
    raw_headers: Iterable[tuple[bytes, bytes]],
    upstream: UpstreamSettings,
    *,
    strip_authorization: bool,
    auth: UpstreamAuth = BEARER,
    proxy_keys: Collection[str] = (),
) -> list[tuple[str, str]]:
    """Client headers as they go upstream.

    `strip_authorization` is set when the client authenticated to the proxy itself: the proxy
    key must not travel to the provider, in whichever header it came (`Authorization` and
    `x-api-key` are dropped whole, and so is any other header whose value holds one of
    `proxy_keys`, the keys of `server.api_keys`: Azure's `api-key`, a custom scheme).
    `auth`: how the request's wire format sends an upstream's own `api_key`
    (`Authorization: Bearer`, or e.g. `x-api-key`); every header the
    format's callers send a key in (`auth.caller_headers`: both `x-api-key` and
    `Authorization` on Anthropic's) is dropped then, so the upstream sees one key, the
    operator's. Everything else goes as sent (`anthropic-version`, `anthropic-beta`, ...).
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
    if upstream.api_key is not None:
        # One key reaches the upstream, the operator's: a caller's key in any header a format
        # takes one in goes nowhere (a Claude Code user's x-api-key on a chat path too).
        drop = drop | {auth.header, *auth.caller_headers, *CALLER_KEY_HEADERS}
    if strip_authorization:
        drop = drop | {"x-api-key"}  # the proxy's own key, presented the other way
    keys = [key for key in proxy_keys if key] if strip_authorization else []
    out = [(n, v) for n, v in decoded if n not in drop and not any(key in v for key in keys)]
    if upstream.api_key is not None:
        out.append((auth.header, auth.value(upstream.api_key.get_secret_value())))
    return out


def with_listed(
    headers: list[tuple[str, str]], listed: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``headers`` (lower-case names) with each ``(name, value)`` of ``listed`` appended to
    that comma-separated header (``anthropic-beta``): to its last occurrence, the client's
    value kept as sent before it; added as a header of its own when the client sent none;
    left alone when the value is already listed."""
    out = list(headers)
    for name, value in listed:
        name = name.lower()
        at = next((i for i in range(len(out) - 1, -1, -1) if out[i][0] == name), None)
        if at is None:
            out.append((name, value))
            continue
        sent = out[at][1]
        present = {item.strip() for n, v in out if n == name for item in v.split(",")}
        if value in present:
            continue
        out[at] = (name, f"{sent},{value}" if sent.strip() else value)
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
