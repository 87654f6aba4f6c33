"""Assertions about OpenAI wire shapes, shared by the integration tests."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any

import httpx

CHAT_PATH = "/v1/chat/completions"
_SEND_TIME = re.compile(r"t=([0-9]+(?:\.[0-9]+)?);")


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The proxy's own errors: ``{"error": {"message", "type", "param", "code"}}``, JSON."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    return error


def send_times_ms(contents: Iterable[str]) -> list[float]:
    """The fake upstream's ``t=<unix ms>;`` stamps, in order, from streamed content pieces."""
    return [float(match) for content in contents for match in _SEND_TIME.findall(content)]


def gaps(values: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(values)]
