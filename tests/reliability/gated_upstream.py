"""An upstream held by a gate: it answers chat completions and Responses requests up to a chosen
point and then waits, for as long as the test wants, never on a timer.

The shutdown and disconnect tests need the proxy caught at an exact place (inside a summarizer
call, waiting for the upstream's headers, in the middle of a stream, after the last event of a
reply whose transfer has not ended yet), and a sleep would only make that likely. Here each
request says where to stop, in the ``X-Gate`` header (the proxy passes it on) or, for the calls
the proxy makes itself (the summarizer), in the server-wide mode set through ``POST /_control``:

- ``answer`` (default): the whole reply at once;
- ``hold``: nothing is sent until the gate opens (``POST /_release``);
- ``hold-stream``: a stream sends its headers and two events, then waits (a JSON reply waits
  before its headers, as with ``hold``);
- ``hold-end``: the whole reply is sent (a JSON body chunked, without a length; a stream up to
  its last event, ``[DONE]`` or ``response.completed``) and the transfer's end waits.

``GET /_state`` says how many requests arrived and how many are waiting at the gate, so a test
acts only once the proxy is where it wants it. Every reply carries ``usage`` (prompt tokens: a
quarter of the request's bytes), so calibration has something to read.

Run it alone with ``python -m tests.reliability.gated_upstream --port 8003``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson

from tests.support.processes import ServerProcess, python_module_argv

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

MODES = ("answer", "hold", "hold-stream", "hold-end")
TEXT = ("The ", "answer ", "is ", "forty-two.")


class Gate:
    def __init__(self) -> None:
        self.mode = "answer"
        self.arrived = 0
        self.held = 0
        self.opened = asyncio.Event()

    async def wait(self, receive: Receive) -> bool:
        """Until the gate opens (True) or the caller hangs up (False)."""
        self.held += 1
        opened = asyncio.ensure_future(self.opened.wait())
        gone = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait([opened, gone], return_when=asyncio.FIRST_COMPLETED)
            return opened.done()
        finally:
            opened.cancel()
            gone.cancel()
            self.held -= 1


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _usage(body: bytes, responses: bool) -> dict[str, int]:
    prompt = max(1, len(body) // 4)
    if responses:
        return {"input_tokens": prompt, "output_tokens": 4, "total_tokens": prompt + 4}
    return {"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4}


def _sse(payload: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def chat_events(model: str, usage: dict[str, int]) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-gated",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [_sse(chunk({"role": "assistant", "content": ""}))]
    events += [_sse(chunk({"content": piece})) for piece in TEXT]
    events.append(_sse(chunk({}, "stop")))
    usage_chunk = {**chunk({}), "choices": [], "usage": usage}
    events.append(_sse(usage_chunk))
    events.append(b"data: [DONE]\n\n")
    return events


def responses_events(model: str, usage: dict[str, int]) -> list[bytes]:
    base = {"id": "resp_gated", "object": "response", "model": model, "output": []}
    events = [
        _sse(
            {"type": "response.created", "sequence_number": 0, "response": base}, "response.created"
        )
    ]
    for n, piece in enumerate(TEXT, start=1):
        delta = {
            "type": "response.output_text.delta",
            "sequence_number": n,
            "item_id": "msg_gated",
            "output_index": 0,
            "content_index": 0,
            "delta": piece,
        }
        events.append(_sse(delta, "response.output_text.delta"))
    done = {**base, "status": "completed", "output": [_message()], "usage": usage}
    completed = {"type": "response.completed", "sequence_number": len(TEXT) + 1, "response": done}
    events.append(_sse(completed, "response.completed"))
    return events


def _message() -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_gated",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "".join(TEXT), "annotations": []}],
    }


def json_reply(model: str, usage: dict[str, int], responses: bool) -> bytes:
    if responses:
        reply: dict[str, Any] = {
            "id": "resp_gated",
            "object": "response",
            "model": model,
            "status": "completed",
            "output": [_message()],
            "usage": usage,
        }
    else:
        reply = {
            "id": "chatcmpl-gated",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(TEXT)},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    return orjson.dumps(reply)


def create_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    gate = Gate()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, method = scope["path"], scope["method"]
        if path == "/_state":
            await _json(send, {"arrived": gate.arrived, "held": gate.held, "mode": gate.mode})
        elif path == "/_release" and method == "POST":
            gate.opened.set()
            await _json(send, {"released": True})
        elif path == "/_control" and method == "POST":
            mode = orjson.loads(body).get("mode", "answer")
            assert mode in MODES, mode
            gate.mode = mode
            gate.opened = asyncio.Event()
            await _json(send, {"mode": mode})
        elif path in ("/v1/chat/completions", "/v1/responses") and method == "POST":
            gate.arrived += 1
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            mode = headers.get("x-gate", gate.mode)
            responses = path == "/v1/responses"
            await _reply(send, receive, gate, mode, body, responses=responses)
        else:
            await _json(
                send, {"error": {"message": "not here", "type": "invalid_request_error"}}, 404
            )

    return app


async def _reply(
    send: Send, receive: Receive, gate: Gate, mode: str, body: bytes, *, responses: bool
) -> None:
    request = orjson.loads(body)
    model = str(request.get("model", "gated"))
    usage = _usage(body, responses)
    held = mode == "hold" or (mode == "hold-stream" and not request.get("stream"))
    if held and not await gate.wait(receive):
        return
    if not request.get("stream"):
        reply = json_reply(model, usage, responses)
        if mode != "hold-end":
            await _json_bytes(send, reply)
            return
        start = {"type": "http.response.start", "status": 200}
        await send({**start, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply, "more_body": True})
        if not await gate.wait(receive):
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    events = responses_events(model, usage) if responses else chat_events(model, usage)
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for index, event in enumerate(events):
        if mode == "hold-stream" and index == 2 and not await gate.wait(receive):
            return
        await send({"type": "http.response.body", "body": event, "more_body": True})
    if mode == "hold-end" and not await gate.wait(receive):
        return
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _json(send: Send, payload: Any, status: int = 200) -> None:
    await _json_bytes(send, orjson.dumps(payload), status)


async def _json_bytes(send: Send, body: bytes, status: int = 200) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class GatedUpstream(ServerProcess):
    """The gated upstream as a child process."""

    def __init__(self, log_path: Path, name: str = "gated-upstream") -> None:
        super().__init__(
            name,
            lambda port: python_module_argv(
                "tests.reliability.gated_upstream", "--port", str(port)
            ),
            log_path,
            ready_path="/_state",
        )

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def _post(self, path: str, payload: Any) -> Any:
        import httpx

        with httpx.Client(base_url=self.url, trust_env=False, timeout=10) as client:
            response = client.post(path, json=payload)
            response.raise_for_status()
            return response.json()

    def state(self) -> dict[str, Any]:
        import httpx

        with httpx.Client(base_url=self.url, trust_env=False, timeout=10) as client:
            return dict(client.get("/_state").json())

    def set_mode(self, mode: str) -> None:
        self._post("/_control", {"mode": mode})

    def release(self) -> None:
        self._post("/_release", {})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.gated_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8003)
    args = parser.parse_args()

    import uvicorn

    uvicorn.run(
        create_app(),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )


if __name__ == "__main__":
    main()
