"""Reference floor: the least a Python passthrough can do, raw ASGI + aiohttp, no httpx.

Not a product: it skips auth, header rules, routing, error mapping and disconnect handling.
It is in the gateway table so the proxy's numbers can be read against what the same stack
(uvicorn + uvloop + httptools + aiohttp) achieves with nothing in between; the gap is the
price of the proxy's own layers (httpx API over aiohttp, request ids, header filtering, ...).

Run: python -m bench.ref_passthrough --port 18090 --upstream http://127.0.0.1:18080/v1
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp

_KEEP = {"content-type"}


class Passthrough:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.session = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=1000), auto_decompress=False
                    )
                    await send({"type": "lifespan.startup.complete"})
                else:
                    assert self.session is not None
                    await self.session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        chunks = []  # joined once: `+=` per chunk is quadratic on agent-sized bodies
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        assert self.session is not None
        url = self.upstream + scope["path"].removeprefix("/v1")
        headers = {"content-type": "application/json", "authorization": "Bearer sk-mock"}
        async with self.session.post(url, data=body, headers=headers) as response:
            out = [(k.lower(), v) for k, v in response.raw_headers if k.lower().decode() in _KEEP]
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL ending in /v1")
    args = parser.parse_args()
    uvicorn.run(
        Passthrough(args.upstream),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        server_header=False,
    )


if __name__ == "__main__":
    main()
