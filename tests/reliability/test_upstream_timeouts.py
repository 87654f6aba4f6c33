"""Every configured upstream timeout is honoured, by both transports, and named in the 504.

The proxy is ``compaction-proxy serve`` (a child process) with one upstream per fault, each a
real misbehaving server process (tests/reliability/misbehaving.py) that fails one phase:

- ``connect``: its listen queue is full, so the TCP handshake never completes;
- ``write``: it never reads, so a 20 MB body stops moving (the issue: the aiohttp transport
  ignored ``timeouts.write`` and the request hung until the client gave up);
- ``read``: it reads the request and never answers;
- ``pool``: ``server.max_connections`` is 1 and another request holds that connection.

Each timeout is 1 s; every other timeout of that upstream is far longer, so the 504 can only
come from the one under test, and its message must name it (phase and config key). The
client's own bound (``HANG_BOUND``) only catches a hang.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.reliability.misbehaving import MisbehavingServer
from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

HANG_BOUND = 60.0
SHORT = 1.0
LONG = 120.0
BIG_BODY = 20_000_000


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, MisbehavingServer]]:
    with (
        MisbehavingServer("no-accept") as no_accept,
        MisbehavingServer("no-read") as no_read,
        MisbehavingServer("silent") as silent,
        MisbehavingServer("silent") as holder,
    ):
        yield {"connect": no_accept, "write": no_read, "read": silent, "hold": holder}


def _timeouts(**short: float) -> dict[str, float]:
    return {"connect": LONG, "read": LONG, "write": LONG, "pool": LONG, **short}


@pytest.fixture(scope="module", params=["aiohttp", "httpx"])
def proxy_for(
    request: pytest.FixtureRequest,
    module_proxy_factory: Any,
    servers: dict[str, MisbehavingServer],
    fake_upstream: UpstreamServer,
) -> ProxyServer:
    upstreams = [
        # First: a pass-through body the proxy does not read for its model goes here too.
        upstream_entry(
            servers["write"].base_url,
            name="no-read",
            models=["t-write"],
            timeouts=_timeouts(write=SHORT),
        ),
        upstream_entry(
            servers["connect"].base_url,
            name="no-accept",
            models=["t-connect"],
            timeouts=_timeouts(connect=SHORT),
        ),
        upstream_entry(
            servers["read"].base_url,
            name="silent",
            models=["t-read"],
            timeouts=_timeouts(read=SHORT),
        ),
        upstream_entry(
            servers["hold"].base_url, name="holder", models=["t-hold"], timeouts=_timeouts()
        ),
        upstream_entry(
            servers["read"].base_url,
            name="queued",
            models=["t-pool"],
            timeouts=_timeouts(pool=SHORT),
        ),
        upstream_entry(fake_upstream, name="fake", models=["*"]),
    ]
    # No `GET /models` of its own to these upstreams: it would take the one connection.
    config = proxy_config(*upstreams, windows={"discover": False})
    config["server"].update(upstream_transport=request.param, max_connections=1)
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


def chat(model: str, content: str = "hello") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def assert_timed_out(response: httpx.Response, phase: str, key: str) -> None:
    error = assert_openai_error(response, 504)
    assert error["code"] == "upstream_timeout", error
    assert phase in error["message"], error
    assert f"timeouts.{key}: 1 s" in error["message"], error


def assert_alive(proxy: ProxyServer) -> None:
    with proxy.http_client(timeout=HANG_BOUND) as http:
        response = http.post(CHAT_PATH, json=chat("ok-model", "still there?"))
    assert response.status_code == 200, response.text


def test_connect_timeout(proxy_for: ProxyServer) -> None:
    with proxy_for.http_client(timeout=HANG_BOUND) as http:
        response = http.post(CHAT_PATH, json=chat("t-connect"))
    assert_timed_out(response, "while connecting", "connect")
    assert_alive(proxy_for)


def test_write_timeout_on_a_body_the_upstream_never_reads(proxy_for: ProxyServer) -> None:
    body = chat("t-write", "x" * BIG_BODY)
    with proxy_for.http_client(timeout=HANG_BOUND) as http:
        response = http.post(CHAT_PATH, json=body, headers={"X-Compaction": "off"})
    assert_timed_out(response, "sending the request", "write")
    assert_alive(proxy_for)


def test_write_timeout_on_a_streamed_pass_through_body(proxy_for: ProxyServer) -> None:
    """The pass-through routes stream the client's body upstream as it arrives."""
    body = b'{"model":"t-write","input":"' + b"y" * BIG_BODY + b'"}'

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    with proxy_for.http_client(timeout=HANG_BOUND) as http:
        response = http.post(
            "/v1/embeddings", content=chunks(), headers={"content-type": "application/json"}
        )
    assert_timed_out(response, "sending the request", "write")
    assert_alive(proxy_for)


def test_read_timeout(proxy_for: ProxyServer) -> None:
    with proxy_for.http_client(timeout=HANG_BOUND) as http:
        response = http.post(CHAT_PATH, json=chat("t-read"))
    assert_timed_out(response, "waiting for the response", "read")
    assert_alive(proxy_for)


def test_pool_timeout_while_the_only_connection_is_held(
    proxy_for: ProxyServer, servers: dict[str, MisbehavingServer]
) -> None:
    holder = servers["hold"]
    before = holder.accepted
    request = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    ).encode()
    payload = httpx.Request("POST", "http://x", json=chat("t-hold")).content
    request += b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    with contextlib.closing(socket.create_connection(("127.0.0.1", proxy_for.port))) as held:
        held.sendall(request)
        # The gate: the held request has the proxy's only upstream connection.
        assert holder.wait_accepted(before + 1), "the holding request never reached upstream"
        with proxy_for.http_client(timeout=HANG_BOUND) as http:
            response = http.post(CHAT_PATH, json=chat("t-pool"))
        assert_timed_out(response, "waiting for a free connection", "pool")
    # The client that held it left: the connection is free again.
    assert_alive(proxy_for)
