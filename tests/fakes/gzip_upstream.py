"""The fake upstream (tests/fakes/upstream.py) behind a compressing front, as providers run.

OpenAI's API and most gateways gzip a reply when the client asks for it, and the SDKs always
ask (``Accept-Encoding: gzip, deflate``). This front compresses what the fake answers on its
``/v1`` routes whenever the request accepts gzip: JSON replies whole, SSE streams event by
event with a sync flush after each (a reader gets every event as it is sent, as from a real
server). ``--usage-scale F`` multiplies every ``usage.prompt_tokens`` the fake reports, before
compression: an upstream whose tokenizer counts ``F`` times what tiktoken does, which is what
the proxy's calibration exists to learn.

    python -m tests.fakes.gzip_upstream --host 127.0.0.1 --port 8002 [--usage-scale 1.5]

The test-only routes (``/_requests``, ``/_events``, ``/_control``) are left as they are.
"""

from __future__ import annotations

import argparse
import re
import zlib
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.fakes.upstream import create_app

_PROMPT_TOKENS = re.compile(rb'("prompt_tokens"\s*:\s*)(\d+)')
_COMPRESSIBLE = (b"application/json", b"text/event-stream")


class CompressingFront:
    """ASGI middleware: gzip for clients that accept it, prompt counts scaled for everyone."""

    def __init__(self, app: ASGIApp, usage_scale: float = 1.0) -> None:
        self.app = app
        self.usage_scale = usage_scale

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        accept = b", ".join(v for k, v in scope["headers"] if k.lower() == b"accept-encoding")
        wants_gzip = b"gzip" in accept.lower()
        start: Message | None = None
        compressor: Any = None

        async def front(message: Message) -> None:
            nonlocal start, compressor
            if message["type"] == "http.response.start":
                start = message  # held until the first body part: the length may change
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body = self._scaled(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if start is not None:
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                media = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if wants_gzip and media.split(b";")[0].strip() in _COMPRESSIBLE:
                    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                    headers += [(b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")]
                elif not more:
                    headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                start = None
            if compressor is not None:
                head = compressor.compress(body)
                body = head + compressor.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)
            await send({"type": "http.response.body", "body": body, "more_body": more})

        await self.app(scope, receive, front)

    def _scaled(self, body: bytes) -> bytes:
        if self.usage_scale == 1.0 or b'"prompt_tokens"' not in body:
            return body
        scale = self.usage_scale
        return _PROMPT_TOKENS.sub(
            lambda m: m.group(1) + str(round(int(m.group(2)) * scale)).encode(), body
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.gzip_upstream", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--usage-scale", type=float, default=1.0)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    app = CompressingFront(create_app(), usage_scale=args.usage_scale)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
