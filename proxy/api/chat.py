"""POST /v1/chat/completions: validate, (later) compact, forward, stream back."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.api.forward import Outcome, forward
from proxy.api.passthrough import upstream_url
from proxy.asgi import Receive, Scope, Send, read_body
from proxy.context import RequestContext
from proxy.errors import bad_request
from proxy.upstream import upstream_headers


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says exactly what is wrong with it."""
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise bad_request(
            f"the request body must be a JSON object, not {type(data).__name__}",
            code="invalid_json",
        )
    if "messages" not in data:
        raise bad_request(
            "'messages' is required", param="messages", code="missing_required_parameter"
        )
    if not isinstance(data["messages"], list):
        raise bad_request(
            f"'messages' must be an array, not {type(data['messages']).__name__}",
            param="messages",
            code="invalid_type",
        )
    model = data.get("model")
    if not isinstance(model, str):
        raise bad_request(
            "'model' is required and must be a string"
            if model is None
            else f"'model' must be a string, not {type(model).__name__}",
            param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    return data


async def chat_completions(
    ctx: RequestContext, scope: Scope, receive: Receive, send: Send
) -> Outcome:
    state = ctx.state
    raw = await read_body(scope, receive, state.settings.server.max_body_bytes)
    ctx.bytes_in = len(raw)
    data = parse_chat_body(raw)
    model: str = data["model"]
    ctx.model = model
    upstream = state.router.for_model(model)
    ctx.upstream = upstream.name
    # Nothing changed the body: the client's exact bytes go upstream.
    return await forward(
        state.client,  # type: ignore[arg-type]
        upstream,
        scope,
        receive,
        send,
        method="POST",
        url=upstream_url(upstream, scope),
        headers=upstream_headers(scope["headers"], upstream, strip_authorization=ctx.authenticated),
        content=raw,
        extra_headers=ctx.response_headers,
    )
