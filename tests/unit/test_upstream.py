"""Routing, header rules and transport-error mapping for both upstream transports."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import httpcore
import httpx
import pytest
import respx
from aiohttp.client_reqrep import ConnectionKey
from httpcore._exceptions import map_exceptions

from compaction_proxy.config import ServerSettings, Timeouts, UpstreamSettings
from compaction_proxy.http import ProxyError
from compaction_proxy.upstream import (
    TRANSPORT_ERRORS,
    AiohttpUpstream,
    HttpxUpstream,
    ModelRead,
    Router,
    UpstreamFailure,
    UpstreamRequest,
    UpstreamTimeout,
    classify_error,
    json_model,
    make_transport,
    plain_httpx_client,
    response_headers,
    upstream_headers,
)
from compaction_proxy.wire import registry
from compaction_proxy.wire.messages import MESSAGES

URL = "http://upstream.test/v1/chat/completions"


def upstream(name: str = "up", models: list[str] | None = None, **kw: Any) -> UpstreamSettings:
    return UpstreamSettings(
        name=name, base_url=f"http://{name}.test/v1", models=models or ["*"], **kw
    )


# --- Router -------------------------------------------------------------------------------------


class TestRoutingByBody:
    """The rule for a body the proxy does not parse: its ``model`` read leniently, and a 400
    (415 when compressed) rather than a guess when the proxy routes by model and cannot read it."""

    def test_the_model_of_any_json_object_is_read(self) -> None:
        assert json_model(b'{"model": "gpt-4o", "input": "x"}').model == "gpt-4o"
        assert json_model(b'\xef\xbb\xbf{"model": "gpt-4o", "n": 1e400}').model == "gpt-4o"
        assert json_model(b"").model is None and json_model(b"").problem is None
        assert json_model(b'{"model": 3}').problem == "'model' must be a string, not a number"
        assert json_model(b"[1]").problem == "the body is a JSON list, not an object"

    def test_a_body_the_proxy_cannot_read_is_refused_only_when_it_routes_by_model(self) -> None:
        by_model = Router([upstream("openai", ["gpt-*"]), upstream("local")])
        catch_all = Router([upstream("local"), upstream("openai", ["gpt-*"])])
        unreadable = ModelRead(problem="'model' must be a string, not a number")
        with pytest.raises(ProxyError) as refused:
            by_model.route(unreadable)
        assert (refused.value.status, refused.value.code) == (400, "invalid_model")
        assert catch_all.route(unreadable).name == "local"
        assert by_model.route(ModelRead()).name == "openai"  # names none: the first upstream
        assert by_model.route(ModelRead("gpt-4o")).name == "openai"

    def test_a_compressed_body_is_refused_only_when_the_proxy_must_read_it(self) -> None:
        by_model = Router([upstream("openai", ["gpt-*"]), upstream("local")])
        for encoding in (None, b"", b" Identity "):
            by_model.check_encoding(encoding)
        with pytest.raises(ProxyError) as refused:
            by_model.check_encoding(b"gzip")
        assert (refused.value.status, refused.value.code) == (415, "unsupported_content_encoding")
        Router([upstream("local")]).check_encoding(b"gzip")


class TestRouter:
    def test_glob_routing(self) -> None:
        router = Router(
            [upstream("openai", ["gpt-*", "o1*"]), upstream("local", ["llama-*", "qwen*"])]
        )
        assert router.for_model("gpt-4o").name == "openai"
        assert router.for_model("o1-mini").name == "openai"
        assert router.for_model("llama-3.1-8b").name == "local"
        assert router.for_model("qwen2.5").name == "local"

    def test_first_match_wins(self) -> None:
        router = Router([upstream("a", ["gpt-4*"]), upstream("b", ["gpt-*"]), upstream("c")])
        assert router.for_model("gpt-4o").name == "a"
        assert router.for_model("gpt-3.5").name == "b"
        assert router.for_model("claude").name == "c"

    def test_a_model_nobody_serves_is_refused(self) -> None:
        router = Router([upstream("a", ["gpt-*"]), upstream("b", ["llama-*"])])
        with pytest.raises(ProxyError) as caught:
            router.for_model("mistral-large")
        error = caught.value
        assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
        assert "'mistral-large'" in error.message and "a, b" in error.message
        assert router.default.name == "a"
        assert router.routes_by_model

    def test_the_catch_all_is_explicit(self) -> None:
        router = Router([upstream("a", ["gpt-*"]), upstream("b", ["*"])])
        assert router.for_model("mistral-large").name == "b"
        assert router.routes_by_model
        # An upstream that lists nothing serves everything (the default `models: ["*"]`).
        listed_nothing = UpstreamSettings(name="c", base_url="http://c.test/v1")
        assert listed_nothing.models == ["*"]
        only = Router([listed_nothing, upstream("d", ["x"])])
        assert only.for_model("anything").name == "c"
        assert not only.routes_by_model  # every request goes to the first: no body is read

    def test_no_model_goes_to_default(self) -> None:
        router = Router([upstream("a", ["x"]), upstream("b", ["*"])])
        assert router.for_model(None).name == "a"
        # An empty name is a name: only a pattern that matches it serves it.
        assert router.for_model("").name == "b"
        with pytest.raises(ProxyError):
            Router([upstream("a", ["x-*"])]).for_model("")

    def test_match_is_case_sensitive_and_whole(self) -> None:
        router = Router([upstream("a", ["*"]), upstream("b", ["gpt-4o"])])
        strict = Router([upstream("b", ["gpt-4o"])])
        assert strict.for_model("gpt-4o").name == "b"
        for model in ("GPT-4o", "gpt-4o-mini"):
            with pytest.raises(ProxyError):
                strict.for_model(model)
        assert router.for_model("GPT-4o").name == "a"

    def test_character_classes(self) -> None:
        router = Router([upstream("b", ["model-[0-9]"]), upstream("a", ["*"])])
        assert router.for_model("model-7").name == "b"
        assert router.for_model("model-x").name == "a"

    def test_cached_answer_is_stable(self) -> None:
        router = Router([upstream("a", ["x-*"]), upstream("b", ["*"])])
        first = router.for_model("x-1")
        assert router.for_model("x-1") is first
        assert router.for_model("y").name == "b"
        strict = Router([upstream("a", ["x-*"])])
        for _ in range(2):  # a refusal is cached too, and still a refusal
            with pytest.raises(ProxyError):
                strict.for_model("y")

    def test_cache_is_bounded(self) -> None:
        router = Router([upstream("a")])
        for i in range(5000):
            router.for_model(f"m{i}")
        assert len(router._cache) <= 4096

    def test_empty_rejected(self) -> None:
        with pytest.raises(ValueError):
            Router([])


# --- request headers -----------------------------------------------------------------------------


def raw(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs]


class TestUpstreamHeaders:
    def test_drops_hop_by_hop_host_length_and_ours(self) -> None:
        headers = raw(
            ("Host", "proxy.local"),
            ("Content-Length", "12"),
            ("Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("TE", "trailers"),
            ("Trailer", "x"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "Basic abc"),
            ("Proxy-Connection", "keep-alive"),
            ("X-Compaction", "off"),
            ("Content-Type", "application/json"),
        )
        out = upstream_headers(headers, upstream(), strip_authorization=False)
        assert out == [("content-type", "application/json")]

    def test_drops_connection_listed_headers(self) -> None:
        headers = raw(
            ("Connection", "close, X-Secret-Hop , x-other"),
            ("X-Secret-Hop", "1"),
            ("X-Other", "2"),
            ("X-Kept", "3"),
        )
        out = upstream_headers(headers, upstream(), strip_authorization=False)
        assert out == [("x-kept", "3")]

    def test_keeps_others_in_order_with_duplicates(self) -> None:
        headers = raw(
            ("Accept", "application/json"),
            ("OpenAI-Organization", "org-1"),
            ("X-Custom", "a"),
            ("User-Agent", "OpenAI/Python 1.0"),
            ("X-Custom", "b"),
        )
        out = upstream_headers(headers, upstream(), strip_authorization=False)
        assert out == [
            ("accept", "application/json"),
            ("openai-organization", "org-1"),
            ("x-custom", "a"),
            ("user-agent", "OpenAI/Python 1.0"),
            ("x-custom", "b"),
        ]

    def test_values_kept_byte_for_byte(self) -> None:
        headers = [(b"x-latin", "caf\xe9 ; q=1".encode("latin-1"))]
        out = upstream_headers(headers, upstream(), strip_authorization=False)
        assert out == [("x-latin", "caf\xe9 ; q=1")]

    def test_client_authorization_passes_through_without_upstream_key(self) -> None:
        headers = raw(("Authorization", "Bearer sk-client"), ("Accept", "*/*"))
        out = upstream_headers(headers, upstream(), strip_authorization=False)
        assert out == [("authorization", "Bearer sk-client"), ("accept", "*/*")]

    def test_upstream_key_replaces_client_authorization(self) -> None:
        headers = raw(("Authorization", "Bearer sk-client"), ("Accept", "*/*"))
        out = upstream_headers(headers, upstream(api_key="sk-upstream"), strip_authorization=False)
        assert ("authorization", "Bearer sk-upstream") in out
        assert [v for k, v in out if k == "authorization"] == ["Bearer sk-upstream"]
        assert "sk-client" not in repr(out)

    def test_upstream_key_added_when_client_sent_none(self) -> None:
        out = upstream_headers(
            raw(("Accept", "*/*")), upstream(api_key="k"), strip_authorization=False
        )
        assert out == [("accept", "*/*"), ("authorization", "Bearer k")]

    def test_proxy_key_stripped_when_client_authenticated_to_proxy(self) -> None:
        headers = raw(
            ("Authorization", "Bearer proxy-key"), ("X-Api-Key", "proxy-key"), ("Accept", "*/*")
        )
        out = upstream_headers(headers, upstream(), strip_authorization=True)
        assert out == [("accept", "*/*")]

    def test_proxy_key_replaced_by_upstream_key(self) -> None:
        headers = raw(("Authorization", "Bearer proxy-key"))
        out = upstream_headers(headers, upstream(api_key="sk-up"), strip_authorization=True)
        assert out == [("authorization", "Bearer sk-up")]

    def test_header_names_case_insensitive(self) -> None:
        headers = raw(("AUTHORIZATION", "Bearer x"), ("hOsT", "h"), ("x-COMPACTION", "force"))
        out = upstream_headers(headers, upstream(api_key="k"), strip_authorization=False)
        assert out == [("authorization", "Bearer k")]


class TestResponseHeaders:
    def test_drops_hop_by_hop_server_date_length(self) -> None:
        headers = httpx.Headers(
            [
                ("Content-Type", "application/json"),
                ("Content-Length", "10"),
                ("Server", "cloudflare"),
                ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
                ("Connection", "keep-alive"),
                ("Keep-Alive", "timeout=5"),
                ("Transfer-Encoding", "chunked"),
                ("x-request-id", "req_1"),
                ("openai-processing-ms", "12"),
            ]
        )
        assert response_headers(headers) == [
            (b"content-type", b"application/json"),
            (b"x-upstream-request-id", b"req_1"),
            (b"openai-processing-ms", b"12"),
        ]

    def test_drops_connection_listed(self) -> None:
        headers = httpx.Headers([("Connection", "X-Hop"), ("X-Hop", "1"), ("X-Keep", "2")])
        assert response_headers(headers) == [(b"x-keep", b"2")]

    def test_keeps_repeated_headers(self) -> None:
        headers = httpx.Headers([("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")])
        assert response_headers(headers) == [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]


# --- client construction -------------------------------------------------------------------------


async def test_make_transport_picks_the_configured_implementation() -> None:
    aio = make_transport(ServerSettings(upstream_transport="aiohttp"))
    plain = make_transport(ServerSettings(upstream_transport="httpx"))
    try:
        assert isinstance(aio, AiohttpUpstream)
        assert isinstance(plain, HttpxUpstream)
        assert plain.client.follow_redirects is False
        assert plain.client.timeout == httpx.Timeout(None)
    finally:
        await aio.aclose()
        await plain.aclose()


async def test_plain_httpx_client_adds_no_headers_and_keeps_no_cookies() -> None:
    client = plain_httpx_client(ServerSettings())
    try:
        assert "accept-encoding" not in client.headers
        assert "user-agent" not in client.headers
        response = httpx.Response(200, headers={"set-cookie": "s=secret; Path=/"})
        response.request = httpx.Request("GET", "https://upstream.test/v1/models")
        client.cookies.extract_cookies(response)
        assert len(client.cookies.jar) == 0
    finally:
        await client.aclose()


# --- error classification -------------------------------------------------------------------------
#
# Each case drives a real httpx.AsyncClient so the exception is the one the proxy would see.
# httpx transport: respx where the top-level class decides (respx replaces the raised
# exception's __cause__), and a fake httpcore network backend where the cause decides (DNS,
# refused), so httpcore's own OSError mapping builds the chain. aiohttp transport: a fake
# aiohttp session raising aiohttp's exception, mapped by httpx_aiohttp's real
# map_aiohttp_exceptions; the chains match what a loopback run produced.

UP = upstream()


async def failure_via_respx(side_effect: Any) -> UpstreamFailure:
    with respx.mock(using="httpx") as mock:
        mock.post(URL).mock(side_effect=side_effect)
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport()) as client:
            with pytest.raises(httpx.HTTPError) as info:
                await client.post(URL, content=b"{}")
    return classify_error(info.value, UP)


class _FailingBackend:
    """httpcore network backend whose connect fails with `error`, mapped as AnyIO maps it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
        with map_exceptions(
            {TimeoutError: httpcore.ConnectTimeout, OSError: httpcore.ConnectError}
        ):
            raise self.error

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - retries are off
        await asyncio.sleep(seconds)


async def failure_via_httpx_transport(error: BaseException) -> UpstreamFailure:
    transport = httpx.AsyncHTTPTransport()
    transport._pool._network_backend = _FailingBackend(error)  # type: ignore[assignment]
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.HTTPError) as info:
            await client.post(URL, content=b"{}")
    return classify_error(info.value, UP)


class _FakeSession:
    """Stands in for aiohttp.ClientSession: `request(...)` fails as aiohttp's would."""

    closed = False

    def __init__(self, error: BaseException, cause: BaseException | None) -> None:
        self.error, self.cause = error, cause

    async def request(self, *args: Any, **kwargs: Any) -> None:
        if self.cause is None:
            raise self.error
        raise self.error from self.cause


async def failure_via_aiohttp(
    error: BaseException, cause: BaseException | None = None
) -> tuple[UpstreamFailure, BaseException]:
    transport = AiohttpUpstream(ServerSettings())
    transport._session = _FakeSession(error, cause)  # type: ignore[assignment]
    with pytest.raises(TRANSPORT_ERRORS) as info:
        await transport.send(UpstreamRequest("POST", URL, [], b"{}"), UP.timeouts)
    return classify_error(info.value, UP), info.value


def connection_key() -> ConnectionKey:
    return ConnectionKey("upstream.test", 80, False, True, None, None, None, "upstream.test")


def refused() -> ConnectionRefusedError:
    return ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")


def dns() -> socket.gaierror:
    return socket.gaierror(-2, "Name or service not known")


class TestClassifyHttpxTransport:
    async def test_connection_refused(self) -> None:
        failure = await failure_via_httpx_transport(refused())
        assert (failure.status, failure.code) == (502, "upstream_unreachable")
        assert "refused" in failure.message

    async def test_dns(self) -> None:
        failure = await failure_via_httpx_transport(dns())
        assert (failure.status, failure.code) == (502, "upstream_dns_error")
        assert "DNS" in failure.message

    async def test_connect_timeout_from_backend(self) -> None:
        failure = await failure_via_httpx_transport(TimeoutError())
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert failure.message.endswith("timed out while connecting")

    async def test_connect_error_without_cause(self) -> None:
        failure = await failure_via_respx(httpx.ConnectError("All connection attempts failed"))
        assert (failure.status, failure.code) == (502, "upstream_unreachable")

    async def test_connect_timeout(self) -> None:
        failure = await failure_via_respx(httpx.ConnectTimeout)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "while connecting" in failure.message

    async def test_read_timeout(self) -> None:
        failure = await failure_via_respx(httpx.ReadTimeout)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "waiting for the response" in failure.message

    async def test_pool_timeout(self) -> None:
        failure = await failure_via_respx(httpx.PoolTimeout)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "waiting for a free connection" in failure.message

    async def test_write_timeout(self) -> None:
        failure = await failure_via_respx(httpx.WriteTimeout)
        assert failure.status == 504
        assert "sending the request" in failure.message

    async def test_remote_protocol_error(self) -> None:
        failure = await failure_via_respx(
            httpx.RemoteProtocolError("Server disconnected without sending a response.")
        )
        assert (failure.status, failure.code) == (502, "upstream_protocol_error")

    async def test_read_error_reset(self) -> None:
        failure = await failure_via_respx(httpx.ReadError("Connection reset by peer"))
        assert failure.status == 502

    def test_message_names_upstream(self) -> None:
        failure = classify_error(httpx.ConnectTimeout("x"), UP)
        assert failure.message.startswith("upstream 'up' (http://up.test/v1)")

    def test_unknown_error(self) -> None:
        failure = classify_error(httpx.DecodingError("bad gzip"), UP)
        assert (failure.status, failure.code) == (502, "upstream_error")
        assert "DecodingError" in failure.message


class TestClassifyAiohttpTransport:
    async def test_connection_refused(self) -> None:
        error = aiohttp.ClientConnectorError(connection_key(), refused())
        failure, raised = await failure_via_aiohttp(error, refused())
        assert isinstance(raised, aiohttp.ClientConnectorError)
        assert (failure.status, failure.code) == (502, "upstream_unreachable")
        assert "refused" in failure.message

    async def test_dns(self) -> None:
        error = aiohttp.ClientConnectorDNSError(connection_key(), dns())
        failure, raised = await failure_via_aiohttp(error, dns())
        assert isinstance(raised, aiohttp.ClientConnectorDNSError)
        assert (failure.status, failure.code) == (502, "upstream_dns_error")

    async def test_read_timeout(self) -> None:
        error = aiohttp.SocketTimeoutError("Timeout on reading data from socket")
        failure, raised = await failure_via_aiohttp(error)
        assert isinstance(raised, UpstreamTimeout) and raised.phase == "read"
        assert isinstance(raised.__cause__, aiohttp.SocketTimeoutError)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "waiting for the response (timeouts.read: 600 s)" in failure.message

    async def test_connect_timeout(self) -> None:
        error = aiohttp.ConnectionTimeoutError("Connection timeout to host http://upstream.test")
        failure, raised = await failure_via_aiohttp(error)
        assert isinstance(raised, UpstreamTimeout) and raised.phase == "connect"
        assert isinstance(raised.__cause__, aiohttp.ConnectionTimeoutError)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "while connecting (timeouts.connect: 10 s)" in failure.message

    async def test_pool_timeout(self) -> None:
        # Waiting for a free connection is the transport's own semaphore, with its own timeout
        # (end to end: tests/reliability/test_upstream_timeouts.py).
        transport = AiohttpUpstream(ServerSettings(max_connections=1))
        timeouts = Timeouts(pool=0.01)
        held = await transport._slot(timeouts.pool)
        with pytest.raises(UpstreamTimeout) as info:
            await transport.send(UpstreamRequest("POST", URL, [], b"{}"), timeouts)
        held.release()
        failure = classify_error(info.value, UP)
        assert (failure.status, failure.code) == (504, "upstream_timeout")
        assert "waiting for a free connection (timeouts.pool: 0.01 s)" in failure.message

    async def test_server_disconnected(self) -> None:
        failure, raised = await failure_via_aiohttp(aiohttp.ServerDisconnectedError())
        assert isinstance(raised, aiohttp.ServerDisconnectedError)
        assert (failure.status, failure.code) == (502, "upstream_protocol_error")

    async def test_connection_reset_is_not_a_timeout(self) -> None:
        reset = ConnectionResetError(104, "Connection reset by peer")
        error = aiohttp.ClientOSError(104, "Connection reset by peer")
        failure, raised = await failure_via_aiohttp(error, reset)
        assert isinstance(raised, aiohttp.ClientOSError)
        assert failure.status == 502
        assert failure.code == "upstream_unreachable"

    async def test_payload_error(self) -> None:
        failure, raised = await failure_via_aiohttp(
            aiohttp.ClientPayloadError("Response payload is not completed")
        )
        assert isinstance(raised, aiohttp.ClientPayloadError)
        assert failure.status == 502


# Hand-built chains, in the exact shape of the ones observed on loopback (see module comment).


def chained(*excs: BaseException) -> BaseException:
    """excs[0] raised from excs[1] raised from excs[2] ..."""
    for outer, inner in itertools.pairwise(excs):
        outer.__cause__ = inner
    return excs[0]


@pytest.mark.parametrize(
    ("make", "status", "code"),
    [
        # httpx transport
        (
            lambda: chained(
                httpx.ConnectError("All connection attempts failed"),
                httpcore.ConnectError("All connection attempts failed"),
                OSError("All connection attempts failed"),
                refused(),
            ),
            502,
            "upstream_unreachable",
        ),
        (
            lambda: chained(httpx.ConnectError("dns"), httpcore.ConnectError("dns"), dns()),
            502,
            "upstream_dns_error",
        ),
        (
            lambda: chained(httpx.ReadTimeout(""), httpcore.ReadTimeout(""), TimeoutError()),
            504,
            "upstream_timeout",
        ),
        (lambda: chained(httpx.PoolTimeout(""), httpcore.PoolTimeout("")), 504, "upstream_timeout"),
        (
            lambda: chained(httpx.RemoteProtocolError("x"), httpcore.RemoteProtocolError("x")),
            502,
            "upstream_protocol_error",
        ),
        # aiohttp transport (raised directly)
        (
            lambda: aiohttp.ClientConnectorError(connection_key(), refused()),
            502,
            "upstream_unreachable",
        ),
        (
            lambda: aiohttp.ClientConnectorDNSError(connection_key(), dns()),
            502,
            "upstream_dns_error",
        ),
        (lambda: aiohttp.SocketTimeoutError("t"), 504, "upstream_timeout"),
        (lambda: aiohttp.ConnectionTimeoutError("t"), 504, "upstream_timeout"),
        (lambda: aiohttp.ServerDisconnectedError(), 502, "upstream_protocol_error"),
        (
            lambda: chained(
                aiohttp.ClientOSError(104, "reset"), ConnectionResetError(104, "reset")
            ),
            502,
            "upstream_unreachable",
        ),
        # a bare asyncio timeout (e.g. from a wait_for around the call)
        (lambda: TimeoutError(), 504, "upstream_timeout"),
    ],
)
def test_classify_chains(make: Callable[[], BaseException], status: int, code: str) -> None:
    failure = classify_error(make(), UP)
    assert (failure.status, failure.code) == (status, code)


def test_chain_via_context_and_cycles() -> None:
    inner = refused()
    outer = httpx.ConnectError("x")
    outer.__context__ = inner
    inner.__context__ = outer  # a cycle must not hang
    assert classify_error(outer, UP).code == "upstream_unreachable"


def _walk(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def test_upstream_request_id_is_renamed_so_the_client_sees_one_id() -> None:
    from compaction_proxy.upstream import response_headers as rh

    out = rh(httpx.Headers([("X-Request-Id", "req_up"), ("content-type", "application/json")]))
    assert (b"x-upstream-request-id", b"req_up") in out
    assert not any(name == b"x-request-id" for name, _ in out)


def test_x_api_key_passes_through_unless_it_was_the_proxys_own() -> None:
    up = upstream()
    raw = [(b"x-api-key", b"client-gateway-key"), (b"content-type", b"application/json")]
    assert ("x-api-key", "client-gateway-key") in upstream_headers(
        raw, up, strip_authorization=False
    )
    assert all(
        name != "x-api-key" for name, _ in upstream_headers(raw, up, strip_authorization=True)
    )


def test_an_upstream_with_its_own_key_sees_only_that_key_whatever_the_format() -> None:
    """A caller's key in any header some API takes one in goes nowhere when the operator's key
    is sent: a Claude Code user's x-api-key on a chat path, a Bearer on Anthropic's."""
    raw = [
        (b"x-api-key", b"sk-ant-caller"),
        (b"authorization", b"Bearer sk-caller"),
        (b"anthropic-version", b"2023-06-01"),
    ]
    chat = upstream_headers(raw, upstream(api_key="sk-operator"), strip_authorization=False)
    assert [(n, v) for n, v in chat if n in ("x-api-key", "authorization")] == [
        ("authorization", "Bearer sk-operator")
    ]
    assert ("anthropic-version", "2023-06-01") in chat
    anthropic = upstream_headers(
        raw, upstream(api_key="sk-operator"), strip_authorization=False, auth=MESSAGES.auth
    )
    assert [(n, v) for n, v in anthropic if n in ("x-api-key", "authorization")] == [
        ("x-api-key", "sk-operator")
    ]


def test_a_path_below_a_formats_api_is_keyed_the_way_that_api_is() -> None:
    assert registry.under("/v1/messages/batches") is MESSAGES
    assert registry.under("/v1/messages/count_tokens") is MESSAGES
    assert registry.under("/v1/responses/resp_1/input_items") is registry.under("/v1/responses")
    assert registry.under("/v1/messagesx") is None
    assert registry.under("/v1/models") is None
