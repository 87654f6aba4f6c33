"""An official ``openai`` SDK client whose every request is answered with fixed bytes, served
by an in-process mock transport: how a test shows that a reply the proxy rewrote is one the
SDK's own parsers and stream helpers accept, without a server."""

from __future__ import annotations

import httpx2
import openai

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"


def replaying(body: bytes, content_type: str) -> openai.OpenAI:
    """A client whose requests all get ``body`` (status 200, ``content_type``)."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
        max_retries=0,
    )
