"""Credentials: which key reaches the upstream, inbound proxy keys, and keys never logged."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.assertions import CHAT_PATH, assert_openai_error
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

USER: list[Any] = [{"role": "user", "content": "hello"}]
CHAT = {"model": "gpt-4o", "messages": USER}

CLIENT_KEY = "sk-client-4c1e9b7d2a"
UPSTREAM_KEY = "sk-upstream-8f2d6a0c3e"
INBOUND_KEYS = ["pk-inbound-one-5b7e1f", "pk-inbound-two-9d3c4a"]
ALL_SECRETS = [CLIENT_KEY, UPSTREAM_KEY, *INBOUND_KEYS]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", CHAT_PATH, CHAT), ("GET", "/v1/models", None), ("POST", "/v1/files", {"a": 1})],
)
def test_client_authorization_passes_through(
    proxy: ProxyServer,
    upstream: UpstreamServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    with proxy.http_client() as client:
        response = client.request(
            method, path, json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
        )
    assert response.status_code == 200
    assert upstream.last_request(path).headers["authorization"] == f"Bearer {CLIENT_KEY}"


def test_sdk_key_passes_through(proxy: ProxyServer, upstream: UpstreamServer) -> None:
    client = proxy.openai_client(api_key=CLIENT_KEY)
    client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert upstream.last_request(CHAT_PATH).headers["authorization"] == f"Bearer {CLIENT_KEY}"


@pytest.fixture(scope="module")
def keyed_upstream_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(upstream_entry(fake_upstream, api_key=UPSTREAM_KEY))
    # An upstream key anyone could spend must be meant (`allow_anonymous_spend`): these tests
    # are about which key reaches the upstream, not who may send.
    config["server"]["allow_anonymous_spend"] = True
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", CHAT_PATH, CHAT), ("GET", "/v1/models", None), ("POST", "/v1/files", {"a": 1})],
)
def test_upstream_key_replaces_client_key(
    keyed_upstream_proxy: ProxyServer,
    upstream: UpstreamServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    with keyed_upstream_proxy.http_client() as client:
        response = client.request(
            method, path, json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
        )
    assert response.status_code == 200
    recorded = upstream.last_request(path)
    assert recorded.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert [v for k, v in recorded.raw_headers if k.lower() == "authorization"] == [
        f"Bearer {UPSTREAM_KEY}"
    ]
    assert CLIENT_KEY not in str(recorded.raw_headers)


def test_upstream_key_used_when_client_sends_none(
    keyed_upstream_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    with keyed_upstream_proxy.http_client() as client:
        assert client.post(CHAT_PATH, json=CHAT).status_code == 200
    assert upstream.last_request(CHAT_PATH).headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


@pytest.fixture(scope="module")
def locked_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(
        proxy_config(upstream_entry(fake_upstream, api_key=UPSTREAM_KEY), api_keys=INBOUND_KEYS)
    )
    return proxy


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer pk-wrong"},
        {"Authorization": f"Bearer {INBOUND_KEYS[0]}x"},
        {"Authorization": f"Bearer {INBOUND_KEYS[0][:-1]}"},
        {"Authorization": f"Basic {INBOUND_KEYS[0]}"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "longer", "prefix", "basic", "empty"],
)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", CHAT_PATH, CHAT), ("GET", "/v1/models", None)],
    ids=["chat", "models"],
)
def test_inbound_keys_reject_missing_or_wrong(
    locked_proxy: ProxyServer,
    upstream: UpstreamServer,
    headers: dict[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    with locked_proxy.http_client() as client:
        response = client.request(method, path, json=body, headers=headers)
    assert_openai_error(response, 401)
    assert response.headers.get("x-request-id")
    assert upstream.requests() == []


@pytest.mark.parametrize("key", INBOUND_KEYS)
def test_inbound_keys_accept_each_configured_key(
    locked_proxy: ProxyServer, upstream: UpstreamServer, key: str
) -> None:
    client = locked_proxy.openai_client(api_key=key)
    completion = client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "echo: hello"
    assert [m.id for m in client.models.list()]
    for recorded in upstream.requests():
        # The proxy's own key stays at the proxy; the upstream gets its configured key.
        assert recorded.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert key not in str(recorded.raw_headers)


def test_inbound_auth_error_in_sdk(locked_proxy: ProxyServer) -> None:
    client = locked_proxy.openai_client(api_key="pk-not-a-proxy-key")
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert caught.value.status_code == 401


def test_inbound_keys_off_lets_anyone_through(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    assert proxy_http.post(CHAT_PATH, json=CHAT).status_code == 200
    assert "authorization" not in upstream.last_request(CHAT_PATH).headers


def test_keys_never_logged(
    proxy_factory: Any, upstream: UpstreamServer, dead_upstream_url: str
) -> None:
    proxy: ProxyServer = proxy_factory(
        proxy_config(
            upstream_entry(upstream, name="live", api_key=UPSTREAM_KEY, models=["gpt-*"]),
            upstream_entry(dead_upstream_url, name="dead", api_key=UPSTREAM_KEY, models=["x-*"]),
            api_keys=INBOUND_KEYS,
        )
    )
    good = {"Authorization": f"Bearer {INBOUND_KEYS[1]}"}
    with proxy.http_client() as client:
        requests = [
            ("POST", CHAT_PATH, CHAT, good),
            ("POST", CHAT_PATH, {**CHAT, "stream": True}, good),
            ("POST", CHAT_PATH, {**CHAT, "model": "x-dead"}, good),  # 502
            ("POST", CHAT_PATH, CHAT, {**good, "X-Fake-Status": "500"}),
            ("POST", CHAT_PATH, b"{broken", good),  # 400
            ("GET", "/v1/models", None, {"Authorization": f"Bearer {CLIENT_KEY}"}),  # 401
            ("GET", "/v1/models", None, {"X-Api-Key": CLIENT_KEY}),  # 401
            ("GET", "/v1/models?key=1", None, good),
        ]
        statuses = []
        for method, path, body, headers in requests:
            if isinstance(body, bytes):
                response = client.request(method, path, content=body, headers=headers)
            else:
                response = client.request(method, path, json=body, headers=headers)
            statuses.append(response.status_code)
    assert statuses == [200, 200, 502, 500, 400, 401, 401, 200]
    log = proxy.log_text()
    for secret in ALL_SECRETS:
        assert secret not in log, f"{secret!r} appears in the proxy's output"
    proxy.stop()  # shutdown messages too
    log = proxy.log_text()
    for secret in ALL_SECRETS:
        assert secret not in log, f"{secret!r} appears in the proxy's output"


def test_inbound_key_not_forwarded_without_upstream_key(
    proxy_factory: Any, upstream: UpstreamServer
) -> None:
    # `keyless: true`: an upstream that needs no key is allowed behind inbound keys.
    keyless = {**upstream_entry(upstream), "keyless": True}
    proxy: ProxyServer = proxy_factory(proxy_config(keyless, api_keys=INBOUND_KEYS))
    with proxy.http_client() as client:
        assert_openai_error(client.post(CHAT_PATH, json=CHAT), 401)
        ok = client.post(
            CHAT_PATH, json=CHAT, headers={"Authorization": f"Bearer {INBOUND_KEYS[0]}"}
        )
    assert ok.status_code == 200
    recorded = upstream.last_request(CHAT_PATH)
    assert INBOUND_KEYS[0] not in str(recorded.raw_headers)


def test_query_string_secrets_never_logged(proxy: ProxyServer, upstream: UpstreamServer) -> None:
    """Some OpenAI-compatible providers take the key in the query (Azure's api-key, ?key=)."""
    secret = "qs-secret-6e1b0d94c2"
    offset = proxy.log_size()
    with proxy.http_client() as client:
        client.get(f"/v1/models?api-key={secret}").raise_for_status()
        client.post(f"/v1/chat/completions?key={secret}", json=CHAT).raise_for_status()
    assert upstream.last_request(CHAT_PATH).query == f"key={secret}"
    assert secret not in proxy.log_text(offset)
