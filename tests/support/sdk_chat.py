"""A request through an official SDK's own client, without its per-field request transform.

``client.chat.completions.create`` (and ``responses.create``, Anthropic's ``messages.create``)
walks every element of the request through the SDK's TypedDict transform in Python before it
sends it; on a long session's lists (hundreds of messages, ~100 KB) that walk was more than
half of a session test's time, and it is the SDK's work, not the proxy's. :func:`post_raw`
sends the same JSON body through the same client (its base URL, keys, headers and error
classes: a non-2xx raises the SDK's ``APIStatusError`` as ``create`` does) with the SDK's
low-level ``post``, and the reply is parsed into the SDK's own model. The SDKs' request
building itself is tested where it is the subject (tests/integration/test_gateway.py,
test_streaming.py, test_errors.py, test_responses.py, test_messages_route.py).
"""

from __future__ import annotations

import importlib
from typing import Any, Generic, Protocol, TypeVar

import httpx
import openai
import orjson
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class _SdkClient(Protocol):
    """The low-level ``post`` the OpenAI and Anthropic SDKs' clients share."""

    def post(self, path: str, *, cast_to: Any, content: bytes, options: Any) -> Any: ...


class RawReply(Generic[M]):
    """What ``with_raw_response.create`` gives: the reply's headers, its ``http_response``,
    and :meth:`parse` into the SDK's model."""

    def __init__(self, response: Any, model: type[M]) -> None:
        self.http_response = response
        self.headers = response.headers
        self._model = model

    def parse(self) -> M:
        """The reply as the SDK reads it: leniently (its models' ``construct``, nested models
        built too), so a field the fake leaves out is not an error, as with ``create``."""
        return self._model.construct(**orjson.loads(self.http_response.content))


def post_raw(client: _SdkClient, path: str, parsed_as: type[M], /, **params: Any) -> RawReply[M]:
    """``with_raw_response.create(**params)`` on ``path`` (relative to the client's base URL),
    its reply parsed as ``parsed_as``; the body sent as given (see the module docstring).
    ``extra_body``, ``extra_headers`` and ``extra_query`` mean what they mean to ``create``."""
    extra_body = params.pop("extra_body", None) or {}
    headers = {"content-type": "application/json", **(params.pop("extra_headers", None) or {})}
    query = params.pop("extra_query", None) or {}
    body = {**params, **extra_body}
    response = client.post(
        path,
        cast_to=_response_type(client),
        content=orjson.dumps(body),
        options={"headers": headers, "params": query},
    )
    return RawReply(response, parsed_as)


def create_raw(client: openai.OpenAI, **params: Any) -> RawReply[ChatCompletion]:
    """``client.chat.completions.with_raw_response.create(**params)`` (see :func:`post_raw`)."""
    return post_raw(client, "/chat/completions", ChatCompletion, **params)


def _response_type(client: object) -> type:
    """The raw reply type ``client`` hands back: Anthropic's SDK is built on httpx2, OpenAI's on
    httpx."""
    if type(client).__module__.startswith("anthropic"):
        response: type = importlib.import_module("httpx2").Response
        return response
    return httpx.Response
