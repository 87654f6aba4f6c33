"""Many small messages: refused past the limits, served at them, and nobody else waits.

A 31 MiB body of 1,000,000 tiny messages (under the 32 MiB body limit) used to take 5 GB of
the proxy's memory and stall every other client for 46 s. Now ``server.max_messages`` and
``server.max_content_parts`` refuse such a body with 413 (in the parse worker, so it is never
built in the proxy's own process), a body at the limits is served, and a large body is
parsed and compacted off the event loop. Real processes: ``compaction-proxy serve`` in front
of the fake upstream. Timing is measured in bench/hostile_load.py, never asserted here: the
test that other clients are served uses an ordering (they are answered while the large
request has not yet reached the upstream), not a duration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

BOUND = 120.0  # seconds for one request; only catches a hang
MILLION = 1_000_000
DEFAULT_MAX_MESSAGES = 50_000
SERVED_WHILE_COMPACTING = 5


def tiny(count: int, *, model: str = "gpt-4o") -> bytes:
    """``count`` one-character messages (the issue's body: a million are 29 MiB)."""
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(count)
    ]
    messages[-1] = {"role": "user", "content": "last"}
    return orjson.dumps({"model": model, "messages": messages})


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def default_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(proxy_config(upstream_entry(fake_upstream)))
    return proxy


@pytest.fixture(scope="module")
def small_limits(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(upstream_entry(fake_upstream))
    config["server"].update(max_messages=1000, max_content_parts=1000)
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


def post(proxy: ProxyServer, body: bytes, path: str = CHAT_PATH, **headers: str) -> httpx.Response:
    with proxy.http_client(timeout=BOUND) as http:
        return http.post(
            path, content=body, headers={"content-type": "application/json", **headers}
        )


def test_a_million_messages_are_refused_and_the_memory_stays_bounded(
    default_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    assert default_proxy.proc is not None
    pid = default_proxy.proc.pid
    body = tiny(MILLION)
    assert len(body) < 32 * 1024 * 1024  # under the body limit: only the message limit stops it
    before = rss_kb(pid)
    error = assert_openai_error(post(default_proxy, body), 413)
    assert error["code"] == "too_many_messages"
    assert error["param"] == "messages"
    assert "1,000,000" in error["message"] and "server.max_messages" in error["message"]
    assert f"{DEFAULT_MAX_MESSAGES:,}" in error["message"]
    assert upstream.requests() == []
    # Generous: the old proxy held 5 GB after this request. The body itself is 29 MiB.
    assert rss_kb(pid) < before + 256 * 1024, (before, rss_kb(pid))
    assert post(default_proxy, tiny(3)).status_code == 200


def test_a_million_responses_items_are_refused(default_proxy: ProxyServer) -> None:
    items = [{"role": "user", "content": "x"}] * MILLION
    body = orjson.dumps({"model": "gpt-4o", "input": items})
    error = assert_openai_error(post(default_proxy, body, "/v1/responses"), 413)
    assert (error["code"], error["param"]) == ("too_many_messages", "input")


def test_a_body_at_the_default_message_limit_is_served(
    default_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    response = post(default_proxy, tiny(DEFAULT_MAX_MESSAGES))
    assert response.status_code == 200, response.text[:500]
    assert response.json()["choices"][0]["message"]["content"] == "echo: last"
    assert int(response.headers["x-compaction-tokens-before"]) > 0
    assert len(upstream.requests(CHAT_PATH)) >= 1


def test_the_limits_are_configurable_and_a_body_at_them_is_served(
    small_limits: ProxyServer, upstream: UpstreamServer
) -> None:
    assert post(small_limits, tiny(1000)).status_code == 200
    error = assert_openai_error(post(small_limits, tiny(1001)), 413)
    assert "1,001" in error["message"] and "at most 1,000" in error["message"]
    upstream.clear()
    # The same body with compaction off goes upstream as it came: the limits bound compaction.
    assert post(small_limits, tiny(1001), **{"X-Compaction": "off"}).status_code == 200
    assert len(upstream.requests(CHAT_PATH)) == 1


def test_content_parts_are_limited_across_the_request(small_limits: ProxyServer) -> None:
    parts = [{"type": "text", "text": "p"}] * 600
    messages = [{"role": "user", "content": parts}, {"role": "user", "content": parts}]
    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
    error = assert_openai_error(post(small_limits, body), 413)
    assert error["code"] == "too_many_content_parts"
    assert "1,200" in error["message"] and "server.max_content_parts" in error["message"]
    one = orjson.dumps({"model": "gpt-4o", "messages": messages[:1]})
    assert post(small_limits, one).status_code == 200


@pytest.fixture(scope="module")
def debug_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    """``COMPACTION_DEBUG`` logs when a large compaction starts and when it has decided."""
    config = proxy_config(upstream_entry(fake_upstream), summarization={"enabled": False})
    proxy: ProxyServer = module_proxy_factory(config, env={"COMPACTION_DEBUG": "1"})
    return proxy


STARTED = "on the compaction thread"
DECIDED = "compaction decision"


def test_other_clients_are_served_while_a_large_body_is_compacted(
    debug_proxy: ProxyServer,
) -> None:
    """The ordering: health checks sent after the compaction started are answered before it
    has decided (both from the proxy's own log). The old proxy compacted on the event loop:
    nothing else was answered until it was done."""
    text = "lorem ipsum dolor sit amet " * 20
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"}
        for i in range(20_000)
    ]
    messages.append({"role": "user", "content": "last"})
    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    offset = debug_proxy.log_size()
    answered_meanwhile = 0
    with (
        contextlib.closing(socket.create_connection(("127.0.0.1", debug_proxy.port))) as big,
        debug_proxy.http_client(timeout=BOUND) as http,
    ):
        big.settimeout(BOUND)
        big.sendall(head + body)
        assert _wait_for(debug_proxy, offset, STARTED), "no large compaction started"
        while DECIDED not in debug_proxy.log_text(offset):
            assert http.get("/healthz").status_code == 200
            if DECIDED not in debug_proxy.log_text(offset):
                answered_meanwhile += 1
        reply = b""
        while chunk := big.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert answered_meanwhile >= SERVED_WHILE_COMPACTING, answered_meanwhile


def _wait_for(proxy: ProxyServer, offset: int, text: str) -> bool:
    """Whether ``text`` shows up in the proxy's log (polled, bounded by BOUND)."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if text in proxy.log_text(offset):
            return True
        time.sleep(0.01)
    return False


def test_a_preview_of_a_million_messages_is_refused_too(default_proxy: ProxyServer) -> None:
    error = assert_openai_error(post(default_proxy, tiny(MILLION), "/v1/compaction/preview"), 413)
    assert (error["code"], error["param"]) == ("too_many_messages", "messages")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid ...": the name may hold spaces, so split after its ")".
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> bytes:
    """The process's command line, empty once it has exited (a short-lived child may)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _wait(predicate: Any, bound: float = 30.0) -> bool:
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_parse_worker_exits_when_the_proxy_is_killed(
    proxy_factory: Any, upstream: UpstreamServer
) -> None:
    """A proxy killed with SIGKILL (an OOM kill, ``docker kill``) leaves no parse worker
    behind holding memory: the worker notices its parent is gone and exits."""
    proxy: ProxyServer = proxy_factory(proxy_config(upstream_entry(upstream)))
    assert proxy.proc is not None
    pid = proxy.proc.pid
    before = set(_children(pid))
    # Past the thread-parse limits: parsed (and refused) in the worker process.
    assert post(proxy, tiny(MILLION)).status_code == 413
    workers = [
        child for child in set(_children(pid)) - before if b"multiprocessing" in _cmdline(child)
    ]
    assert workers, "no parse worker was started"
    os.kill(pid, signal.SIGKILL)
    proxy.proc.wait(timeout=BOUND)
    assert _wait(lambda: not any(_alive(worker) for worker in workers)), workers
