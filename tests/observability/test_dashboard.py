"""/dashboard and /dashboard/data over HTTP: keys, secrets, content, the data's numbers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.observability.traffic import MODELS_CONFIG, Traffic, agent_conversation
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

PROXY_KEY = "cp-proxy-key-Zr81kq"
UPSTREAM_KEY = "sk-upstream-secret-Lm42"
SECRET_TEXT = "MAGENTA-OCELOT-9034"


@pytest.fixture(scope="module")
def dash_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module()


@pytest.fixture(scope="module")
def keyed_proxy(module_proxy_factory: Any, dash_upstream: UpstreamServer) -> ProxyServer:
    """Inbound keys, an upstream key, content hidden (the default)."""
    config = proxy_config(
        upstream_entry(dash_upstream, api_key=UPSTREAM_KEY),
        api_keys=[PROXY_KEY],
        models=MODELS_CONFIG,
    )
    return module_proxy_factory(config)


@pytest.fixture(scope="module")
def content_proxy(module_proxy_factory: Any, dash_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(
        upstream_entry(dash_upstream), models=MODELS_CONFIG, dashboard={"show_content": True}
    )
    return module_proxy_factory(config)


def _bearer(key: str = PROXY_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_page_and_data_need_a_key(keyed_proxy: ProxyServer) -> None:
    with keyed_proxy.http_client() as client:
        assert client.get("/dashboard").status_code == 401
        assert client.get("/dashboard/data").status_code == 401
        assert client.get("/dashboard", headers=_bearer("wrong")).status_code == 401
        assert client.get("/dashboard?key=wrong").status_code == 401
        assert client.get("/dashboard/data", headers=_bearer("wrong")).status_code == 401
        # The page takes the key from the query (a browser), the data only from a header.
        assert client.get(f"/dashboard/data?key={PROXY_KEY}").status_code == 401
        page = client.get(f"/dashboard?key={PROXY_KEY}")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["referrer-policy"] == "no-referrer"
        assert page.headers["cache-control"] == "no-store"
        assert client.get("/dashboard", headers=_bearer()).status_code == 200
        assert client.get("/dashboard", headers={"X-Api-Key": PROXY_KEY}).status_code == 200
        data = client.get("/dashboard/data", headers=_bearer())
        assert data.status_code == 200 and data.json()["totals"]["requests"] >= 0
        unauthorized = client.get("/dashboard/data").json()
        assert unauthorized["error"]["code"] == "invalid_api_key"


def test_secrets_never_reach_the_page_the_data_or_the_log(
    keyed_proxy: ProxyServer, dash_upstream: UpstreamServer
) -> None:
    log_offset = keyed_proxy.log_size()
    with keyed_proxy.http_client(headers=_bearer()) as client:
        traffic = Traffic(client)
        assert traffic.chat([{"role": "user", "content": SECRET_TEXT}]).status == 200
        assert traffic.chat(agent_conversation(20)).checkpoint == "new"
        assert traffic.passthrough("GET", "/v1/models").status == 200
    # The upstream got its own key, not the proxy's.
    assert dash_upstream.last_request().headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    with keyed_proxy.http_client() as client:
        page = client.get(f"/dashboard?key={PROXY_KEY}").text
        data = client.get("/dashboard/data", headers=_bearer()).text
        metrics = client.get("/metrics").text
    for text in (page, data, metrics):
        assert PROXY_KEY not in text
        assert UPSTREAM_KEY not in text
        assert SECRET_TEXT not in text
        assert "FACT-" not in text
    log = keyed_proxy.log_text(log_offset)
    assert '"path":"/dashboard"' in log
    assert PROXY_KEY not in log and UPSTREAM_KEY not in log and "key=" not in log


def test_data_counts_the_traffic(content_proxy: ProxyServer) -> None:
    with content_proxy.http_client() as client:
        before = client.get("/dashboard/data").json()["totals"]
        traffic = Traffic(client)
        small = traffic.chat([{"role": "user", "content": "hi"}], model="gpt-4o-mini")
        big = traffic.chat(agent_conversation(20, topic="dashboard"))
        traffic.passthrough("GET", "/v1/models")
        data = client.get("/dashboard/data").json()
    totals = data["totals"]
    assert totals["requests"] - before["requests"] == 3
    assert totals["chat_requests"] - before["chat_requests"] == 2
    assert totals["api_requests"]["chat"] - before["api_requests"]["chat"] == 2
    assert set(totals["api_requests"]) == {"chat", "responses", "messages"}  # the registry's
    saved = sum(s.before - s.after for s in (small, big))  # type: ignore[operator]
    assert saved > 0
    assert totals["tokens_saved"] - before["tokens_saved"] == saved
    newest = data["recent"][0]
    assert newest["route"] == "passthrough" and newest["path"] == "/v1/models"
    row = data["recent"][1]
    assert row["model"] == "agent-model"
    assert row["tokens_before"] == big.before and row["tokens_after"] == big.after
    assert row["strategies"] == big.strategies and row["checkpoint"] == "new"
    assert row["status"] == 200 and row["latency_ms"] > 0
    assert data["checkpoints"]["new"] >= 1
    assert data["strategies"]["summarization"] >= 1
    assert data["summarizer"]["outcomes"]["ok"] >= 1


def test_show_content_true_shows_the_last_user_message(content_proxy: ProxyServer) -> None:
    with content_proxy.http_client() as client:
        Traffic(client).chat([{"role": "user", "content": f"please {SECRET_TEXT} " + "z" * 900}])
        data = client.get("/dashboard/data").json()
    assert data["show_content"] is True
    row = data["recent"][0]
    assert row["content"].startswith(f"please {SECRET_TEXT}")
    assert len(row["content"]) <= 500


def test_show_content_false_keeps_it_out(keyed_proxy: ProxyServer) -> None:
    with keyed_proxy.http_client(headers=_bearer()) as client:
        Traffic(client).chat([{"role": "user", "content": f"again {SECRET_TEXT}"}])
        data = client.get("/dashboard/data")
    assert data.json()["show_content"] is False
    assert "content" not in data.json()["recent"][0]
    assert SECRET_TEXT not in data.text


def test_dashboard_can_be_disabled(
    module_proxy_factory: Any, dash_upstream: UpstreamServer
) -> None:
    proxy = module_proxy_factory(
        proxy_config(upstream_entry(dash_upstream), dashboard={"enabled": False})
    )
    with proxy.http_client() as client:
        assert client.get("/dashboard").status_code == 404
        assert client.get("/dashboard/data").status_code == 404
        assert client.get("/metrics").status_code == 200
