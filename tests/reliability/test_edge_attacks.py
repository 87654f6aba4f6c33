"""Path and header attacks against a real proxy: nothing escapes /v1, headers are bounded.

The proxy is `compaction-proxy serve` as a child process (its own HTTP protocol), the upstream a
real fake server that records what reaches it. Requests go over a plain socket so the paths
arrive exactly as written.
"""

from __future__ import annotations

import pytest

from tests.reliability.rawhttp import get, send_raw
from tests.support.servers import ProxyServer, UpstreamServer

ESCAPES = [
    "/v1/../../etc/passwd",
    "/v1/%2e%2e/%2e%2e/admin",
    "/v1/%2E%2E/admin",
    "/v1/models/../../admin",
    "/v1/chat/completions/../../../x",
    "/v1/..%2f..%2fadmin",
    "/v1/models%5c..%5c..%5cadmin",
]


def assert_openai_error(response: object, status: int) -> dict[str, object]:
    assert response is not None, "the proxy closed without an answer"
    assert response.status == status, (response.status, response.body[:200])
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert b"Traceback" not in response.body
    return error


@pytest.mark.parametrize("target", ESCAPES)
def test_paths_that_leave_v1_are_refused_and_never_forwarded(
    proxy: ProxyServer, upstream: UpstreamServer, target: str
) -> None:
    error = assert_openai_error(get(proxy.port, target), 400)
    assert error["code"] == "invalid_path"
    assert "/etc/passwd" not in str(error["message"])
    assert upstream.requests() == []


@pytest.mark.parametrize(
    ("target", "forwarded", "query"),
    [
        ("/v1//models", "/v1/models", ""),
        ("/v1/models/./x/../gpt-4o", "/v1/models/gpt-4o", ""),
        ("/v1/models?a=..%2F..&b=1", "/v1/models", "a=..%2F..&b=1"),
    ],
)
def test_safe_paths_are_normalised_before_they_are_forwarded(
    proxy: ProxyServer, upstream: UpstreamServer, target: str, forwarded: str, query: str
) -> None:
    response = get(proxy.port, target)
    assert response is not None and response.status < 500
    (recorded,) = upstream.requests()
    assert recorded.path == forwarded
    assert recorded.query == query  # the query string passes through as sent
    assert ".." not in recorded.path


def test_an_oversized_header_gets_431_and_is_not_forwarded(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    error = assert_openai_error(get(proxy.port, "/v1/models", {"X-Big": "a" * 20_000}), 431)
    assert error["code"] == "request_header_fields_too_large"
    assert upstream.requests() == []
    error = assert_openai_error(get(proxy.port, "/healthz", {"X-Big": "a" * 100_000}), 431)


def test_too_many_headers_in_total_get_431(proxy: ProxyServer, upstream: UpstreamServer) -> None:
    headers = {f"X-Pad-{n}": "b" * 8_000 for n in range(12)}  # each fine, ~96 KB together
    assert_openai_error(get(proxy.port, "/v1/models", headers), 431)
    assert upstream.requests() == []


def test_a_32_mb_header_is_cut_off_early_and_the_proxy_lives_on(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: "
    response = send_raw(proxy.port, head + b"c" * (32 << 20) + b"\r\n\r\n")
    assert_openai_error(response, 431)
    alive = get(proxy.port, "/healthz")
    assert alive is not None and alive.status == 200


def test_normal_headers_still_pass(proxy: ProxyServer, upstream: UpstreamServer) -> None:
    response = get(proxy.port, "/v1/models", {"X-Fine": "d" * 8_000})
    assert response is not None and response.status == 200
    assert upstream.last_request().headers["x-fine"] == "d" * 8_000


def test_a_large_body_in_one_read_is_not_mistaken_for_headers(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    # Headers, body and all in one write: only the header block counts against the limit.
    body = b'{"model": "text-embedding-3-small", "input": "' + b"e" * 300_000 + b'"}'
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    response = send_raw(proxy.port, head + body)
    assert response is not None and response.status == 200, response
    assert upstream.last_request("/v1/embeddings").body == body


def test_pipelined_requests_on_one_connection_both_answer(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    one = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    two = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    response = send_raw(proxy.port, one + two, until_close=True)
    assert response is not None and response.status == 200
    assert b"HTTP/1.1 200 " in response.body + response.rest  # the second answer followed
    assert len(upstream.requests("/v1/models")) == 2
