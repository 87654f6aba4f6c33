"""The shutdown drain (compaction_proxy/http/_drain.py) in-process: readiness while shutting
down, the cut of what is still running, and the signal hook. The answers a real client gets
from a real SIGTERM are tested in tests/reliability/test_shutdown.py."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from types import FrameType

import httpx
import orjson
import pytest

from compaction_proxy.http import Drain
from tests.unit import test_app
from tests.unit.test_app import CHAT, JSON, OPENAI, Client, Harness, Result, call

# The in-process harness's fixtures (tests/unit/test_app.py).
make = test_app.make
h = test_app.h


@pytest.mark.parametrize(("grace", "cut_after"), [(30, 29.0), (3, 2.7), (0.5, 0.45), (0, 0.0)])
def test_the_cut_comes_a_little_before_the_end_of_the_grace(grace: float, cut_after: float) -> None:
    assert Drain(grace).cut_after == pytest.approx(cut_after)


async def test_readiness_is_unavailable_once_the_shutdown_began(h: Harness) -> None:
    assert (await call(h.app, "GET", "/readyz")).status == 200
    h.app.state.drain.begin()
    result = await call(h.app, "GET", "/readyz")
    assert result.status == 503
    assert result.json["status"] == "unavailable"
    assert result.json["checks"]["server"] == "shutting down"


def _assert_shutdown_503(result: Result) -> None:
    assert result.status == 503
    assert result.header("retry-after") == "1"
    error = result.json["error"]
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
    assert "server.graceful_shutdown_seconds" in error["message"]


async def test_a_request_waiting_for_the_upstream_is_answered_503(
    make: Callable[..., Harness],
) -> None:
    h = make(graceful_shutdown_seconds=4)
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def held(request: httpx.Request) -> httpx.Response:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return httpx.Response(200)  # pragma: no cover

    h.mock.post(f"{OPENAI}/embeddings").mock(side_effect=held)
    body = orjson.dumps({"model": "gpt-4o", "input": "hi"})
    task = asyncio.create_task(call(h.app, "POST", "/v1/embeddings", body, JSON))
    await started.wait()
    drain = h.app.state.drain
    drain.begin()
    drain.cut()  # what the timer does at drain.cut_after
    result = await task
    _assert_shutdown_503(result)
    assert "(4 s, server.graceful_shutdown_seconds)" in result.json["error"]["message"]
    assert cancelled.is_set(), "the upstream call was dropped"
    assert drain.in_flight == 0


async def test_a_request_that_arrives_after_the_cut_is_answered_at_once(
    make: Callable[..., Harness],
) -> None:
    h = make(graceful_shutdown_seconds=0)
    route = h.mock.post(f"{OPENAI}/chat/completions").respond(200, json={})
    h.app.state.drain.begin()
    await asyncio.sleep(0)  # a zero grace: the cut runs at once
    assert h.app.state.drain.cutting
    _assert_shutdown_503(await call(h.app, "POST", "/v1/chat/completions", CHAT, JSON))
    assert not route.called


async def test_a_json_reply_already_going_out_is_left_to_finish(h: Harness) -> None:
    """Nearly done: cutting it could only truncate it."""
    gate = asyncio.Event()

    class Slow(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'{"choices": [],'
            await gate.wait()
            yield b' "usage": {"prompt_tokens": 3}}'

    h.mock.post(f"{OPENAI}/chat/completions").respond(
        200, headers={"content-type": "application/json"}, stream=Slow()
    )
    client = Client([{"type": "http.request", "body": CHAT, "more_body": False}])
    task = asyncio.create_task(
        call(
            h.app,
            "POST",
            "/v1/chat/completions",
            headers=[*JSON, ("content-length", str(len(CHAT)))],
            content_length=False,
            client=client,
        )
    )
    while not any(m.get("body") for m in client.sent):
        await asyncio.sleep(0)
    drain = h.app.state.drain
    drain.begin()
    drain.cut()
    gate.set()
    result = await task
    assert result.status == 200 and result.complete
    assert orjson.loads(result.body) == {"choices": [], "usage": {"prompt_tokens": 3}}


async def test_the_signal_hook_chains_the_servers_handler_and_is_undone() -> None:
    seen: list[int] = []

    def server_handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    original = signal.signal(signal.SIGTERM, server_handler)
    try:
        drain = Drain(30)
        undo = drain.watch_signals()
        assert signal.getsignal(signal.SIGTERM) is not server_handler
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0)
        assert seen == [signal.SIGTERM], "the server still shuts down as before"
        assert drain.begun
        undo()
        assert signal.getsignal(signal.SIGTERM) is server_handler
    finally:
        signal.signal(signal.SIGTERM, original)


async def test_no_hook_where_no_server_handles_the_signal() -> None:
    original = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        undo = Drain(30).watch_signals()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        undo()
    finally:
        signal.signal(signal.SIGTERM, original)
