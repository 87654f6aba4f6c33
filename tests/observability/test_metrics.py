"""GET /metrics after known traffic through the real proxy: the counters equal that traffic.

One proxy and one fake upstream for the module; the traffic runs once (chat requests small and
large, streamed and not, an upstream error, pass-through calls, a compaction that stores a
checkpoint and one that reuses it, a summarizer that fails and then backs off) and each test
checks one family against what the client saw in the response headers and bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.observability.traffic import (
    AGENT_MODEL,
    MODELS_CONFIG,
    Traffic,
    agent_conversation,
    parse_metrics,
    summarizer_calls,
    value,
)
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

UPSTREAM = "fake-a"
UPSTREAM_KEY = "sk-upstream-secret-7Qx"
CLIENT_TEXT = "TURQUOISE-WALRUS-5521"


class Run:
    def __init__(self, traffic: Traffic, summaries: dict[str, int], metrics_text: str) -> None:
        self.traffic = traffic
        self.summaries = summaries
        self.text = metrics_text
        self.samples = parse_metrics(metrics_text)


@pytest.fixture(scope="module")
def obs_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module()


@pytest.fixture(scope="module")
def obs_proxy(module_proxy_factory: Any, obs_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(
        upstream_entry(obs_upstream, name=UPSTREAM, api_key=UPSTREAM_KEY), models=MODELS_CONFIG
    )
    # An upstream key without inbound keys must be meant (`allow_anonymous_spend`, checked at
    # start-up by the preflight); the metrics are read without a key, as they are then.
    config["server"]["allow_anonymous_spend"] = True
    return module_proxy_factory(config)


@pytest.fixture(scope="module")
def run(obs_proxy: ProxyServer, obs_upstream: UpstreamServer) -> Iterator[Run]:
    obs_upstream.reset()
    with obs_proxy.http_client() as client:
        traffic = Traffic(client)
        # Small chats: compaction runs, changes nothing, no checkpoint.
        for n in range(3):
            sent = traffic.chat(
                [{"role": "user", "content": f"{CLIENT_TEXT} hello {n}"}], model="gpt-4o-mini"
            )
            assert sent.status == 200 and sent.checkpoint == "none"
        assert traffic.chat([{"role": "user", "content": "stream"}], stream=True).status == 200
        # Compaction off: no report, still a chat request.
        off = traffic.chat([{"role": "user", "content": "raw"}], headers={"X-Compaction": "off"})
        assert off.before is None
        # An upstream error passes through with its status.
        limited = traffic.chat([{"role": "user", "content": "x"}], headers={"X-Fake-Status": "429"})
        assert limited.status == 429
        # Pass-through.
        assert traffic.passthrough("GET", "/v1/models").status == 200
        assert traffic.passthrough("GET", "/v1/models").status == 200
        embed = {"model": "text-embedding-3-small", "input": "hi"}
        assert traffic.passthrough("POST", "/v1/embeddings", json=embed).status == 200

        # A long agent conversation: summarized and stored, then the next turn reuses it.
        new = traffic.chat(agent_conversation(20))
        assert new.checkpoint == "new" and "summarization" in new.strategies, new.headers
        hit = traffic.chat(agent_conversation(21))
        assert hit.checkpoint == "hit", hit.headers
        hit_stream = traffic.chat(agent_conversation(21), stream=True)
        assert hit_stream.checkpoint == "hit"
        ok_calls = summarizer_calls(obs_upstream.requests())

        # The summarizer fails for another conversation; its retry backs off without a call.
        obs_upstream.control(summarizer="error")
        failed = traffic.chat(agent_conversation(20, topic="lexer"))
        assert failed.status == 200 and failed.checkpoint == "none"
        backoff = traffic.chat(agent_conversation(20, topic="lexer"))
        assert backoff.status == 200
        error_calls = summarizer_calls(obs_upstream.requests()) - ok_calls
        obs_upstream.reset()

        text = client.get("/metrics").text
    yield Run(traffic, {"ok": ok_calls, "error": error_calls}, text)


def test_metrics_is_prometheus_text_with_its_own_content_type(obs_proxy: ProxyServer) -> None:
    with obs_proxy.http_client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {f for f in parse_metrics(response.text)}
    assert "compaction_proxy_build_info" in families


def test_requests_by_route_and_status(run: Run) -> None:
    expected = run.traffic.requests_by_route_status()
    assert expected[("chat_completions", "200")] == 10
    assert expected[("chat_completions", "429")] == 1
    assert expected[("passthrough", "200")] == 3
    for (route, status), count in expected.items():
        got = value(run.samples, "compaction_proxy_requests_total", route=route, status=status)
        assert got == count, (route, status)


def test_upstream_latency_counts_every_forwarded_request(run: Run) -> None:
    count = value(run.samples, "compaction_proxy_upstream_latency_seconds_count", upstream=UPSTREAM)
    assert count == len(run.traffic.sent)
    assert (
        value(run.samples, "compaction_proxy_upstream_latency_seconds_sum", upstream=UPSTREAM) > 0
    )


def test_compaction_time_and_tokens(run: Run) -> None:
    reported = run.traffic.reported()
    assert len(reported) == len(run.traffic.chats()) - 1  # all but X-Compaction: off
    s = run.samples
    assert value(s, "compaction_proxy_compaction_seconds_count") == len(reported)
    assert value(s, "compaction_proxy_prompt_tokens_before_count") == len(reported)
    assert value(s, "compaction_proxy_prompt_tokens_before_sum") == sum(r.before for r in reported)
    assert value(s, "compaction_proxy_prompt_tokens_after_sum") == sum(r.after for r in reported)
    saved = run.traffic.tokens_saved()
    assert saved > 0
    assert value(s, "compaction_proxy_tokens_saved_total") == saved
    # Token buckets reach ~2M.
    buckets = [labels for labels in s["compaction_proxy_prompt_tokens_before_bucket"]]
    assert (("le", "2e+06"),) in buckets


def test_strategies_and_checkpoints(run: Run) -> None:
    runs = run.traffic.strategy_runs()
    assert runs["summarization"] >= 1
    for name, count in runs.items():
        assert value(run.samples, "compaction_proxy_strategy_runs_total", strategy=name) == count
    strategies = {dict(k)["strategy"] for k in run.samples["compaction_proxy_strategy_runs_total"]}
    assert strategies == set(runs)
    checkpoints = run.traffic.checkpoints()
    assert checkpoints["new"] == 1 and checkpoints["hit"] == 2
    for result in ("hit", "new", "none"):
        got = value(run.samples, "compaction_proxy_checkpoint_lookups_total", result=result)
        assert got == checkpoints[result], result


def test_summarizer_calls_failures_and_backoff(run: Run) -> None:
    s = run.samples
    assert run.summaries["ok"] >= 1 and run.summaries["error"] == 1
    assert value(s, "compaction_proxy_summarizer_calls_total", outcome="ok") == run.summaries["ok"]
    assert value(s, "compaction_proxy_summarizer_calls_total", outcome="error") == 1
    assert value(s, "compaction_proxy_summarizer_calls_total", outcome="backoff") == 1
    assert value(s, "compaction_proxy_summarizer_failures_total") == 2
    # Latency is per HTTP call: a backoff makes none.
    http_calls = run.summaries["ok"] + run.summaries["error"]
    assert value(s, "compaction_proxy_summarizer_latency_seconds_count") == http_calls


def test_calibration_ratio_from_the_upstream_usage(run: Run) -> None:
    """usage.prompt_tokens (JSON and streamed) over the proxy's count of what it forwarded."""
    observed = [r for r in run.traffic.reported() if r.status == 200]
    assert all(r.prompt_tokens for r in observed)
    count = sum(
        v
        for labels, v in run.samples["compaction_proxy_token_count_calibration_ratio_count"].items()
    )
    total = sum(
        v for labels, v in run.samples["compaction_proxy_token_count_calibration_ratio_sum"].items()
    )
    assert count == len(observed)
    assert total == pytest.approx(sum(r.prompt_tokens / r.after for r in observed))  # type: ignore[operator]
    models = {
        dict(k)["model"]
        for k in run.samples["compaction_proxy_token_count_calibration_ratio_count"]
    }
    assert models == {AGENT_MODEL, "gpt-4o-mini"}
    # The fake upstream counts like OpenAI; the proxy's count is within a few percent.
    for r in observed:
        assert 0.9 < r.prompt_tokens / r.after < 1.3  # type: ignore[operator]


def test_tokenizer_fallback_is_exported(run: Run) -> None:
    assert value(run.samples, "compaction_proxy_tokenizer_fallback_total") == 0


def test_no_key_and_no_content_in_metrics(run: Run) -> None:
    assert UPSTREAM_KEY not in run.text
    assert "sk-" not in run.text
    assert CLIENT_TEXT not in run.text
    assert "FACT-" not in run.text


def test_model_labels_are_capped(obs_proxy: ProxyServer, obs_upstream: UpstreamServer) -> None:
    """A client inventing model names cannot grow the label set past the cap."""
    with obs_proxy.http_client() as client:
        for n in range(105):
            client.post(
                "/v1/chat/completions",
                json={"model": f"made-up-{n}", "messages": [{"role": "user", "content": "hi"}]},
            )
        samples = parse_metrics(client.get("/metrics").text)
    models = {
        dict(k)["model"] for k in samples["compaction_proxy_token_count_calibration_ratio_count"]
    }
    assert "other" in models
    assert len(models) <= 101


def test_label_cardinality_is_bounded_for_paths(obs_proxy: ProxyServer) -> None:
    with obs_proxy.http_client() as client:
        for n in range(5):
            client.get(f"/v1/files/file-{n}")
        client.get("/nowhere")
        samples = parse_metrics(client.get("/metrics").text)
    routes = {dict(k)["route"] for k in samples["compaction_proxy_requests_total"]}
    assert routes <= {"chat_completions", "preview", "passthrough", "other"}
    assert not any("file-" in name for k in samples.values() for labels in k for _, name in labels)
