"""Slow and idle clients are cut, and the connection limit keeps the proxy serving.

The proxy is ``compaction-proxy serve`` (a child process) with 1 s header, body and keep-alive
timeouts; clients are raw sockets, which can stall where an HTTP client never would. Every
wait on the proxy is bounded (``BOUND``) and ends as soon as the proxy acts: a test never
sleeps for the proxy, only the trickling client paces its own bytes.

The connection limit runs against a proxy whose open-file limit is lowered in the child
(``resource.setrlimit`` before exec) and holds more idle connections than that limit allows:
before the limit, the process ran out of descriptors, the legitimate request hung and nothing
was logged.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.http.client_limits import derived_max_connections
from tests.reliability.rawhttp import RawResponse
from tests.support.assertions import CHAT_PATH
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

BOUND = 30.0  # seconds any wait on the proxy may take; only catches a proxy that never acts
TRICKLE = 0.2  # seconds between two bytes of a trickling client
NOFILE = 256
IDLE_CONNECTIONS = 400  # more than NOFILE: the old proxy ran out of descriptors


@pytest.fixture(scope="module")
def slow_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(upstream_entry(fake_upstream))
    config["server"].update(
        client_header_timeout=1, client_body_timeout=1, client_keepalive_timeout=1
    )
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


def connect(proxy: ProxyServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes; a recv timeout (BOUND) fails the test."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def parse(data: bytes) -> RawResponse:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(lines[0].split()[1]), headers, body)


def trickle(sock: socket.socket, data: bytes) -> bool:
    """Sends ``data`` a byte at a time, TRICKLE seconds apart, until the proxy answers or
    closes; True when it did so before the last byte went out."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return True
        readable, _, _ = select.select([sock], [], [], TRICKLE)
        if readable:
            return True
    return False


def assert_timeout_answer(data: bytes, status: int = 408) -> None:
    assert data, "the proxy closed without an answer"
    response = parse(data)
    assert response.status == status, data[:300]
    error = orjson.loads(response.body)["error"]
    assert error["code"] == "request_timeout", error
    assert set(error) >= {"message", "type", "param", "code"}
    assert response.headers.get("connection") == "close"


def test_an_idle_connection_is_closed(slow_proxy: ProxyServer) -> None:
    offset = slow_proxy.log_size()
    with contextlib.closing(connect(slow_proxy)) as sock:
        assert read_until_closed(sock) == b""  # closed without a word: nothing was asked
    assert "sent no request within 1 s (server.client_header_timeout)" in slow_proxy.log_text(
        offset
    )


def test_trickled_headers_get_408_and_are_closed(slow_proxy: ProxyServer) -> None:
    offset = slow_proxy.log_size()
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000 + b"\r\n\r\n"
    with contextlib.closing(connect(slow_proxy)) as sock:
        assert trickle(sock, request), "the proxy read the whole trickled header block"
        assert_timeout_answer(read_until_closed(sock))
    assert "request headers were not complete within 1 s" in slow_proxy.log_text(offset)


def test_a_stalled_body_gets_408_and_nothing_reaches_the_upstream(
    slow_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    offset = slow_proxy.log_size()
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with contextlib.closing(connect(slow_proxy)) as sock:
        sock.sendall(head)
        # A few bytes trickled (each within the body timeout), then the client stalls.
        assert not trickle(sock, body[:5]), "the proxy gave up on a body that was moving"
        assert_timeout_answer(read_until_closed(sock))
    assert "request body stalled for 1 s" in slow_proxy.log_text(offset)
    assert upstream.requests() == []
    with slow_proxy.http_client(timeout=BOUND) as http:  # still serving
        assert http.post(CHAT_PATH, content=body).status_code == 200


def test_a_kept_alive_connection_idle_between_requests_is_closed(
    slow_proxy: ProxyServer,
) -> None:
    offset = slow_proxy.log_size()
    with contextlib.closing(connect(slow_proxy)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = read_until_closed(sock)  # the answer, then the close after 1 s idle
    assert parse(data).status == 200
    assert "idle for 1 s between requests (server.client_keepalive_timeout)" in (
        slow_proxy.log_text(offset)
    )


def _lower_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def capped_proxy(tmp_path: Path, fake_upstream: UpstreamServer) -> Iterator[ProxyServer]:
    """Default timeouts (60 s: none bites during the test), an open-file limit of 256."""
    config = proxy_config(upstream_entry(fake_upstream))
    path = write_config(tmp_path / "capped.yaml", config)
    proxy = ProxyServer(
        path,
        tmp_path / "capped.log",
        env={"COMPACTION_PROXY_STORE__PATH": str(tmp_path / "capped.db")},
        preexec_fn=_lower_nofile,
    )
    proxy.start()
    yield proxy
    proxy.stop()


def test_more_idle_connections_than_descriptors_do_not_keep_a_request_out(
    capped_proxy: ProxyServer,
) -> None:
    offset = capped_proxy.log_size()
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            idle.append(connect(capped_proxy))
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "let me in"}]}
        with capped_proxy.http_client(timeout=BOUND) as http:
            response = http.post(CHAT_PATH, json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "echo: let me in"
        assert capped_proxy.proc is not None
        open_fds = len(os.listdir(f"/proc/{capped_proxy.proc.pid}/fd"))
        assert open_fds < NOFILE, open_fds
    finally:
        for sock in idle:
            sock.close()
    log = capped_proxy.log_text(offset)
    assert f"at most {derived_max_connections(NOFILE)} per worker" in capped_proxy.log_text()
    assert "client connections are open: closed the least recently active one" in log


def test_the_default_connection_limit_leaves_descriptors_for_upstreams() -> None:
    assert derived_max_connections(1024) == (1024 - 64) // 2
    assert derived_max_connections(NOFILE) == 96
    assert derived_max_connections(20) == 8  # never zero
    assert derived_max_connections(10_000_000) == 65_536


def test_a_fresh_client_still_gets_in_when_every_connection_is_idle(
    capped_proxy: ProxyServer,
) -> None:
    """The same with keep-alive idle connections (each made one request first)."""
    idle: list[httpx.Client] = []
    try:
        for _ in range(derived_max_connections(NOFILE) + 20):
            client = capped_proxy.http_client(timeout=BOUND)
            assert client.get("/healthz").status_code == 200
            idle.append(client)
        with capped_proxy.http_client(timeout=BOUND) as http:
            assert http.get("/healthz").status_code == 200
    finally:
        for client in idle:
            client.close()
