"""Errors: upstream ones pass through untouched; the proxy's own use OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

USER: list[Any] = [{"role": "user", "content": "hello"}]
CHAT = {"model": "gpt-4o", "messages": USER}

# --------------------------------------------------------------------------- upstream errors


@pytest.mark.parametrize(
    ("status", "exception"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (404, openai.NotFoundError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_error_reaches_sdk(
    openai_client: openai.OpenAI,
    upstream: UpstreamServer,
    status: int,
    exception: type[openai.APIStatusError],
    stream: bool,
) -> None:
    message = f"upstream says no ({status})"
    with pytest.raises(exception) as caught:
        openai_client.chat.completions.create(
            model="gpt-4o",
            messages=USER,  # type: ignore[arg-type]
            stream=stream,
            extra_headers={"X-Fake-Status": str(status), "X-Fake-Error-Message": message},
        )
    assert caught.value.status_code == status
    assert message in caught.value.message  # the SDK prefixes "Error code: N - "
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == message


@pytest.mark.parametrize("path", [CHAT_PATH, "/v1/models", "/v1/files/file-1"])
def test_upstream_error_body_and_status_unchanged(
    proxy_http: httpx.Client, upstream: UpstreamServer, path: str
) -> None:
    headers = {"X-Fake-Status": "418", "X-Fake-Error-Message": "teapot"}
    method = "POST" if path == CHAT_PATH else "GET"
    json_body = CHAT if method == "POST" else None
    direct = upstream.client.request(method, path, json=json_body, headers=headers)
    via_proxy = proxy_http.request(method, path, json=json_body, headers=headers)
    assert via_proxy.status_code == direct.status_code == 418
    assert via_proxy.content == direct.content
    assert via_proxy.headers["content-type"] == direct.headers["content-type"]


def test_upstream_context_window_error_passes_through(
    openai_client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    upstream.control(model_context_windows={"tiny-model": 40})
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model="tiny-model",
            messages=[{"role": "user", "content": "many words " * 30}],
        )
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 40 tokens" in caught.value.message


# --------------------------------------------------------------------------- 502 / 504


@pytest.fixture(scope="module")
def dead_proxy(module_proxy_factory: Any, dead_upstream_url: str) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(
        proxy_config(upstream_entry(dead_upstream_url, name="deadup-7"))
    )
    return proxy


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", CHAT_PATH, CHAT),
        ("POST", CHAT_PATH, {**CHAT, "stream": True}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"}),
    ],
    ids=["json", "stream", "models", "embeddings"],
)
def test_upstream_down_is_502(
    dead_proxy: ProxyServer, method: str, path: str, body: dict[str, Any] | None
) -> None:
    with dead_proxy.http_client() as client:
        response = client.request(method, path, json=body)
    error = assert_openai_error(response, 502)
    assert "deadup-7" in error["message"]
    assert error["param"] is None
    assert response.headers.get("x-request-id")


def test_upstream_down_sdk_sees_502(dead_proxy: ProxyServer) -> None:
    client = dead_proxy.openai_client()
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert caught.value.status_code == 502
    assert "deadup-7" in caught.value.message


@pytest.fixture(scope="module")
def impatient_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    timeouts = {"connect": 5, "read": 1, "write": 5, "pool": 5}
    proxy: ProxyServer = module_proxy_factory(
        proxy_config(upstream_entry(fake_upstream, name="slowup-3", timeouts=timeouts))
    )
    return proxy


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", CHAT_PATH, CHAT),
        ("POST", CHAT_PATH, {**CHAT, "stream": True}),
        ("GET", "/v1/models", None),
    ],
    ids=["json", "stream", "models"],
)
def test_upstream_timeout_is_504(
    impatient_proxy: ProxyServer,
    upstream: UpstreamServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    # The upstream never answers: only the proxy's 1 s read timeout (not the 600 s default)
    # can answer within the client's generous 45 s, which raises on a hang.
    with impatient_proxy.http_client(timeout=45.0) as client:
        response = client.request(method, path, json=body, headers={"X-Fake-Hang": "1"})
    error = assert_openai_error(response, 504)
    assert "slowup-3" in error["message"]
    assert len(upstream.requests(path)) == 1


def test_slow_but_in_time_upstream_is_fine(
    impatient_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    client = impatient_proxy.openai_client()
    completion = client.chat.completions.create(
        model="gpt-4o",
        messages=USER,  # type: ignore[arg-type]
        extra_headers={"X-Fake-Delay-Ms": "200"},
    )
    assert completion.choices[0].message.content == "echo: hello"


# --------------------------------------------------------------------------- bad requests

BAD_BODIES = {
    "empty": b"",
    "malformed": b'{"model": "gpt-4o", "messages": [',
    "trailing-garbage": b'{"model": "gpt-4o", "messages": []} x',
    "array": b'[{"model": "gpt-4o"}]',
    "string": b'"hello"',
    "number": b"42",
    "missing-messages": b'{"model": "gpt-4o"}',
    "messages-string": b'{"model": "gpt-4o", "messages": "hi"}',
    "messages-object": b'{"model": "gpt-4o", "messages": {"role": "user", "content": "hi"}}',
    "messages-null": b'{"model": "gpt-4o", "messages": null}',
    "model-number": b'{"model": 5, "messages": []}',
    "model-null": b'{"model": null, "messages": []}',
    "model-list": b'{"model": ["gpt-4o"], "messages": []}',
    "not-utf8": b'{"model": "gpt-4o", "messages": [], "x": "\xff\xfe"}',
}


@pytest.mark.parametrize("body", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_bad_chat_body_is_400(
    proxy_http: httpx.Client, upstream: UpstreamServer, body: bytes
) -> None:
    response = proxy_http.post(
        CHAT_PATH, content=body, headers={"Content-Type": "application/json"}
    )
    assert_openai_error(response, 400)
    assert upstream.requests(CHAT_PATH) == []


def test_bad_body_sdk_sees_bad_request(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(
            model="gpt-4o",
            messages="not a list",  # type: ignore[arg-type]
        )


# --------------------------------------------------------------------------- body size

LIMIT = 4096


@pytest.fixture(scope="module")
def small_body_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(
        proxy_config(upstream_entry(fake_upstream), max_body_bytes=LIMIT)
    )
    return proxy


def _chat_body(size: int) -> bytes:
    """A valid chat body of exactly ``size`` bytes."""
    head, tail = b'{"model":"gpt-4o","messages":[{"role":"user","content":"', b'"}]}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def _chunks(data: bytes, size: int = 1000) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_body_at_the_limit_is_accepted(
    small_body_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    body = _chat_body(LIMIT)
    with small_body_proxy.http_client() as client:
        response = client.post(CHAT_PATH, content=body)
    assert response.status_code == 200, response.text
    assert upstream.last_request(CHAT_PATH).body == body


@pytest.mark.parametrize("path", [CHAT_PATH, "/v1/files"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_limit_is_413(
    small_body_proxy: ProxyServer, upstream: UpstreamServer, path: str, chunked: bool
) -> None:
    body = _chat_body(LIMIT * 3)
    content: bytes | Iterator[bytes] = _chunks(body) if chunked else body
    with small_body_proxy.http_client() as client:
        response = client.post(
            path, content=content, headers={"Content-Type": "application/octet-stream"}
        )
    assert_openai_error(response, 413)
    received = upstream.requests(path)
    assert all(len(r.body) <= LIMIT for r in received), "an oversized body reached the upstream"
    with small_body_proxy.http_client() as client:  # and the proxy still works afterwards
        assert client.post(CHAT_PATH, content=_chat_body(200)).status_code == 200
