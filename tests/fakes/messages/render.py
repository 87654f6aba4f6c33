"""A reply as the API sends it: one JSON message, or the SSE event sequence.

The stream follows Anthropic's order: ``message_start`` (the message with empty content and
the input usage, ``output_tokens: 1``), then per block ``content_block_start`` (a ``ping``
after the first), its deltas (``text_delta``; ``input_json_delta`` starting with an empty
``partial_json``; ``thinking_delta`` then one ``signature_delta``) and ``content_block_stop``,
then ``message_delta`` (stop reason, cumulative usage with the input fields; with the setting
``delta_usage: output``, ``output_tokens`` alone, as llama.cpp states it) and
``message_stop``. ``X-Fake-Stream-Error`` ends a stream with an ``error`` event instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

CHUNK = 24
DELTA_USAGE = ("cumulative", "output")


def sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def message(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: dict[str, Any],
    transformations: list[dict[str, str]] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
    if transformations is not None:
        body["input_transformations"] = transformations
    return body


def _pieces(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]


async def events(
    opening: dict[str, Any],
    content: Sequence[dict[str, Any]],
    stop_reason: str,
    usage: dict[str, Any],
    chunk_delay: float = 0.0,
    stream_error: str | None = None,
    *,
    delta_usage: str = "cumulative",
) -> AsyncIterator[bytes]:
    """The SSE body of ``opening`` (a :func:`message` with empty content) and its blocks."""
    start_usage = {**usage, "output_tokens": 1}
    yield sse(
        "message_start", {"type": "message_start", "message": {**opening, "usage": start_usage}}
    )
    if stream_error is not None:
        yield sse("ping", {"type": "ping"})
        error = {
            "type": stream_error,
            "message": "Overloaded" if "overload" in stream_error else stream_error,
        }
        yield sse("error", {"type": "error", "error": error})
        return
    for index, block in enumerate(content):
        for event in _block_events(index, block):
            if chunk_delay:
                await asyncio.sleep(chunk_delay)
            yield event
        if index == 0:
            yield sse("ping", {"type": "ping"})
    if not content:
        yield sse("ping", {"type": "ping"})
    stated = (
        ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
        if delta_usage == "cumulative"
        else ("output_tokens",)
    )
    end_usage = {key: usage[key] for key in stated}
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": end_usage,
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    kind = block["type"]
    out: list[bytes] = []

    def start(content_block: dict[str, Any]) -> None:
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": content_block},
            )
        )

    def delta(payload: dict[str, Any]) -> None:
        out.append(
            sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": payload},
            )
        )

    if kind == "text":
        start({"type": "text", "text": ""})
        for piece in _pieces(block["text"]):
            delta({"type": "text_delta", "text": piece})
    elif kind == "tool_use":
        start({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
        delta({"type": "input_json_delta", "partial_json": ""})
        for piece in _pieces(orjson.dumps(block["input"]).decode()):
            delta({"type": "input_json_delta", "partial_json": piece})
    elif kind == "thinking":
        start({"type": "thinking", "thinking": "", "signature": ""})
        if block["thinking"]:
            for piece in _pieces(block["thinking"]):
                delta({"type": "thinking_delta", "thinking": piece})
        delta({"type": "signature_delta", "signature": block["signature"]})
    else:  # redacted_thinking arrives whole
        start(dict(block))
    out.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    return out
