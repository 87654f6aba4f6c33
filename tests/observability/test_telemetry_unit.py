"""The pieces of observability on their own: usage probe, prices, label cap, reconciliation.

The usage probe lives beside the forwarder (compaction_proxy/upstream/_usage.py); the rest in
compaction_proxy/observability/.
"""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import orjson
import pytest

from compaction_proxy.api import Finished
from compaction_proxy.compaction.chat_messages import last_user_text
from compaction_proxy.compaction.report import CompactionReport, StrategyFailure, StrategyReport
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryError, SummaryRequest
from compaction_proxy.config import Settings, UpstreamSettings
from compaction_proxy.observability.dashboard import RecentRow
from compaction_proxy.observability.labels import LabelCap, route_of
from compaction_proxy.observability.outcomes import final_outcomes
from compaction_proxy.observability.prices import Prices
from compaction_proxy.observability.telemetry import Telemetry
from compaction_proxy.summarizer import (
    HttpSummarizer,
    SummarizerStats,
    SummaryCallRecord,
    SummaryCalls,
)
from compaction_proxy.upstream import HttpxUpstream, UsageProbe
from tests.observability.traffic import parse_metrics, value

# ------------------------------------------------------------------ usage probe


def _feed(probe: UsageProbe, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        probe.feed(data[i : i + size])


def test_probe_reads_json_usage() -> None:
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1234, "completion_tokens": 5}})
    probe = UsageProbe.start("application/json", None, str(len(body)))
    assert probe is not None
    _feed(probe, body, 7)
    assert probe.prompt_tokens() == 1234


def test_probe_skips_unreadable_encodings_large_and_other_bodies() -> None:
    # gzip and deflate are read (tests/observability/test_usage_probe_compressed.py).
    assert UsageProbe.start("application/json", "br", None) is None
    assert UsageProbe.start("text/event-stream", "zstd", None) is None
    assert UsageProbe.start("application/json", "gzip, br", None) is None
    assert UsageProbe.start("application/json", None, str(2 << 20)) is None
    assert UsageProbe.start("text/plain", None, None) is None
    probe = UsageProbe.start("application/json; charset=utf-8", "identity", None)
    assert probe is not None
    probe.feed(b"x" * ((1 << 20) + 1))  # undeclared length over the limit: given up
    assert probe.prompt_tokens() is None


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_probe_reads_the_usage_chunk_of_a_long_stream() -> None:
    content = [{"choices": [{"delta": {"content": "word " * 50}}], "usage": None}] * 200
    usage = {"choices": [], "usage": {"prompt_tokens": 777, "completion_tokens": 3}}
    stream = _sse(*content, usage)
    assert len(stream) > 40_000
    for size in (1, 13, 4096, 10_000):
        probe = UsageProbe.start("text/event-stream; charset=utf-8", None, None)
        assert probe is not None
        _feed(probe, stream, size)
        assert probe.prompt_tokens() == 777, size


def test_probe_stream_without_usage_and_content_that_mentions_usage() -> None:
    tricky = {"choices": [{"delta": {"content": 'he said "usage": {"prompt_tokens": 9}'}}]}
    probe = UsageProbe.start("text/event-stream", None, None)
    assert probe is not None
    probe.feed(_sse(tricky, {"choices": [], "usage": None}))
    assert probe.prompt_tokens() is None


def test_probe_usage_event_that_began_before_the_tail() -> None:
    big = {"choices": [], "pad": "p" * 6000, "usage": {"prompt_tokens": 42}}
    probe = UsageProbe.start("text/event-stream", None, None)
    assert probe is not None
    _feed(probe, _sse(big), 100)
    assert probe.prompt_tokens() == 42


# ------------------------------------------------------------------ labels, prices, content


def test_label_cap() -> None:
    cap = LabelCap(limit=2)
    assert [cap("a"), cap("b"), cap("c"), cap("a"), cap(None)] == [
        "a",
        "b",
        "other",
        "a",
        "unknown",
    ]
    assert LabelCap()("x" * 500) == "other"
    assert LabelCap()("bad\nname") == "other"


def test_routes() -> None:
    assert route_of("POST", "/v1/chat/completions") == "chat_completions"
    assert route_of("GET", "/v1/chat/completions") == "passthrough"
    assert route_of("POST", "/v1/compaction/preview") == "preview"
    assert route_of("GET", "/v1/files/abc") == "passthrough"
    assert route_of("GET", "/dashboard") == "other"


def test_prices_defaults_and_configured_globs() -> None:
    prices = Prices({"gpt-4o*": 1.0, "my-model": 3.0})
    assert prices.per_million("gpt-4o-mini") == 1.0  # configured beats the defaults
    assert prices.per_million("my-model") == 3.0
    assert prices.per_million("openai/my-model") == 3.0
    defaults = Prices()
    assert defaults.per_million("gpt-4o-mini-2024-07-18") == 0.15  # longest glob wins
    assert defaults.per_million("gpt-4o-2024-08-06") == 2.50
    assert defaults.per_million("gpt-4.1-nano") == 0.10
    assert defaults.per_million("unknown-model") is None
    assert defaults.usd("gpt-4o", 1_000_000) == pytest.approx(2.5)


def test_last_user_text_is_truncated() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": [{"type": "text", "text": "y" * 1000}]},
    ]
    text = last_user_text(messages)
    assert text is not None and len(text) == 500 and text.startswith("yyy")
    assert last_user_text([{"role": "system", "content": "s"}]) is None


def test_negative_prices_are_rejected() -> None:
    with pytest.raises(ValueError):
        Settings.model_validate({"dashboard": {"prices": {"gpt-4o": -1}}})


# ------------------------------------------------------------------ reconciliation


def _report(*failures: str, changed: tuple[str, ...] = ()) -> CompactionReport:
    strategies = tuple(StrategyReport(name, True, True, 100, 50) for name in changed) + tuple(
        StrategyReport("summarization", True, False, 100, 100, failed=f) for f in failures
    )
    return CompactionReport(
        model="gpt-4o",
        mode="normal",
        tokenizer="o200k_base",
        context_window=1000,
        output_reserve=0,
        safety_reserve=0,
        budget=1000,
        calibration=1.0,
        tokens_before=2_000_000,
        tokens_after=1_000_000,
        messages_before=10,
        messages_after=5,
        strategies=strategies,
    )


def _ctx(
    telemetry: Telemetry,
    report: CompactionReport,
    calls: list[str],
    *,
    checkpoint: str = "none",
    prompt_tokens: int | None = None,
) -> Finished:
    # Telemetry reads only the finished request's own fields: the edge is not built.
    return Finished(
        request_id="r1",
        elapsed_ms=1.0,
        status=200,
        model="gpt-4o",
        upstream="openai",
        report=report,
        checkpoint=checkpoint,
        summarizer_calls=SummaryCalls(calls),
        compaction_seconds=0.01,
        upstream_prompt_tokens=prompt_tokens,
    )


@pytest.mark.parametrize(
    ("calls", "failures", "expected"),
    [
        (["ok"], (), {"ok": 1}),
        (["timeout"], ("timeout",), {"timeout": 1}),  # one call, reported once
        ([], ("backoff",), {"backoff": 1}),  # no call was made
        (["ok"], ("not_shorter",), {"not_shorter": 1}),  # the ok call's summary was refused
        (["ok", "ok", "error"], ("error",), {"ok": 2, "error": 1}),
    ],
)
def test_summarizer_outcomes_are_reconciled_with_the_report(
    calls: list[str], failures: tuple[str, ...], expected: dict[str, int]
) -> None:
    telemetry = Telemetry(Settings())
    telemetry.record_request(
        _ctx(telemetry, _report(*failures), calls), "POST", "/v1/chat/completions"
    )
    samples = parse_metrics(telemetry.exposition().decode())
    got = {
        dict(k)["outcome"]: v
        for k, v in samples.get("compaction_proxy_summarizer_calls_total", {}).items()
    }
    assert got == expected
    assert value(samples, "compaction_proxy_summarizer_failures_total") == sum(
        n for o, n in expected.items() if o != "ok"
    )


def test_money_saved_and_snapshot_shape() -> None:
    telemetry = Telemetry(Settings(), clock=lambda: 1_800_000_000.0)
    ctx = _ctx(telemetry, _report(changed=("truncation",)), [])
    telemetry.record_request(ctx, "POST", "/v1/chat/completions")
    data = telemetry.snapshot()
    assert data["totals"]["tokens_saved"] == 1_000_000
    assert data["totals"]["usd_saved"] == pytest.approx(2.5)  # gpt-4o at $2.50 / 1M
    assert data["strategies"] == {"truncation": 1}
    assert data["recent"][0]["model"] == "gpt-4o"
    assert "content" not in data["recent"][0]
    assert len(data["minutes"]) == 60 and data["minutes"][-1]["requests"] == 1
    assert data["requests_last_minute"] == 1
    json.dumps(data)  # plain JSON


def test_registries_are_per_app() -> None:
    a, b = Telemetry(Settings()), Telemetry(Settings())
    ctx = _ctx(a, _report(), [])
    a.record_request(ctx, "POST", "/v1/chat/completions")
    assert b"compaction_proxy_requests_total{" not in b.exposition()
    assert b'route="chat_completions"' in a.exposition()


def test_a_broken_request_context_never_raises() -> None:
    telemetry = Telemetry(Settings())
    telemetry.record_request(object(), "GET", "/v1/models")  # type: ignore[arg-type]


def test_final_outcomes_on_their_own() -> None:
    def failures(*reasons: str) -> list[StrategyFailure]:
        return [StrategyFailure("summarization", r, "") for r in reasons]

    assert final_outcomes(["ok", "ok"], failures("not_shorter")) == ["ok", "not_shorter"]
    assert final_outcomes(["error"], failures("error", "backoff")) == ["error", "backoff"]
    assert final_outcomes([], ()) == []


def _summary_totals(telemetry: Telemetry) -> dict[str, float]:
    samples = parse_metrics(telemetry.exposition().decode())
    return {
        dict(k)["outcome"]: v
        for k, v in samples.get("compaction_proxy_summarizer_calls_total", {}).items()
    }


def test_calls_a_request_keeps_wait_for_it_others_count_at_once() -> None:
    telemetry = Telemetry(Settings())
    stats = SummarizerStats()
    telemetry.watch_summarizer(stats)
    stats.record(SummaryCallRecord("openai", "m", "timeout", 0.2))  # no request keeps it
    stats.record(SummaryCallRecord("openai", "m", "ok", 0.3, per_request=True))
    assert _summary_totals(telemetry) == {"timeout": 1}
    samples = parse_metrics(telemetry.exposition().decode())
    assert value(samples, "compaction_proxy_summarizer_latency_seconds_count") == 2
    telemetry.record_request(_ctx(telemetry, _report(), ["ok"]), "POST", "/v1/chat/completions")
    assert _summary_totals(telemetry) == {"timeout": 1, "ok": 1}
    assert telemetry.snapshot()["summarizer"]["outcomes"] == {"timeout": 1, "ok": 1}


async def test_a_bound_summarizer_logs_its_calls_on_the_request() -> None:
    replies = iter([200, 503, 200])

    def answer(request: httpx.Request) -> httpx.Response:
        status = next(replies)
        if status != 200:
            return httpx.Response(status, stream=httpx.ByteStream(b""))
        message = {"role": "assistant", "content": "## Goal\nX"}
        body = orjson.dumps({"choices": [{"message": message}]})
        return httpx.Response(200, stream=httpx.ByteStream(body))  # read as a transport reads

    upstream = UpstreamSettings.model_validate(
        {"name": "openai", "base_url": "https://api.openai.test/v1", "models": ["gpt-*"]}
    )
    records: list[SummaryCallRecord] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        shared = HttpSummarizer(
            SummarizationSettings.model_validate({}), [upstream], HttpxUpstream(client)
        )
        shared.stats.listeners.append(records.append)
        calls = SummaryCalls()
        bound = shared.bind(caller_key=None, calls=calls)
        request = SummaryRequest(({"role": "user", "content": "fix it"},), None, "gpt-4o")
        await bound.summarize(request)
        with pytest.raises(SummaryError):
            await bound.summarize(request)
        await shared.summarize(request)  # not bound to a request: nothing logged
    assert calls.outcomes == ["ok", "error"]
    assert [(r.outcome, r.per_request) for r in records] == [
        ("ok", True),
        ("error", True),
        ("ok", False),
    ]


def test_recent_row_as_json() -> None:
    row = RecentRow(
        "r1", 1.0, "GET", "/v1/models", "passthrough", None, "openai", 200, 12.345,
        0.0123456, None, False, 0, 0, None, (), "none", [], None, None,
    )  # fmt: skip
    assert row.to_json() == {
        "id": "r1",
        "t": 1.0,
        "method": "GET",
        "path": "/v1/models",
        "route": "passthrough",
        "model": None,
        "upstream": "openai",
        "status": 200,
        "latency_ms": 12.3,
        "upstream_ms": 12.3,
        "compaction_ms": None,
        "tokens_before": None,
        "tokens_after": None,
        "usd_saved": None,
        "strategies": [],
        "checkpoint": None,
        "summarizer_failures": [],
        "upstream_prompt_tokens": None,
        "dry_run": False,
    }
    row.content = "hi"
    assert row.to_json()["content"] == "hi"


def test_cached_summarizer_tokens_reach_metrics_and_dashboard() -> None:
    telemetry = Telemetry(Settings())
    stats = SummarizerStats()
    telemetry.watch_summarizer(stats)
    stats.record(SummaryCallRecord("openai", "m", "ok", 0.3, cached_tokens=1200, form="prefix"))
    stats.record(SummaryCallRecord("openai", "m", "ok", 0.2))
    samples = parse_metrics(telemetry.exposition().decode())
    assert value(samples, "compaction_proxy_summarizer_cached_tokens_total") == 1200
    summarizer = telemetry.snapshot()["summarizer"]
    assert summarizer["cached_tokens"] == 1200
    assert summarizer["prefix_calls"] == 1 and summarizer["calls"] == 2
    assert stats.total_cached_tokens() == 1200 and stats.forms == {"prefix": 1, "transcript": 1}


# ------------------------------------------------------------------ hits and dry runs


def _hit_report() -> CompactionReport:
    """What the flow reports on a checkpoint hit (compaction_proxy/engine/_hit_report.py): the
    client sent 110,000 tokens, the checkpoint view was 1,008, and nothing else ran."""
    step = StrategyReport("checkpoint", True, True, 110_000, 1_008, messages_affected=400)
    idle = StrategyReport("summarization", False, False, 1_008, 1_008, skipped="trigger")
    return replace(_report(), tokens_before=110_000, tokens_after=1_008, strategies=(step, idle))


def test_a_checkpoint_hit_counts_as_a_compaction_and_a_saving() -> None:
    telemetry = Telemetry(Settings(), clock=lambda: 1_800_000_000.0)
    ctx = _ctx(telemetry, _hit_report(), [], checkpoint="hit")
    telemetry.record_request(ctx, "POST", "/v1/chat/completions")
    samples = parse_metrics(telemetry.exposition().decode())
    assert value(samples, "compaction_proxy_tokens_saved_total") == 108_992
    assert value(samples, "compaction_proxy_strategy_runs_total", strategy="checkpoint") == 1
    assert value(samples, "compaction_proxy_checkpoint_lookups_total", result="hit") == 1
    data = telemetry.snapshot()
    totals = data["totals"]
    assert totals["compacted"] == 1 and totals["tokens_saved"] == 108_992
    assert totals["usd_saved"] == pytest.approx(108_992 * 2.5 / 1e6)  # gpt-4o
    assert data["strategies"] == {"checkpoint": 1}
    row = data["recent"][0]
    assert row["tokens_before"] == 110_000 and row["tokens_after"] == 1_008
    assert row["strategies"] == ["checkpoint"] and row["dry_run"] is False


def test_a_dry_run_is_marked_and_saves_nothing() -> None:
    telemetry = Telemetry(Settings(), clock=lambda: 1_800_000_000.0)
    dry = replace(_report(changed=("truncation",)), mode="dry-run")
    telemetry.record_request(_ctx(telemetry, dry, []), "POST", "/v1/chat/completions")
    real = _report(changed=("truncation",))
    telemetry.record_request(_ctx(telemetry, real, []), "POST", "/v1/chat/completions")
    samples = parse_metrics(telemetry.exposition().decode())
    assert value(samples, "compaction_proxy_tokens_saved_total") == 1_000_000  # the real one
    assert value(samples, "compaction_proxy_strategy_runs_total", strategy="truncation") == 1
    data = telemetry.snapshot()
    totals = data["totals"]
    assert totals["tokens_saved"] == 1_000_000 and totals["compacted"] == 1
    assert totals["dry_runs"] == 1 and totals["dry_run_would_save"] == 1_000_000
    assert totals["usd_saved"] == pytest.approx(2.5)
    dry_row, real_row = data["recent"][1], data["recent"][0]
    assert dry_row["dry_run"] is True and dry_row["dry_run_after"] == 1_000_000
    assert dry_row["tokens_before"] == dry_row["tokens_after"] == 2_000_000  # forwarded as is
    assert dry_row["strategies"] == [] and dry_row["usd_saved"] is None
    assert real_row["dry_run"] is False and "dry_run_after" not in real_row


def test_the_calibration_column_is_weighted_by_tokens() -> None:
    """A 100k-token request at 1.5 and a 10-token one at 0.7: the column says ~1.5, not 1.1."""
    telemetry = Telemetry(Settings())
    big = replace(_report(), tokens_before=100_000, tokens_after=100_000, strategies=())
    small = replace(_report(), tokens_before=10, tokens_after=10, strategies=())
    for report, usage in ((big, 150_000), (small, 7)):
        ctx = _ctx(telemetry, report, [], prompt_tokens=usage)
        telemetry.record_request(ctx, "POST", "/v1/chat/completions")
    (model,) = telemetry.snapshot()["models"]
    assert model["calibration"] == pytest.approx(150_007 / 100_010, abs=1e-4)


def test_a_summary_made_and_not_forwarded_counts_as_discarded() -> None:
    """A summary paid for and then dropped is reported as such, never as ``ok``."""
    from dataclasses import replace

    telemetry = Telemetry(Settings())
    lost = StrategyFailure("summarization", "discarded", "a summary of 90 tokens was not sent")
    report = replace(_report(changed=("summarization", "fallback_truncation")), unforwarded=(lost,))
    assert report.changed_by == ("fallback_truncation",)
    telemetry.record_request(_ctx(telemetry, report, ["ok"]), "POST", "/v1/chat/completions")
    assert _summary_totals(telemetry) == {"discarded": 1}
    data = telemetry.snapshot()
    assert data["strategies"] == {"fallback_truncation": 1}
    assert data["recent"][0]["summarizer_failures"] == ["discarded"]
    assert data["summarizer"]["recent_failures"][0]["reason"] == "discarded"
