"""Every /v1 path the proxy does not compact: relayed both ways, routed by the body's model.

Models, embeddings, files, audio, the Responses API's routes other than `POST /v1/responses`
(the compacted routes are compaction_proxy/api/_compacted.py): the request goes upstream as
the client sent it (bounded by `server.max_body_bytes`) and the answer streams back.

Routing reads the model wherever the body carries it, at any size and however it is framed
(Content-Length or chunked), so a key never goes to an upstream that does not serve the
request's model (compaction_proxy/upstream/_routing.py has the rule):

- a JSON body (declared `application/json` or `+json`, or undeclared and starting with `{`)
  is read whole and routed by its top-level `model`;
- a multipart/form-data upload (audio transcriptions, image edits) is read up to its `model`
  field (compaction_proxy/wire/_multipart.py), and the rest streams through;
- any other body (a file part, `application/octet-stream`) names no model and streams to the
  first upstream, as a request without a body does (`GET /v1/models`).

None of this happens when the first upstream is a `"*"` catch-all: every request goes there,
and bodies stream untouched from the first byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import (
    ClientGone,
    ProxyError,
    Receive,
    Scope,
    bad_request,
    content_length,
    header,
    too_large,
)
from compaction_proxy.upstream import (
    ModelRead,
    ReplyHandling,
    StreamedBody,
    UpstreamRequest,
    forward,
    json_model,
    upstream_headers,
    upstream_url,
)
from compaction_proxy.wire import BEARER, BOM, FieldReader, Unreadable, boundary_of, format_under

from ._context import RequestContext
from ._outcome import RouteOutcome, relayed
from ._requests import readable_encoding, route

_NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_SPACE = b" \t\r\n"


class Incoming:
    """The request body as it arrives, counted against the limit, whoever reads it."""

    def __init__(self, ctx: RequestContext, receive: Receive, limit: int) -> None:
        self._ctx = ctx
        self._receive = receive
        self._limit = limit
        self.total = 0
        self.done = False

    async def next(self) -> bytes:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        self.total += len(chunk)
        self._ctx.bytes_in = self.total
        if self.total > self._limit:
            raise too_large(self._limit)
        if not message.get("more_body", False):
            self.done = True
        return chunk


async def passthrough(ctx: RequestContext) -> RouteOutcome:
    state, scope, receive, send = ctx.state, ctx.scope, ctx.receive, ctx.send
    limit = state.settings.server.max_body_bytes
    declared = content_length(scope)
    if declared is not None and declared > limit:
        raise too_large(limit)
    method: str = scope["method"]
    incoming = Incoming(ctx, receive, limit)
    has_body = method not in _NO_BODY or bool(declared)
    read: list[bytes] = []  # what routing read of the body, forwarded first
    upstream = state.router.default
    if has_body and state.router.routes_by_model:
        readable_encoding(ctx)
        upstream, read = await _route_by_body(ctx, scope, incoming)
    ctx.upstream = upstream.name
    # A path of a format's API (Anthropic's /v1/messages/batches) takes an upstream's own key
    # the way that API does.
    wire = format_under(scope["path"])
    auth = wire.auth if wire is not None else BEARER
    headers = upstream_headers(
        scope["headers"],
        upstream,
        strip_authorization=ctx.authenticated,
        auth=auth,
        proxy_keys=ctx.state.proxy_keys,
    )
    content: bytes | AsyncIterator[bytes]
    streamed: StreamedBody | None = None
    if not has_body or incoming.done:
        content = b"".join(read)
    else:
        streamed = StreamedBody(asyncio.Event())
        content = _relay(read, incoming, streamed)
        if declared is not None:
            # A body relayed as it streams in keeps the length the client declared: without
            # it the transport would send it chunked, which some upstreams refuse (411).
            headers.append(("content-length", str(declared)))
    request = UpstreamRequest(method, upstream_url(upstream, scope), headers, content)
    handling = ReplyHandling(extra_headers=ctx.response_headers)
    sent = await forward(
        state.transport, upstream, receive, send, request, handling, streamed=streamed
    )
    return relayed(sent)


async def _relay(
    read: list[bytes], incoming: Incoming, streamed: StreamedBody
) -> AsyncIterator[bytes]:
    """What routing read, then the rest of the body as it arrives."""
    try:
        for chunk in read:
            if chunk:
                yield chunk
        while not incoming.done:
            chunk = await incoming.next()
            if chunk:
                yield chunk
    except (ProxyError, ClientGone) as exc:
        streamed.error = exc
        raise
    finally:
        streamed.done.set()


async def _route_by_body(
    ctx: RequestContext, scope: Scope, incoming: Incoming
) -> tuple[UpstreamSettings, list[bytes]]:
    """The upstream for the body's model, and the chunks read to find it."""
    content_type = header(scope, b"content-type") or b""
    boundary = boundary_of(content_type)
    if boundary is not None:
        return await _route_multipart(ctx, incoming, boundary)
    read: list[bytes] = []
    declared_json = _is_json(content_type)
    if not declared_json and not await _opens_an_object(incoming, read):
        return ctx.state.router.default, read
    while not incoming.done:
        read.append(await incoming.next())
    model = json_model(b"".join(read))
    if not declared_json and model.problem is not None:
        # Only looked like JSON: a body that names no model the proxy could read.
        model = ModelRead()
    return route(ctx, model), read


async def _opens_an_object(incoming: Incoming, read: list[bytes]) -> bool:
    """Whether an undeclared body is JSON: its first byte that is not spacing (after a UTF-8
    BOM) opens an object. Reads only as far as that byte (into ``read``)."""
    pending = b""  # read and not yet decided; spacing is dropped as it comes
    bom_checked = False
    while True:
        if not incoming.done:
            chunk = await incoming.next()
            read.append(chunk)
            pending += chunk
        if not bom_checked:
            if len(pending) < len(BOM) and BOM.startswith(pending) and not incoming.done:
                continue  # the first bytes may still be a BOM
            pending = pending.removeprefix(BOM)
            bom_checked = True
        pending = pending.lstrip(_SPACE)
        if pending:
            return pending.startswith(b"{")
        if incoming.done:
            return False


async def _route_multipart(
    ctx: RequestContext, incoming: Incoming, boundary: bytes
) -> tuple[UpstreamSettings, list[bytes]]:
    reader = FieldReader(boundary, "model")
    read: list[bytes] = []
    while True:
        chunk = await incoming.next()
        read.append(chunk)
        try:
            found = reader.feed(chunk, last=incoming.done)
        except Unreadable as exc:
            raise bad_request(
                f"the proxy routes this request by its model and cannot read the multipart "
                f"body to find it: {exc}",
                param="model",
                code="invalid_multipart",
            ) from None
        if found is not None:
            break
    if found.value is None:
        return route(ctx, ModelRead()), read
    try:
        model = found.value.decode("utf-8")
    except UnicodeDecodeError:
        return route(ctx, ModelRead(problem="the 'model' field is not UTF-8 text")), read
    return route(ctx, ModelRead(model)), read


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")
