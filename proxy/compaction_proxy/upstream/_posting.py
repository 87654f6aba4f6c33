"""One POST of a compacted route's body to its upstream, relayed (or held) by the forwarder:
what the attempts, the recall loop's hidden rounds and the token count share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import Receive, Scope, Send
from compaction_proxy.wire import DEFAULT_FORMAT

from ._headers import upstream_headers, upstream_url, with_listed
from ._relay import Outcome, ReplyHandling, forward
from ._transport import UpstreamRequest, UpstreamTransport


class Caller(Protocol):
    """What a POST needs of the request it is made for (the route's request context): its
    ASGI exchange, the transport, whether the proxy authenticated the caller (its key then
    never goes up), and the proxy's own keys (never sent upstream)."""

    @property
    def scope(self) -> Scope: ...

    @property
    def receive(self) -> Receive: ...

    @property
    def send(self) -> Send: ...

    @property
    def transport(self) -> UpstreamTransport: ...

    @property
    def authenticated(self) -> bool: ...

    @property
    def proxy_keys(self) -> tuple[str, ...]: ...


REFUSAL_STATUSES = frozenset({400, 413, 422})
"""Statuses an overflow refusal comes with (vLLM, llama.cpp, OpenAI: 400; TGI: 422; some
gateways: 413). Only these replies are held back and read; every other one streams through."""


async def post_upstream(
    ctx: Caller,
    upstream: UpstreamSettings,
    body: bytes,
    handling: ReplyHandling,
    *,
    listed: Iterable[tuple[str, str]] = (),
) -> Outcome:
    """POST ``body`` to the request's path on ``upstream`` the way ``handling.wire`` says (its
    key header, its error shape) and relay the reply as ``handling`` says (:func:`forward`);
    ``listed``: values the format's amendment appends to a comma-separated header (a beta it
    needs)."""
    wire = handling.wire or DEFAULT_FORMAT
    scope = ctx.scope
    headers = upstream_headers(
        scope["headers"],
        upstream,
        strip_authorization=ctx.authenticated,
        auth=wire.auth,
        proxy_keys=ctx.proxy_keys,
    )
    request = UpstreamRequest(
        "POST",
        upstream_url(upstream, scope),
        _identity(with_listed(headers, listed), handling.hold_limit is not None),
        body,
    )
    return await forward(ctx.transport, upstream, ctx.receive, ctx.send, request, handling)


def _identity(headers: list[tuple[str, str]], held: bool) -> list[tuple[str, str]]:
    """A reply the proxy reads whole (the recall loop) is asked for uncompressed."""
    if not held:
        return headers
    kept = [(name, value) for name, value in headers if name.lower() != "accept-encoding"]
    return [*kept, ("accept-encoding", "identity")]
