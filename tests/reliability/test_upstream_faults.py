"""Upstream faults, end to end: what the client sees when the upstream misbehaves.

Real processes: the proxy (a 1 s upstream read timeout, so timeouts are fast to provoke) in
front of the fake upstream, steered per request by ``X-Fake-*`` headers; and a proxy whose
upstream is a bound port that never listens. Each fault runs short and padded past the test
model's 4k window (the padded request is compacted, and the summarizer is called, before the
fault hits). Every test ends by checking that the proxy still serves a normal request.

Some faults are also covered in tests/integration (``test_upstream_down_is_502``,
``test_upstream_timeout_is_504`` with a hung upstream, ``test_client_disconnect_cancels_
upstream``); they are repeated here with compacted requests and the other shapes (a late first
byte rather than none, a stall mid-stream) so that this suite stands on its own.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream import HTML_PAGE
from tests.reliability.hostile import MODEL, WINDOW, conversation
from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry
from tests.support.sse import iter_sse_data

READ_TIMEOUT = 1.0
HANG_BOUND = 45.0  # seconds; only catches a hang, never a slow machine
SIZES = pytest.mark.parametrize("padded", [False, True], ids=["short", "padded"])
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
TRACEBACK_MARKERS = (b"Traceback", b'File "')


def models() -> dict[str, Any]:
    return {MODEL: {"context_window": WINDOW, "max_output_tokens": 256}}


@pytest.fixture(scope="module")
def fault_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    timeouts = {"connect": 5, "read": READ_TIMEOUT, "write": 5, "pool": 5}
    config = proxy_config(
        upstream_entry(fake_upstream, name="flaky-1", timeouts=timeouts), models=models()
    )
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


@pytest.fixture(scope="module")
def down_proxy(module_proxy_factory: Any, dead_upstream_url: str) -> ProxyServer:
    config = proxy_config(upstream_entry(dead_upstream_url, name="gone-9"), models=models())
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


@pytest.fixture
def client(fault_proxy: ProxyServer) -> Iterator[httpx.Client]:
    with fault_proxy.http_client(timeout=HANG_BOUND) as http:
        yield http


def chat_body(padded: bool, label: str, *, stream: bool = False) -> dict[str, Any]:
    """A chat request; ``label`` (with ``stream``) keeps each test's conversation its own, so
    no test starts from a checkpoint another one left."""
    messages = conversation(padded, f"{label}-{'stream' if stream else 'json'}")
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if stream:
        body["stream"] = True
    return body


def assert_no_traceback(content: bytes) -> None:
    for marker in TRACEBACK_MARKERS:
        assert marker not in content, content[:500]


def assert_alive(proxy: ProxyServer) -> None:
    """``/healthz`` answers and a plain request goes through, after whatever just happened."""
    with proxy.http_client(timeout=HANG_BOUND) as http:
        assert http.get("/healthz").status_code == 200
        normal = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}]}
        response = http.post(CHAT_PATH, json=normal)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: still there?"


def read_stream(response: httpx.Response) -> tuple[list[str], BaseException | None]:
    """The SSE data payloads that arrived, and the error that ended the stream (or None)."""
    events: list[str] = []
    try:
        for data in iter_sse_data(response.iter_lines()):
            events.append(data)
    except (httpx.TransportError, httpx.StreamError) as error:
        return events, error
    return events, None


def assert_compacted_if_padded(response: httpx.Response, padded: bool) -> None:
    """The padded request really went through compaction before the fault."""
    if padded:
        before = int(response.headers["x-compaction-tokens-before"])
        assert before > WINDOW, before
        assert response.headers["x-compaction-strategies"] != "none"


# --------------------------------------------------------------------------- a cut stream


@SIZES
def test_a_stream_cut_mid_way_ends_the_clients_stream_without_a_clean_end(
    fault_proxy: ProxyServer, upstream: UpstreamServer, client: httpx.Client, padded: bool
) -> None:
    tag = f"cut-{uuid.uuid4().hex}"
    headers = {
        "X-Fake-Chunks": "10",
        "X-Fake-Chunk-Delay-Ms": "100",
        "X-Fake-Cut-After": "4",
        "X-Fake-Tag": tag,
    }
    body = chat_body(padded, "cut", stream=True)
    with client.stream("POST", CHAT_PATH, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert_compacted_if_padded(response, padded)
        events, error = read_stream(response)
    # The four events the upstream sent arrived; then the client learns the stream broke:
    # no [DONE], no finish_reason, an incomplete chunked body (never a forged clean end).
    assert len(events) == 4, events
    assert "[DONE]" not in events
    assert not any('"finish_reason":"stop"' in event for event in events)
    assert isinstance(error, httpx.RemoteProtocolError), error
    assert upstream.wait_for_event(lambda e: e.get("tag") == tag) is not None
    assert_alive(fault_proxy)


def test_the_sdk_sees_a_cut_stream_as_an_error(
    fault_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    sdk = fault_proxy.openai_client(timeout=HANG_BOUND)
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=conversation(True, "sdk-cut"),  # type: ignore[arg-type]
        stream=True,
        extra_headers={"X-Fake-Chunks": "10", "X-Fake-Cut-After": "3"},
    )
    received = 0
    with pytest.raises((httpx.TransportError, openai.APIError)):
        for _ in stream:
            received += 1
    assert received <= 3  # (events arriving with the connection's end may be lost with it)
    sdk.close()
    assert_alive(fault_proxy)


@SIZES
def test_a_json_reply_cut_mid_body_is_not_completed_by_the_proxy(
    fault_proxy: ProxyServer, upstream: UpstreamServer, client: httpx.Client, padded: bool
) -> None:
    body = chat_body(padded, "cut-json")
    error: BaseException | None = None
    received = b""
    with client.stream(
        "POST", CHAT_PATH, json=body, headers={"X-Fake-Cut-After": "40"}
    ) as response:
        assert response.status_code == 200
        try:
            for piece in response.iter_raw():
                received += piece
        except httpx.TransportError as exc:
            error = exc
    # At most what the upstream sent, then a broken body: nothing made up, no clean end.
    # (Not always all 40 bytes: when they arrive together with the connection's end, aiohttp
    # raises the payload error before handing them over; the body is broken either way.)
    assert len(received) <= 40 and b'{"id":"chatcmpl-fake'.startswith(received[:20]), received
    assert isinstance(error, httpx.RemoteProtocolError), error
    assert_alive(fault_proxy)


# --------------------------------------------------------------------------- not JSON


@SIZES
@STREAMS
def test_an_html_200_is_relayed_unchanged(
    fault_proxy: ProxyServer,
    upstream: UpstreamServer,
    client: httpx.Client,
    padded: bool,
    stream: bool,
) -> None:
    body = chat_body(padded, "html", stream=stream)
    response = client.post(CHAT_PATH, json=body, headers={"X-Fake-Body": "html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.content == HTML_PAGE
    assert_compacted_if_padded(response, padded)
    assert_alive(fault_proxy)


@pytest.mark.parametrize("status", [400, 413, 422, 502])
def test_an_html_error_on_a_compacted_request_is_relayed_unchanged(
    fault_proxy: ProxyServer, upstream: UpstreamServer, client: httpx.Client, status: int
) -> None:
    """400/413/422 replies to a compacted request are held and read as possible overflow
    refusals; one that is not JSON at all must still reach the client as it came."""
    body = chat_body(True, f"html-{status}")
    headers = {"X-Fake-Body": "html", "X-Fake-Status": str(status)}
    response = client.post(CHAT_PATH, json=body, headers=headers)
    assert response.status_code == status
    assert response.content == HTML_PAGE
    assert "x-compaction-retry" not in response.headers
    assert len(upstream.requests(CHAT_PATH)) >= 1
    assert_alive(fault_proxy)


def test_the_sdk_gets_an_error_not_a_crash_from_an_html_200(
    fault_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    sdk = fault_proxy.openai_client(timeout=HANG_BOUND)
    try:
        reply = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Fake-Body": "html"},
        )
    except openai.APIError:
        pass  # the SDK's own verdict on a non-JSON reply
    else:
        assert isinstance(reply, str) and "Bad Gateway" in reply  # the SDK returns the text
    finally:
        sdk.close()
    assert_alive(fault_proxy)


# --------------------------------------------------------------------------- timeouts


@SIZES
@STREAMS
def test_a_first_byte_later_than_the_read_timeout_is_504(
    fault_proxy: ProxyServer,
    upstream: UpstreamServer,
    client: httpx.Client,
    padded: bool,
    stream: bool,
) -> None:
    tag = f"late-{uuid.uuid4().hex}"
    # The client gives up after HANG_BOUND (a hang); the upstream answers after 4x the read
    # timeout: a 504 naming the upstream shows the read timeout ended the wait.
    response = client.post(
        CHAT_PATH,
        json=chat_body(padded, "late", stream=stream),
        headers={"X-Fake-Delay-Ms": str(int(READ_TIMEOUT * 1000 * 4)), "X-Fake-Tag": tag},
    )
    error = assert_openai_error(response, 504)
    assert "flaky-1" in error["message"]
    assert error["type"] == "upstream_error"
    assert_no_traceback(response.content)
    assert response.headers.get("x-request-id")
    assert_compacted_if_padded(response, padded)
    assert_alive(fault_proxy)


@SIZES
def test_a_stall_mid_stream_longer_than_the_read_timeout_ends_the_stream(
    fault_proxy: ProxyServer, upstream: UpstreamServer, client: httpx.Client, padded: bool
) -> None:
    """Headers are gone by then: the only honest signal is a broken body, and the upstream
    request is dropped rather than left generating."""
    tag = f"stall-{uuid.uuid4().hex}"
    headers = {
        "X-Fake-Chunks": "3",
        "X-Fake-Chunk-Delay-Ms": str(int(READ_TIMEOUT * 1000 * 4)),
        "X-Fake-Tag": tag,
    }
    with client.stream(
        "POST", CHAT_PATH, json=chat_body(padded, "stall", stream=True), headers=headers
    ) as response:
        assert response.status_code == 200
        events, error = read_stream(response)
    assert "[DONE]" not in events
    assert isinstance(error, httpx.RemoteProtocolError), (error, events)
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag)
    assert event is not None and event["type"] == "stream_cancelled", event
    assert event["chunks_sent"] < 3 + 3  # role + 3 content + finish + [DONE] were due
    assert_alive(fault_proxy)


# --------------------------------------------------------------------------- upstream down


@SIZES
@STREAMS
def test_an_upstream_that_refuses_connections_is_502(
    down_proxy: ProxyServer, padded: bool, stream: bool
) -> None:
    with down_proxy.http_client(timeout=HANG_BOUND) as http:
        response = http.post(CHAT_PATH, json=chat_body(padded, "down", stream=stream))
        error = assert_openai_error(response, 502)
        assert "gone-9" in error["message"]
        assert error["type"] == "upstream_error"
        assert error["param"] is None
        assert_no_traceback(response.content)
        assert_compacted_if_padded(response, padded)  # the summarizer failed too: truncation
        assert http.get("/healthz").status_code == 200


def test_the_sdk_sees_502_from_a_down_upstream(down_proxy: ProxyServer) -> None:
    sdk = down_proxy.openai_client(timeout=HANG_BOUND)
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(
            model=MODEL,
            messages=conversation(True, "sdk-down"),  # type: ignore[arg-type]
        )
    sdk.close()
    assert caught.value.status_code == 502
    assert isinstance(caught.value.body, dict) and "gone-9" in caught.value.body["message"]


# --------------------------------------------------------------------------- client leaves


@SIZES
def test_a_client_that_leaves_mid_stream_cancels_the_upstream_request(
    fault_proxy: ProxyServer, upstream: UpstreamServer, client: httpx.Client, padded: bool
) -> None:
    tag = f"leave-{uuid.uuid4().hex}"
    total = 200  # 200 x 50 ms: still streaming long after the client has gone
    headers = {"X-Fake-Chunks": str(total), "X-Fake-Chunk-Delay-Ms": "50", "X-Fake-Tag": tag}
    with client.stream(
        "POST", CHAT_PATH, json=chat_body(padded, "leave", stream=True), headers=headers
    ) as response:
        assert response.status_code == 200
        seen = 0
        for data in iter_sse_data(response.iter_lines()):
            if "t=" in data:
                seen += 1
                if seen == 2:
                    break
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag)
    assert event is not None, "the upstream never saw its request cancelled"
    assert event["type"] == "stream_cancelled"
    assert event["chunks_sent"] < total
    assert_alive(fault_proxy)


def test_a_client_that_resets_the_socket_mid_stream_cancels_the_upstream_request(
    fault_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    """No polite close: an RST (SO_LINGER 0) after the first bytes, as a killed client does."""
    tag = f"reset-{uuid.uuid4().hex}"
    body = httpx.Request("POST", "http://x/", json=chat_body(True, "reset", stream=True)).read()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Fake-Chunks: 200\r\nX-Fake-Chunk-Delay-Ms: 50\r\n"
        f"X-Fake-Tag: {tag}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", fault_proxy.port), timeout=HANG_BOUND) as sock:
        sock.sendall(head + body)
        received = b""
        while b"t=" not in received:
            chunk = sock.recv(65536)
            assert chunk, "the proxy closed before streaming"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag)
    assert event is not None and event["type"] == "stream_cancelled", event
    assert_alive(fault_proxy)


def test_a_client_that_leaves_before_the_first_byte_cancels_the_upstream_request(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    """The shared proxy waits up to 600 s for a first byte: only the client leaving can end
    this upstream request early, so the event proves the proxy acted on the disconnect."""
    tag = f"early-{uuid.uuid4().hex}"
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with proxy.http_client(timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(CHAT_PATH, json=body, headers={"X-Fake-Hang": "1", "X-Fake-Tag": tag})
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag)
    assert event is not None and event["type"] == "hang_abandoned", event
    assert_alive_default(proxy)


def assert_alive_default(proxy: ProxyServer) -> None:
    with proxy.http_client(timeout=HANG_BOUND) as http:
        assert http.get("/healthz").status_code == 200
        normal = {"model": "gpt-4o", "messages": [{"role": "user", "content": "still there?"}]}
        assert http.post(CHAT_PATH, json=normal).status_code == 200
