"""Dry runs and the summarizer: `dry-run` may call it, `dry-run-local` and `dryRun: skip` never.

Real processes: the proxy under `serve`, the fake upstream (which also plays the summarizer and
records every request), the official `openai` SDK as the client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from tests.fakes.upstream import is_summarizer_call
from tests.support.assertions import CHAT_PATH
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

MODEL = "agent-4k"


def dry_run_config(upstream: UpstreamServer, **summarization: Any) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": 4_000, "max_output_tokens": 500}},
        summarization={"maxSummaryTokens": 300, "timeout": 20, **summarization},
        store={"backend": "memory"},
    )


@pytest.fixture(scope="module")
def dry_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(dry_run_config(fake_upstream))
    return proxy


@pytest.fixture(scope="module")
def skip_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    proxy: ProxyServer = module_proxy_factory(dry_run_config(fake_upstream, dryRun="skip"))
    return proxy


@pytest.fixture
def client(dry_proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    with dry_proxy.openai_client() as sdk:
        yield sdk


def conversation(tag: str) -> list[dict[str, Any]]:
    """Over the 4k window's trigger: summarization has old turns to fold."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(12):
        messages.append({"role": "user", "content": f"{tag} step {turn} " + "detail " * 400})
        messages.append({"role": "assistant", "content": f"Done with step {turn}."})
    messages.append({"role": "user", "content": f"{tag}: what is next?"})
    return messages


def dry_run(sdk: openai.OpenAI, header: str, tag: str) -> Any:
    messages = conversation(tag)
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, extra_headers={"X-Compaction": header}
    )
    raw.parse()  # the upstream's answer to the original request
    return raw


def forwarded_originals(upstream: UpstreamServer, tag: str) -> list[dict[str, Any]]:
    bodies = [r.json() for r in upstream.requests(CHAT_PATH)]
    return [b for b in bodies if not is_summarizer_call(b) and b["messages"] == conversation(tag)]


def summarizer_calls(upstream: UpstreamServer) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests(CHAT_PATH) if is_summarizer_call(r.json())]


def test_dry_run_calls_the_summarizer(client: openai.OpenAI, upstream: UpstreamServer) -> None:
    raw = dry_run(client, "dry-run", "paid")
    assert raw.headers["x-compaction-dry-run"] == "true"
    assert "summarization" in raw.headers["x-compaction-strategies"]
    assert summarizer_calls(upstream), "a dry run computes the real summary (a paid call)"
    assert len(forwarded_originals(upstream, "paid")) == 1  # the original went upstream as sent


def test_dry_run_local_makes_no_summarizer_call(
    client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    raw = dry_run(client, "dry-run-local", "local")
    assert summarizer_calls(upstream) == []
    assert len(upstream.requests(CHAT_PATH)) == 1  # only the original, forwarded as sent
    assert len(forwarded_originals(upstream, "local")) == 1
    assert raw.headers["x-compaction-dry-run"] == "true"
    assert "summarization" not in raw.headers["x-compaction-strategies"]
    before = int(raw.headers["x-compaction-tokens-before"])
    after = int(raw.headers["x-compaction-tokens-after"])
    assert after < before  # later strategies stand in for the summary
    warnings = raw.headers.get_list("x-compaction-warning")
    assert any("summarizer not called" in w for w in warnings), warnings


def test_dry_run_skip_in_the_config_keeps_every_dry_run_local(
    skip_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    with skip_proxy.openai_client() as sdk:
        raw = dry_run(sdk, "dry-run", "skipped")
    assert summarizer_calls(upstream) == []
    assert len(forwarded_originals(upstream, "skipped")) == 1
    assert raw.headers["x-compaction-dry-run"] == "true"
    warnings = raw.headers.get_list("x-compaction-warning")
    assert any("summarizer not called" in w for w in warnings), warnings


def test_a_real_request_after_a_local_dry_run_still_summarizes(
    client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    dry_run(client, "dry-run-local", "then-real")
    upstream.clear()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation("then-real")
    )
    assert "summarization" in raw.headers["x-compaction-strategies"]
    assert summarizer_calls(upstream)


def test_an_unknown_mode_names_dry_run_local(dry_proxy: ProxyServer) -> None:
    with dry_proxy.http_client() as http:
        response = http.post(
            CHAT_PATH,
            content=orjson.dumps({"model": MODEL, "messages": conversation("bad")}),
            headers={"X-Compaction": "dry-run-offline", "Content-Type": "application/json"},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "X-Compaction"
    assert "dry-run-local" in error["message"]


def test_the_preview_honours_dry_run_local(
    dry_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    body = orjson.dumps({"model": MODEL, "messages": conversation("preview")})
    headers = {"Content-Type": "application/json"}
    with dry_proxy.http_client() as http:
        local = http.post(
            "/v1/compaction/preview",
            content=body,
            headers={**headers, "X-Compaction": "dry-run-local"},
        )
        assert local.status_code == 200, local.text
        assert upstream.requests() == []  # nothing at all reached the upstream
        payload = local.json()
        assert payload["changed"] is True
        assert len(payload["request"]["messages"]) < len(conversation("preview"))
        assert any("summarizer not called" in w for w in payload["warnings"])
        # Without the header the preview computes the real thing, summary included.
        full = http.post("/v1/compaction/preview", content=body, headers=headers)
    assert full.status_code == 200, full.text
    assert summarizer_calls(upstream)
    assert "summarization" in full.headers["x-compaction-strategies"]
