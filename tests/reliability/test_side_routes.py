"""The routes beside /v1 (the probes, /metrics, /dashboard): behind `server.api_keys` they
need a key like the API does, a scraper gets in with a key that opens nothing else, the probes
keep answering orchestrators without a secret and reveal nothing without one, and a path or
method nobody serves is answered in OpenAI's error shape. Real proxies under `serve`; raw
sockets, so what arrives is exactly what the proxy wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.reliability.rawhttp import RawResponse, get, send_raw
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

PROXY_KEY = "pk-side-routes-71d0c4"
SCRAPE_KEY = "mk-prometheus-scrape-0b53"
UPSTREAM_KEY = "sk-upstream-side-9f14"
SECRETS = (PROXY_KEY, SCRAPE_KEY, UPSTREAM_KEY)


@pytest.fixture(scope="module")
def locked(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    """`server.api_keys` alone."""
    config = proxy_config(upstream_entry(fake_upstream, api_key=UPSTREAM_KEY), api_keys=[PROXY_KEY])
    server: ProxyServer = module_proxy_factory(config)
    return server


@pytest.fixture(scope="module")
def scraped(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    """`server.api_keys` and a scraper's own `server.metrics_keys`."""
    config = proxy_config(upstream_entry(fake_upstream, api_key=UPSTREAM_KEY), api_keys=[PROXY_KEY])
    config["server"]["metrics_keys"] = [SCRAPE_KEY]
    server: ProxyServer = module_proxy_factory(config)
    return server


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_openai_error(response: RawResponse | None, status: int) -> dict[str, Any]:
    assert response is not None, "the proxy closed without an answer"
    assert response.status == status, (response.status, response.body[:300])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert b"Traceback" not in response.body and b"detail" not in response.body
    return error


def assert_no_secret(response: RawResponse | None) -> None:
    assert response is not None
    raw = response.body + str(response.headers).encode()
    for secret in SECRETS:
        assert secret.encode() not in raw


# --------------------------------------------------------------------------- item 5


@pytest.mark.parametrize("path", ["/metrics", "/dashboard/data", "/nope", "/"])
def test_side_routes_need_a_key_behind_api_keys(locked: ProxyServer, path: str) -> None:
    for headers in ({}, _bearer("pk-wrong"), {"X-Api-Key": "pk-wrong"}):
        refused = get(locked.port, path, headers)
        error = assert_openai_error(refused, 401)
        assert error["code"] == "invalid_api_key"
        assert refused is not None and refused.headers["www-authenticate"] == "Bearer"
        assert_no_secret(refused)


def test_the_scraper_gets_metrics_with_its_own_key_and_nothing_else(scraped: ProxyServer) -> None:
    locked = scraped
    for headers in (_bearer(SCRAPE_KEY), _bearer(PROXY_KEY), {"X-Api-Key": SCRAPE_KEY}):
        scraped = get(locked.port, "/metrics", headers)
        assert scraped is not None and scraped.status == 200, scraped
        assert b"compaction_proxy_requests_total" in scraped.body
        assert_no_secret(scraped)
    # The scrape key spends nothing and shows no dashboard.
    chat = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer " + SCRAPE_KEY.encode() + b"\r\n"
        b"Content-Length: " + str(len(chat)).encode() + b"\r\n\r\n" + chat
    )
    assert_openai_error(send_raw(locked.port, request), 401)
    assert_openai_error(get(locked.port, "/dashboard/data", _bearer(SCRAPE_KEY)), 401)
    assert get(locked.port, "/dashboard", _bearer(SCRAPE_KEY)).status == 401  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_answer_without_a_key_with_their_status_only(locked: ProxyServer, path: str) -> None:
    bare = get(locked.port, path)
    assert bare is not None and bare.status == 200, bare
    assert bare.json() == {"status": "ok"}
    keyed = get(locked.port, path, _bearer(PROXY_KEY))
    assert keyed is not None and keyed.status == 200
    if path == "/readyz":
        detail = keyed.json()
        assert isinstance(detail, dict) and detail["status"] == "ok"
        assert detail["checks"]["upstream_client"] == "ok"
    assert_no_secret(bare)


def test_the_scrape_key_shows_the_readiness_checks(scraped: ProxyServer) -> None:
    assert get(scraped.port, "/readyz").json() == {"status": "ok"}  # type: ignore[union-attr]
    detail = get(scraped.port, "/readyz", _bearer(SCRAPE_KEY))
    assert detail is not None and "checks" in detail.json()  # type: ignore[operator]


def test_without_keys_every_side_route_stays_open(proxy: ProxyServer) -> None:
    metrics = get(proxy.port, "/metrics")
    assert metrics is not None and metrics.status == 200
    ready = get(proxy.port, "/readyz")
    assert ready is not None and "checks" in ready.json()  # type: ignore[operator]


# --------------------------------------------------------------------------- item 6


@pytest.mark.parametrize("path", ["/nope", "/", "/v1", "/favicon.ico", "/dashboard/nope"])
def test_an_unknown_path_is_a_404_in_openai_shape(proxy: ProxyServer, path: str) -> None:
    error = assert_openai_error(get(proxy.port, path), 404)
    assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
    assert path in error["message"]


def test_behind_keys_an_unknown_path_is_a_404_once_the_key_is_right(locked: ProxyServer) -> None:
    error = assert_openai_error(get(locked.port, "/nope", _bearer(PROXY_KEY)), 404)
    assert error["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("POST", "/healthz", "GET"), ("DELETE", "/metrics", "GET"), ("PUT", "/readyz", "GET")],
)
def test_a_wrong_method_on_a_side_route_is_a_405_in_openai_shape(
    proxy: ProxyServer, method: str, path: str, allowed: str
) -> None:
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    response = send_raw(proxy.port, request)
    error = assert_openai_error(response, 405)
    assert error["code"] == "method_not_allowed"
    assert response is not None and allowed in response.headers["allow"]
