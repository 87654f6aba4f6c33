"""A delivered reply is never logged as a client that went away.

Codex CLI closes its connection right after ``response.completed``, before the upstream's
transfer has ended. The proxy then notices the disconnect while it waits for that end, and
used to log a 499 with the full ``bytes_out`` and drop the reply's usage, so calibration never
saw it. Here a raw-socket client closes right after the last event (or a JSON body that parses
whole) while the upstream holds the transfer's end at a gate, so the proxy is caught exactly
there, on both compacted routes, JSON and stream: the access log must say 200 and the
calibration and request counters must move.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.observability.traffic import parse_metrics, value
from tests.reliability.closing_client import after_event, post_then_close, whole_json
from tests.reliability.gated_upstream import GatedUpstream
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

MODEL = "gpt-4o-mini"
CALIBRATION = "compaction_proxy_token_count_calibration_ratio_count"
REQUESTS = "compaction_proxy_requests_total"


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatedUpstream]:
    server = GatedUpstream(tmp_path_factory.mktemp("gated") / "gated.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(gated: GatedUpstream) -> Iterator[GatedUpstream]:
    gated.set_mode("answer")
    yield gated
    gated.release()  # whatever still waits at the gate ends
    gated.set_mode("answer")


@pytest.fixture(scope="module")
def proxy(gated: GatedUpstream, module_proxy_factory: Any) -> ProxyServer:
    server: ProxyServer = module_proxy_factory(proxy_config(upstream_entry(gated.base_url)))
    return server


def access_line(proxy: ProxyServer, request_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """The request's access-log line, once it is written (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in proxy.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if (
                isinstance(entry, dict)
                and entry.get("request_id") == request_id
                and entry.get("msg") == "request"
            ):
                return entry
        if time.monotonic() > deadline:
            raise AssertionError(f"no access line for {request_id}")
        time.sleep(0.05)


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def counters(proxy: ProxyServer, route: str) -> tuple[float, float, float]:
    with proxy.http_client() as http:
        samples = parse_metrics(http.get("/metrics").text)
    return (
        value(samples, CALIBRATION, model=MODEL),
        value(samples, REQUESTS, route=route, status="200"),
        value(samples, REQUESTS, route=route, status="499"),
    )


CASES: dict[str, tuple[str, str, dict[str, Any], Callable[[bytes], bool]]] = {
    "chat-json": (
        "/v1/chat/completions",
        "chat_completions",
        {"messages": [{"role": "user", "content": "What is the answer?"}]},
        whole_json,
    ),
    "chat-stream": (
        "/v1/chat/completions",
        "chat_completions",
        {
            "messages": [{"role": "user", "content": "What is the answer?"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        after_event(b"data: [DONE]"),
    ),
    "responses-json": (
        "/v1/responses",
        "responses",
        {"input": [{"role": "user", "content": "What is the answer?"}]},
        whole_json,
    ),
    "responses-stream": (
        "/v1/responses",
        "responses",
        {"input": [{"role": "user", "content": "What is the answer?"}], "stream": True},
        after_event(b"event: response.completed"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_client_that_closes_after_the_last_event_got_a_200(
    proxy: ProxyServer, upstream: GatedUpstream, case: str
) -> None:
    path, route, payload, done = CASES[case]
    calibrated, ok, gone = counters(proxy, route)
    request_id = f"closing-{case}-{uuid.uuid4().hex[:8]}"
    received = post_then_close(
        proxy.port,
        path,
        {"model": MODEL, **payload},
        done=done,
        headers={"X-Gate": "hold-end", "X-Request-Id": request_id},
    )
    assert received.status == 200
    entry = access_line(proxy, request_id)
    assert entry["status"] == 200, entry
    assert entry["bytes_out"] == len(received.body), (entry, len(received.body))
    assert wait_until(lambda: upstream.state()["held"] == 0), "the upstream call was dropped"
    after = counters(proxy, route)
    assert after[0] == calibrated + 1, "the reply's usage reached calibration"
    assert (after[1], after[2]) == (ok + 1, gone), "counted as a 200, never as a 499"


def test_a_client_that_leaves_before_the_end_is_still_a_499(
    proxy: ProxyServer, upstream: GatedUpstream, tmp_path: Path
) -> None:
    """The other side of the line: a stream left in the middle is a client gone."""
    path, route, payload, _ = CASES["chat-stream"]
    calibrated, ok, gone = counters(proxy, route)
    request_id = f"leaving-{uuid.uuid4().hex[:8]}"
    received = post_then_close(
        proxy.port,
        path,
        {"model": MODEL, **payload},
        done=after_event(b'"content":""'),  # the first event: the stream has only begun
        headers={"X-Gate": "hold-stream", "X-Request-Id": request_id},
    )
    assert received.status == 200
    entry = access_line(proxy, request_id)
    assert entry["status"] == 499, entry
    after = counters(proxy, route)
    assert after == (calibrated, ok, gone + 1)
