"""A fast OpenAI-compatible (and Anthropic Messages) mock upstream for gateway benchmarks.

Raw ASGI on uvicorn + uvloop + httptools, so the mock costs as little CPU as Python allows and
the numbers describe the proxy, not the mock. Every POST answers a canned chat completion; a
body containing `"stream": true` gets an SSE stream of `--chunks` content deltas (each its own
ASGI send, like a real provider), a final chunk and `data: [DONE]`. `--delay-ms` holds every
response back to mimic a provider's latency (0 measures pure overhead).

`POST .../messages` answers as Anthropic's Messages API does: a canned message, or (with
`"stream": true`) its SSE events (`message_start`, a text block of `--chunks` deltas, `ping`,
`message_delta`, `message_stop`); `POST .../messages/count_tokens` a canned count. All of it
is encoded once at start-up, like the chat replies.

Run: python -m bench.mock_upstream --port 18080 [--chunks 16] [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_STREAM = re.compile(rb'"stream"\s*:\s*true')
_CREATED = 1_700_000_000


def completion_body(model: str = "mock-gpt") -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": _CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the mock upstream."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
        }
    )


def sse_events(chunks: int, model: str = "mock-gpt") -> list[bytes]:
    """The SSE frames of one streamed completion: role, `chunks` deltas, stop, [DONE]."""

    def frame(delta: dict[str, str], finish: str | None) -> bytes:
        payload = {
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    frames = [frame({"role": "assistant", "content": ""}, None)]
    frames += [frame({"content": f"tok{i} "}, None) for i in range(chunks)]
    frames.append(frame({}, "stop"))
    frames.append(b"data: [DONE]\n\n")
    return frames


def message_body(model: str = "mock-claude") -> bytes:
    """A canned Anthropic message (``POST /v1/messages`` without streaming)."""
    return orjson.dumps(
        {
            "id": "msg_mock",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": "Hello from the mock upstream."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": _USAGE,
        }
    )


_USAGE = {
    "input_tokens": 42,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 7,
}


def message_events(chunks: int, model: str = "mock-claude") -> list[bytes]:
    """The SSE events of one streamed Anthropic message: start, one text block of ``chunks``
    deltas (a ``ping`` after its start, as the API sends), the final delta and stop."""

    def event(name: str, payload: dict[str, object]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    start: dict[str, object] = {
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**_USAGE, "output_tokens": 1},
    }
    events = [
        event("message_start", {"type": "message_start", "message": start}),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        event("ping", {"type": "ping"}),
    ]
    events += [
        event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": f"tok{i} "},
            },
        )
        for i in range(chunks)
    ]
    events += [
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": chunks},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]
    return events


class MockUpstream:
    """Raw ASGI app; responses are pre-encoded once at start-up."""

    def __init__(self, chunks: int, delay_ms: float) -> None:
        self.delay = delay_ms / 1000.0
        self.json = completion_body()
        self.json_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.json)).encode()),
        ]
        self.events = sse_events(chunks)
        self.sse_headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
        ]
        self.message = message_body()
        self.message_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.message)).encode()),
        ]
        self.message_events = message_events(chunks)
        self.count = orjson.dumps({"input_tokens": 42})
        self.count_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.count)).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        chunks = []  # joined once: `+=` per chunk is quadratic on agent-sized bodies
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if self.delay:
            await asyncio.sleep(self.delay)
        path = scope.get("path", "")
        post = scope["method"] == "POST"
        if post and path.endswith("/messages/count_tokens"):
            await self._reply(send, self.count_headers, self.count)
            return
        messages = post and path.endswith("/messages")
        if post and _STREAM.search(body):
            events = self.message_events if messages else self.events
            await send({"type": "http.response.start", "status": 200, "headers": self.sse_headers})
            for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if messages:
            await self._reply(send, self.message_headers, self.message)
            return
        await self._reply(send, self.json_headers, self.json)

    @staticmethod
    async def _reply(send: Send, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--chunks", type=int, default=16, help="SSE content deltas per stream")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before each response")
    args = parser.parse_args()
    uvicorn.run(
        MockUpstream(args.chunks, args.delay_ms),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
