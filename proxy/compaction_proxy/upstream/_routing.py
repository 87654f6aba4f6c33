"""Which upstream a request goes to: the first whose ``models`` globs match its model.

A compacted request is routed by its parsed body's ``model``. Three kinds of request reach an
upstream without the proxy reading their body as a request: ``X-Compaction: off`` on chat
completions and the Responses API (the body must go upstream byte for byte, even when it is
JSON orjson refuses: a UTF-8 BOM, ``1e400``, a lone surrogate), and every pass-through route
(embeddings, moderations, files, audio). They are routed by the same rule, by ``model``, read
here without parsing the rest (:func:`json_model`): orjson when it accepts the body, else the
lenient scan of compaction_proxy/wire/_jsonspans.py, which reads ``model`` out of any JSON
object whatever else it holds (a multipart upload's ``model`` field is read by
compaction_proxy/wire/_multipart.py).

The rule ("Routing" in docs/http-api.md states it):

- a ``model`` string routes the request (404 ``model_not_found`` when no upstream serves it);
- no ``model`` at all goes to the first upstream, as a request without a body does;
- when the proxy routes by model (the first upstream is not a ``"*"`` catch-all), a body that
  names its model in a way the proxy cannot read is refused with a 400 rather than sent to the
  first upstream with a key meant for another: a ``model`` that is not a string (or not valid
  Unicode), a body that is not a JSON object even read leniently, a compressed body
  (``Content-Encoding``, 415).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import ProxyError, bad_request
from compaction_proxy.wire import ScanError, decode_string, lenient_member


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

    def route(self, read: ModelRead) -> UpstreamSettings:
        """The upstream for a body that says ``read`` about its model (the module's rule)."""
        if read.model is not None:
            return self.for_model(read.model)
        if read.problem is not None and self.routes_by_model:
            raise bad_request(
                f"the proxy routes this request by its model and cannot read it: {read.problem}",
                param="model",
                code="invalid_model",
            )
        return self.default

    def check_encoding(self, encoding: bytes | None) -> None:
        """Refuse a compressed body (``Content-Encoding``) when the proxy must read its model
        (it never inflates)."""
        if encoding is None or encoding.strip().lower() in (b"", b"identity"):
            return
        if self.routes_by_model:
            raise ProxyError(
                415,
                "the proxy routes this request by the model in its body and does not read a body "
                f"sent with Content-Encoding: {encoding.decode('latin-1')}; send it uncompressed",
                "invalid_request_error",
                "unsupported_content_encoding",
            )

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
