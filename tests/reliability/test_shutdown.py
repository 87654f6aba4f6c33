"""Shutdown answers properly, through real processes: SIGTERM to a proxy with a 3 s grace while
requests are held at a gated upstream (inside a summarizer call, waiting for the upstream's
headers, in the middle of a stream), never on a timer.

Before, uvicorn cancelled them at the end of the grace: a plain-text 500 for those not answered
yet, a stream stopped inside a chunk, and "Exception in ASGI application" with a traceback for
every one. Now each gets an answer its client understands (a 503 in OpenAI's shape with
``Retry-After``, or the stream's own error event and a proper end) and the log says it once.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.integration.test_checkpoints import MODEL, WINDOW
from tests.integration.test_checkpoints import conversation_over_budget as conversation
from tests.reliability.closing_client import Received, post_and_read
from tests.reliability.gated_upstream import GatedUpstream
from tests.support.servers import ProxyServer, proxy_config, upstream_entry
from tests.support.sse import sse_data

GRACE = 3
SHUTDOWN_ERROR = {
    "type": "server_error",
    "param": None,
    "code": "server_shutting_down",
}
MESSAGE = (
    "the proxy is shutting down and could not finish this request within its grace period "
    "(3 s, server.graceful_shutdown_seconds); retry it"
)


@pytest.fixture
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatedUpstream]:
    server = GatedUpstream(tmp_path_factory.mktemp("gated") / "gated.log")
    server.start()
    yield server
    server.release()
    server.stop()


def shutdown_config(gated: GatedUpstream) -> dict[str, Any]:
    config = proxy_config(
        upstream_entry(gated.base_url),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store={"backend": "memory"},
        summarization={"enabled": True, "maxSummaryTokens": 800, "timeout": 120},
    )
    config["server"]["graceful_shutdown_seconds"] = GRACE
    return config


def responses_conversation() -> list[dict[str, Any]]:
    """Responses input items well over the window: compaction must summarize."""
    items: list[dict[str, Any]] = []
    for turn in range(12):
        items.append({"role": "user", "content": f"Step {turn}: " + "detail " * 600})
        items.append({"role": "assistant", "content": f"Done with step {turn}."})
    items.append({"role": "user", "content": "And now?"})
    return items


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Call(threading.Thread):
    """One raw request in a thread: its answer (read until the server closes) and progress."""

    def __init__(self, proxy: ProxyServer, path: str, payload: Any, gate: str | None) -> None:
        super().__init__(daemon=True)
        self.args_ = (proxy.port, path, payload)
        self.headers = {"X-Gate": gate} if gate else {}
        self.seen = b""
        self.result: tuple[Received, bool] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        port, path, payload = self.args_
        try:
            self.result = post_and_read(
                port, path, payload, headers=self.headers, progress=self._progress
            )
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _progress(self, body: bytes) -> None:
        self.seen = body

    def answer(self) -> tuple[Received, bool]:
        self.join(timeout=60)
        assert self.error is None, self.error
        assert self.result is not None, "no answer"
        return self.result


class SdkStream(threading.Thread):
    """The official SDK reading a chat stream: what it yields, and what it raises."""

    def __init__(self, proxy: ProxyServer) -> None:
        super().__init__(daemon=True)
        self.client = proxy.openai_client()
        self.chunks: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "a stream, please"}],
                stream=True,
                extra_headers={"X-Gate": "hold-stream"},
            )
            for chunk in stream:
                self.chunks.append(chunk)
        except BaseException as exc:
            self.error = exc


def two_events(call: Call) -> bool:
    return len(sse_data(call.seen)) == 2


def access_lines(log: str) -> list[dict[str, Any]]:
    lines = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == "request":
            lines.append(entry)
    return lines


def assert_shutdown_503(received: Received, complete: bool) -> None:
    assert received.status == 503, received
    assert complete, "the 503's body went out whole"
    assert received.headers["retry-after"] == "1"
    assert received.headers["content-type"] == "application/json"
    assert received.headers.get("x-request-id")
    assert orjson.loads(received.body) == {"error": {"message": MESSAGE, **SHUTDOWN_ERROR}}


def test_requests_cut_by_the_shutdown_are_answered_not_crashed(
    gated: GatedUpstream, proxy_factory: Any
) -> None:
    proxy: ProxyServer = proxy_factory(shutdown_config(gated))
    gated.set_mode("hold")  # the calls the proxy makes itself (the summarizer) wait
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "What is the answer?"}]
    calls = {
        # Over the window: compaction calls the summarizer, which is held.
        "in-summarizer": Call(proxy, chat, {"model": MODEL, "messages": conversation("S")}, None),
        "in-summarizer-responses": Call(
            proxy,
            "/v1/responses",
            {"model": MODEL, "input": responses_conversation(), "instructions": "Be brief."},
            None,
        ),
        # The upstream holds its headers.
        "awaiting-headers": Call(proxy, chat, {"model": MODEL, "messages": user}, "hold"),
        # Streams already started: two events went out.
        "chat-stream": Call(
            proxy, chat, {"model": MODEL, "messages": user, "stream": True}, "hold-stream"
        ),
        "responses-stream": Call(
            proxy,
            "/v1/responses",
            {"model": MODEL, "input": user, "stream": True},
            "hold-stream",
        ),
    }
    sdk = SdkStream(proxy)
    for call in calls.values():
        call.start()
    sdk.start()
    wait_until(lambda: gated.state()["held"] == len(calls) + 1, "every request at the gate")
    wait_until(lambda: sdk.chunks != [], "the SDK's first chunks")
    for stream in (calls["chat-stream"], calls["responses-stream"]):
        wait_until(partial(two_events, stream), "the streams' first events")

    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGTERM)

    for name in ("in-summarizer", "in-summarizer-responses", "awaiting-headers"):
        assert_shutdown_503(*calls[name].answer())

    chat_stream, complete = calls["chat-stream"].answer()
    assert chat_stream.status == 200 and complete, "the stream ended properly, not cut off"
    events = sse_data(chat_stream.body)
    assert len(events) == 3, events
    assert [orjson.loads(e)["object"] for e in events[:2]] == ["chat.completion.chunk"] * 2
    assert orjson.loads(events[2]) == {"error": {"message": MESSAGE, **SHUTDOWN_ERROR}}

    responses_stream, complete = calls["responses-stream"].answer()
    assert responses_stream.status == 200 and complete
    assert responses_stream.body.endswith(b"\n\n")
    events = sse_data(responses_stream.body)
    assert [orjson.loads(e)["type"] for e in events] == [
        "response.created",
        "response.output_text.delta",
        "error",
    ]
    assert b"event: error\ndata: " in responses_stream.body
    assert orjson.loads(events[2]) == {
        "type": "error",
        "code": "server_shutting_down",
        "message": MESSAGE,
        "param": None,
        "sequence_number": 2,
    }

    sdk.join(timeout=60)
    assert isinstance(sdk.error, openai.APIError), sdk.error
    assert sdk.error.message == MESSAGE
    assert sdk.error.code == "server_shutting_down"
    sdk.client.close()

    proxy.proc.wait(timeout=30)
    log = proxy.log_text()
    assert "Traceback" not in log, log[-6000:]
    assert "Exception in ASGI application" not in log
    assert '"level":"error"' not in log, [line for line in log.splitlines() if "error" in line]
    cut_lines = [line for line in log.splitlines() if "still running after" in line]
    assert len(cut_lines) == 1, cut_lines  # one warning for all of them
    assert '"level":"warning"' in cut_lines[0]
    assert "cut 6 request(s) still running after 2.7s" in cut_lines[0], "0.3 s before the end"
    cut = [e for e in access_lines(log) if e.get("cut") == "shutdown"]
    assert sorted(e["status"] for e in cut) == [200, 200, 200, 503, 503, 503], cut
    # The two over the window were cut inside compaction (their report never came).
    assert sum(1 for e in cut if "tokens_before" not in e) == 2, cut


def test_each_worker_process_answers_what_it_holds(
    gated: GatedUpstream, proxy_factory: Any, tmp_path: Path
) -> None:
    """With ``server.workers`` the supervisor passes SIGTERM on to every worker, and each one
    cuts its own requests the same way."""
    config = shutdown_config(gated)
    config["server"]["workers"] = 2
    config["store"] = {"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")}
    proxy: ProxyServer = proxy_factory(config)
    user = [{"role": "user", "content": "What is the answer?"}]
    calls = [
        Call(proxy, "/v1/chat/completions", {"model": MODEL, "messages": user}, "hold")
        for _ in range(4)
    ]
    for call in calls:
        call.start()
    wait_until(lambda: gated.state()["held"] == len(calls), "every request at the gate")
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGTERM)
    for call in calls:
        assert_shutdown_503(*call.answer())
    proxy.proc.wait(timeout=30)
    log = proxy.log_text()
    assert "Traceback" not in log and '"level":"error"' not in log, log[-6000:]
