"""Every /v1 path the proxy does not compact: relayed both ways without buffering.

Models, embeddings, files, audio, the Responses API's routes other than `POST /v1/responses`
(compaction_proxy/api/responses.py): the request body streams upstream as the client sends it
(bounded by `server.max_body_bytes`) and the answer streams back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson

from compaction_proxy.api.forward import Outcome, StreamedBody, forward
from compaction_proxy.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    content_length,
    header,
    read_body,
    too_large,
)
from compaction_proxy.context import RequestContext
from compaction_proxy.errors import ProxyError
from compaction_proxy.upstream import upstream_headers, upstream_url

_PEEK_LIMIT = 256 * 1024


def _peek_model(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


async def passthrough(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> Outcome:
    state = ctx.state
    limit = state.settings.server.max_body_bytes
    declared = content_length(scope)
    if declared is not None and declared > limit:
        raise too_large(limit)
    method: str = scope["method"]
    content_type = (header(scope, b"content-type") or b"").lower()
    if (
        declared is not None
        and 0 < declared <= _PEEK_LIMIT
        and content_type.startswith(b"application/json")
    ):
        # A small JSON body (embeddings, responses, moderations) is routed by its model, like
        # chat completions; reading it first costs nothing that matters at this size.
        raw = await read_body(scope, receive, limit)
        ctx.bytes_in = len(raw)
        upstream = state.router.for_model(_peek_model(raw))
        ctx.upstream = upstream.name
        return await forward(
            state.transport,
            upstream,
            scope,
            receive,
            send,
            method=method,
            url=upstream_url(upstream, scope),
            headers=upstream_headers(
                scope["headers"], upstream, strip_authorization=ctx.authenticated
            ),
            content=raw,
            extra_headers=ctx.response_headers,
        )

    upstream = state.router.default
    ctx.upstream = upstream.name
    streamed = StreamedBody(asyncio.Event())

    async def body() -> AsyncIterator[bytes]:
        total = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                total += len(chunk)
                ctx.bytes_in = total
                if total > limit:
                    raise too_large(limit)
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return
        except (ProxyError, ClientGone) as exc:
            streamed.error = exc
            raise
        finally:
            streamed.done.set()

    has_body = method not in ("GET", "HEAD", "DELETE", "OPTIONS") or bool(declared)
    content: bytes | AsyncIterator[bytes]
    if has_body:
        content = body()
    else:
        content = b""
        streamed.done.set()
    return await forward(
        state.transport,
        upstream,
        scope,
        receive,
        send,
        method=method,
        url=upstream_url(upstream, scope),
        headers=_with_length(
            upstream_headers(scope["headers"], upstream, strip_authorization=ctx.authenticated),
            declared if has_body else None,
        ),
        content=content,
        streamed=streamed,
        extra_headers=ctx.response_headers,
    )


def _with_length(headers: list[tuple[str, str]], declared: int | None) -> list[tuple[str, str]]:
    """A body relayed as it streams in keeps the length the client declared: without it the
    transport would send it chunked, which some upstreams refuse (411) for uploads."""
    if declared is None:
        return headers
    return [*headers, ("content-length", str(declared))]
