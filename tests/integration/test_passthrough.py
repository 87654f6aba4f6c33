"""Every /v1 route other than chat completions is relayed transparently, both ways.

The fake upstream's catch-all route echoes what it received (method, path, query, headers, body
length and hash), and ``X-Fake-Response-Bytes`` makes it answer with a large body.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import pattern_bytes
from tests.support.assertions import CHAT_PATH
from tests.support.servers import UpstreamServer

BIG = 8 * 1024 * 1024  # under the default 32 MiB max_body_bytes


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_methods_and_bodies_pass_through(
    proxy_http: httpx.Client, upstream: UpstreamServer, method: str
) -> None:
    body = b"" if method in ("GET", "DELETE") else b'{"purpose": "batch", "n": 1}'
    response = proxy_http.request(
        method,
        "/v1/files/file-abc",
        content=body,
        headers={"Content-Type": "application/json"} if body else {},
    )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["path"] == "/v1/files/file-abc"
    assert echoed["body_len"] == len(body)
    recorded = upstream.last_request("/v1/files/file-abc")
    assert recorded.method == method and recorded.body == body


@pytest.mark.parametrize(
    "query",
    [
        "purpose=batch&limit=2",
        "tag=a&tag=b&tag=",
        "after=file%2Dx&q=a%20b+c&unicode=%C3%A9",
        "flag",
    ],
)
def test_query_string_kept_verbatim(
    proxy_http: httpx.Client, upstream: UpstreamServer, query: str
) -> None:
    response = proxy_http.get(f"/v1/files?{query}")
    assert response.status_code == 200
    assert response.json()["query"] == query
    assert upstream.last_request("/v1/files").query == query


def test_host_rewritten_to_the_upstream(proxy_http: httpx.Client, upstream: UpstreamServer) -> None:
    proxy_http.get("/v1/files", headers={"Host": "proxy.example.test"})
    proxy_http.post(CHAT_PATH, json={"model": "gpt-4o", "messages": []})
    for recorded in upstream.requests():
        assert recorded.headers["host"] == f"127.0.0.1:{upstream.port}"


HOP_BY_HOP_SENT = {
    "Connection": "keep-alive, X-Hop-Custom",
    "Keep-Alive": "timeout=5, max=100",
    "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
    "Proxy-Connection": "keep-alive",
    "Trailer": "X-Checksum",
    "X-Hop-Custom": "only-for-the-next-hop",
    "X-End-To-End": "kept",
    "OpenAI-Organization": "org-123",
}
HOP_BY_HOP_DROPPED = ("keep-alive", "proxy-authorization", "proxy-connection", "trailer")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/responses", {"model": "gpt-4o", "input": "hi"}),
        ("POST", CHAT_PATH, {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
    ],
    ids=["models", "responses", "chat"],
)
def test_hop_by_hop_headers_dropped(
    proxy_http: httpx.Client,
    upstream: UpstreamServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    response = proxy_http.request(method, path, json=body, headers=HOP_BY_HOP_SENT)
    assert response.status_code == 200, response.text
    headers = upstream.last_request(path).headers
    for name in HOP_BY_HOP_DROPPED:
        assert name not in headers, (name, headers)
    assert "x-hop-custom" not in headers.get("connection", "").lower()
    # End-to-end headers are not the proxy's business.
    assert headers["x-end-to-end"] == "kept"
    assert headers["openai-organization"] == "org-123"


@pytest.mark.parametrize("path", ["/v1/models", CHAT_PATH])
def test_header_named_in_connection_dropped(
    proxy_http: httpx.Client, upstream: UpstreamServer, path: str
) -> None:
    """RFC 9110 7.6.1: a header listed in Connection is hop-by-hop too."""
    body = {"model": "gpt-4o", "messages": []} if path == CHAT_PATH else None
    proxy_http.request(
        "POST" if body else "GET", path, json=body, headers=HOP_BY_HOP_SENT
    ).raise_for_status()
    assert "x-hop-custom" not in upstream.last_request(path).headers


def test_large_body_streams_up(proxy_http: httpx.Client, upstream: UpstreamServer) -> None:
    body = os.urandom(1024) * (BIG // 1024)
    response = proxy_http.post(
        "/v1/files", content=body, headers={"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["body_len"] == len(body)
    assert echoed["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_chunked_upload_streams_up(proxy_http: httpx.Client, upstream: UpstreamServer) -> None:
    piece = os.urandom(64 * 1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(48):  # 3 MiB without a Content-Length
            yield piece

    response = proxy_http.post(
        "/v1/uploads/up-1/parts",
        content=chunks(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["body_len"] == len(piece) * 48
    assert echoed["body_sha256"] == hashlib.sha256(piece * 48).hexdigest()


def test_large_response_streams_down(proxy_http: httpx.Client, upstream: UpstreamServer) -> None:
    with proxy_http.stream(
        "GET", "/v1/files/file-big/content", headers={"X-Fake-Response-Bytes": str(BIG)}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        digest = hashlib.sha256()
        received = 0
        for chunk in response.iter_raw():
            digest.update(chunk)
            received += len(chunk)
    assert received == BIG
    assert digest.hexdigest() == hashlib.sha256(pattern_bytes(BIG)).hexdigest()


def test_binary_body_unchanged(proxy_http: httpx.Client, upstream: UpstreamServer) -> None:
    body = bytes(range(256)) * 4
    response = proxy_http.put("/v1/audio/blob", content=body, headers={"Content-Type": "audio/wav"})
    assert response.status_code == 200
    recorded = upstream.last_request("/v1/audio/blob")
    assert recorded.body == body
    assert recorded.headers["content-type"] == "audio/wav"


def test_upstream_status_and_headers_on_pass_through(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    response = proxy_http.delete("/v1/files/missing", headers={"X-Fake-Status": "404"})
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "fake upstream error: status 404"


def test_upstream_cookies_never_travel_to_another_clients_request(
    proxy: Any, upstream: UpstreamServer
) -> None:
    """The proxy's one upstream client is shared by every caller: it must keep no cookie jar."""
    with proxy.http_client() as first:
        set_by_provider = first.get("/v1/files/a", headers={"X-Fake-Set-Cookie": "s=client-a"})
        assert set_by_provider.status_code == 200
        assert "s=client-a" in set_by_provider.headers.get("set-cookie", "")  # relayed back
    with proxy.http_client() as second:
        echoed = second.get("/v1/files/b").json()
    assert "cookie" not in echoed["headers"], echoed["headers"]
    # A cookie a client sends itself is an end-to-end header and passes through.
    with proxy.http_client() as third:
        echoed = third.get("/v1/files/c", headers={"Cookie": "mine=1"}).json()
    assert echoed["headers"]["cookie"] == "mine=1"


def test_no_accept_encoding_is_added_for_the_client(proxy: Any, upstream: UpstreamServer) -> None:
    """Bodies are relayed undecoded, so only the client may ask for compression."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(proxy.base_url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:  # http.client sends no Accept-Encoding unless told to
        connection.request("GET", "/v1/models", headers={"Accept-Encoding": ""})
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    received = upstream.last_request("/v1/models").headers
    assert received.get("accept-encoding", "") == ""
    assert "python-httpx" not in received.get("user-agent", "")
    assert "aiohttp" not in received.get("user-agent", "")


def test_a_large_streamed_upload_keeps_its_content_length(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    """Bodies over the routing peek limit stream through; their declared length goes along."""
    body = pattern_bytes(300 * 1024)
    response = proxy_http.post(
        "/v1/files", content=body, headers={"Content-Type": "application/octet-stream"}
    )
    assert response.status_code == 200, response.text
    received = upstream.last_request("/v1/files")
    assert received.body == body
    assert received.headers.get("content-length") == str(len(body))
    assert "transfer-encoding" not in received.headers
