"""Which upstream a request the proxy does not parse goes to: the one serving its ``model``.

Three kinds of request reach an upstream without the proxy reading their body as a request:
``X-Compaction: off`` on chat completions and the Responses API (the body must go upstream
byte for byte, even when it is JSON orjson refuses: a UTF-8 BOM, ``1e400``, a lone
surrogate), and every pass-through route (embeddings, moderations, files, audio). They are
routed by the same rule as a compacted request, by ``model``, read here without parsing the
rest: orjson when it accepts the body, else the lenient scan of compaction_proxy/jsonspans.py,
which reads ``model`` out of any JSON object whatever else it holds.

The rule (the README's "HTTP surface" states it):

- a ``model`` string routes the request (404 ``model_not_found`` when no upstream serves it);
- no ``model`` at all goes to the first upstream, as a request without a body does;
- when the proxy routes by model (the first upstream is not a ``"*"`` catch-all), a body that
  names its model in a way the proxy cannot read is refused with a 400 rather than sent to the
  first upstream with a key meant for another: a ``model`` that is not a string (or not valid
  Unicode), a body that is not a JSON object even read leniently, a compressed body
  (``Content-Encoding``, 415).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.context import RequestContext
from compaction_proxy.http import ProxyError, Scope, bad_request, header
from compaction_proxy.jsonspans import ScanError, decode_string, lenient_member


@dataclass(frozen=True, slots=True)
class ModelRead:
    """What a body says about its model: ``model`` (None: it names none), or ``problem``, why
    the proxy could not read the one it names; ``data``, the body parsed, when orjson could."""

    model: str | None = None
    problem: str | None = None
    data: dict[str, Any] | None = None


def json_model(raw: bytes) -> ModelRead:
    """The top-level ``model`` of a JSON body, however else the body is written (an empty
    body names none)."""
    if not raw.strip():
        return ModelRead()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _lenient(raw)
    if not isinstance(data, dict):
        return ModelRead(problem=f"the body is a JSON {type(data).__name__}, not an object")
    model = data.get("model")
    if model is None and "model" not in data:
        return ModelRead(data=data)
    if not isinstance(model, str):
        return ModelRead(problem=f"'model' must be a string, not {_json_type(model)}", data=data)
    return ModelRead(model, data=data)


def _lenient(raw: bytes) -> ModelRead:
    try:
        value = lenient_member(raw, "model")
    except ScanError as exc:
        return ModelRead(problem=f"the body is not a JSON object ({exc})")
    if value is None:
        return ModelRead()
    model = decode_string(value)
    if model is None:
        return ModelRead(problem="'model' must be a string of valid Unicode")
    return ModelRead(model)


def route(ctx: RequestContext, read: ModelRead) -> UpstreamSettings:
    """The upstream for a body that says ``read`` about its model (sets ``ctx.model``)."""
    router = ctx.state.router
    if read.model is not None:
        ctx.model = read.model
        return router.for_model(read.model)
    if read.problem is not None and router.routes_by_model:
        raise bad_request(
            f"the proxy routes this request by its model and cannot read it: {read.problem}",
            param="model",
            code="invalid_model",
        )
    return router.default


def readable_encoding(ctx: RequestContext, scope: Scope) -> None:
    """Refuse a compressed body when the proxy must read its model (it never inflates)."""
    encoding = header(scope, b"content-encoding")
    if encoding is None or encoding.strip().lower() in (b"", b"identity"):
        return
    if ctx.state.router.routes_by_model:
        raise ProxyError(
            415,
            "the proxy routes this request by the model in its body and does not read a body "
            f"sent with Content-Encoding: {encoding.decode('latin-1')}; send it uncompressed",
            "invalid_request_error",
            "unsupported_content_encoding",
        )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    return "an object"
