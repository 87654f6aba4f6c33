"""The summarizer's upstream as the proxy sees it: a small recording relay in front of
llama-server (or, for developing the bench without a model, a stub that answers fixed prose).

The proxy's `summarization.provider` points here, so every summary call the proxy's real
summarizer path makes (transcript chunks, update folds) passes through and is recorded: the
request, the answer, the prompt and output tokens and the seconds it took. Within one run an
identical request body (the same chunk under the same prompt) is answered from the run's own
cache: at temperature 0 with fixed thread settings and no prompt cache llama-server gives the
same answer to the same request, so a second variant whose summary calls are the same (the
ledger switch, when it does not change what is summarized) costs no second model run; the
report counts those calls apart.

Runs in a thread of the bench process with its own event loop (aiohttp, a dependency of the
proxy already), so the records are read directly, with no control routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

PROSE = (
    "## Goal\nFix the failing nightly build of the service.\n\n"
    "## Progress\n- Read several modules and ran the test suite; some tests fail.\n"
    "- Looked at the CI job logs and profiled a module.\n\n"
    "## Next Steps\n- Fix the failing code path and run the tests again."
)
"""The stub's answer: plausible prose that copies no exact string: the worst case for a summary."""

LOOP_HEAD = (
    "## Goal\nThe user wants to run a series of shell commands and analyze the results.\n\n"
    "## Constraints & Preferences\n"
)
LOOP_LINES = (
    "- The user is using the `logging` module.",
    "- The user is using the `setuptools` library.",
    "- The user is running the test suite again.",
)
"""The looping stub's answer: what Qwen2.5-Coder-1.5B wrote for every summary of the 6k run
at 5d9728b (94% of the folded part's strings; bench/results/quality.md has the run since): a heading, then the same few lines over and over until
the output limit cut it (``finish_reason: length``)."""


@dataclass
class Call:
    """One summary call as the relay saw it."""

    started: float
    seconds: float
    request: dict[str, Any]
    answer: str
    prompt_tokens: int
    output_tokens: int
    cached: bool
    status: int
    finish_reason: str
    prompt_per_second: float
    output_per_second: float
    """llama-server's own `timings` (0 from the stub or a cached answer)."""


@dataclass
class Relay:
    """Serves ``POST /v1/chat/completions`` on 127.0.0.1; ``target`` None: a stub, ``stub``
    says which (``prose``, ``looping``)."""

    target: str | None
    stub: str = "prose"
    calls: list[Call] = field(default_factory=list)
    port: int = 0
    _cache: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Relay:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self._serve())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="summarizer-relay", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the summarizer relay did not start")
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
        self._session = aiohttp.ClientSession(timeout=timeout)

    def stop(self) -> None:
        """Stops serving; a forward still waiting on the model (a call the proxy gave up on)
        is cancelled, not waited for."""
        loop = self._loop
        if loop is None:
            return

        async def close() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30)

    async def _complete(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw)
        key = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        started = time.monotonic()
        cached = key in self._cache
        if cached:
            status, answer_bytes = self._cache[key]
        elif self.target is None:
            status, answer_bytes = 200, orjson.dumps(stub_reply(body, self.stub))
        else:
            assert self._session is not None
            async with self._session.post(
                self.target + "/chat/completions",
                data=raw,
                headers={"content-type": "application/json"},
            ) as reply:
                status, answer_bytes = reply.status, await reply.read()
        if status == 200:
            self._cache[key] = (status, answer_bytes)
        answer: dict[str, Any] = {}
        with contextlib.suppress(orjson.JSONDecodeError):
            answer = orjson.loads(answer_bytes)
        usage = answer.get("usage") or {}
        timings = answer.get("timings") or {}
        choices = answer.get("choices") or [{}]
        self.calls.append(
            Call(
                started=started,
                seconds=time.monotonic() - started,
                request=body,
                answer=str((choices[0].get("message") or {}).get("content") or ""),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
                cached=cached,
                status=status,
                finish_reason=str(choices[0].get("finish_reason") or ""),
                prompt_per_second=0.0 if cached else float(timings.get("prompt_per_second") or 0),
                output_per_second=0.0
                if cached
                else float(timings.get("predicted_per_second") or 0),
            )
        )
        return web.Response(status=status, body=answer_bytes, content_type="application/json")


def _looping(limit: int) -> str:
    """The looping stub's text: :data:`LOOP_LINES` repeated until ``limit`` tokens (4 characters
    each, as estimated here), the last line cut mid-way."""
    text = LOOP_HEAD
    while len(text) < 4 * limit:
        text += "\n".join(LOOP_LINES) + "\n"
    return text[: 4 * limit]


def stub_reply(body: dict[str, Any], stub: str) -> dict[str, Any]:
    prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4
    limit = int(body.get("max_completion_tokens") or body.get("max_tokens") or 512)
    content, finish = (_looping(limit), "length") if stub == "looping" else (PROSE, "stop")
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "stub"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": len(content) // 4,
            "total_tokens": prompt + len(content) // 4,
        },
    }
