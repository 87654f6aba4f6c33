"""Recall in the metrics and in the dashboard's data, after requests with known figures.

The figures come from tests/observability/recall_requests.py; the browser test shows the same
session on the page (tests/observability/test_dashboard_browser.py).
"""

from __future__ import annotations

import json

import pytest

from compaction_proxy.config import Settings
from compaction_proxy.observability.recall import OUTCOMES, outcome_of
from compaction_proxy.observability.telemetry import Telemetry
from tests.observability.recall_requests import SESSION, Figures, Request, feed
from tests.observability.traffic import parse_metrics, value

RECALL_FAMILIES = (
    "compaction_proxy_recall_requests_total",
    "compaction_proxy_recall_rounds_total",
    "compaction_proxy_recall_calls_total",
    "compaction_proxy_recall_tokens_total",
    "compaction_proxy_recall_seconds_count",
    "compaction_proxy_archived_messages_total",
)


@pytest.mark.parametrize(
    ("figures", "outcome"),
    [
        (Figures(), "unused"),
        (Figures(rounds=1, calls=1), "answered"),
        (Figures(rounds=1, calls=1, deferred=1), "answered"),  # a round came first
        (Figures(deferred=2), "deferred"),
        (Figures(rounds=3, calls=2, limited=True), "limit"),
        (Figures(rounds=1, calls=1, unavailable=True, limited=True), "unavailable"),
    ],
)
def test_each_request_offered_the_tool_has_one_outcome(figures: Figures, outcome: str) -> None:
    assert outcome in OUTCOMES
    assert outcome_of(figures) == outcome


def test_the_recall_metrics_after_known_requests() -> None:
    telemetry = Telemetry(Settings())
    feed(telemetry)
    samples = parse_metrics(telemetry.exposition().decode())

    def chat(name: str, **labels: str) -> float:
        return value(samples, name, api="chat", **labels)

    outcomes = {o: chat("compaction_proxy_recall_requests_total", outcome=o) for o in OUTCOMES}
    assert outcomes == {"answered": 2, "limit": 1, "deferred": 1, "unavailable": 1, "unused": 1}
    assert chat("compaction_proxy_recall_rounds_total") == 2 + 1 + 4 + 1
    assert chat("compaction_proxy_recall_calls_total") == 3 + 1 + 3 + 1
    assert chat("compaction_proxy_recall_tokens_total") == 1_200 + 300 + 4_000
    # One observation per request with a hidden round: its time in them.
    assert chat("compaction_proxy_recall_seconds_count") == 4
    assert chat("compaction_proxy_recall_seconds_sum") == pytest.approx(0.8 + 0.2 + 2.5 + 0.05)
    assert chat("compaction_proxy_recall_seconds_bucket", le="1.0") == 3  # 0.8, 0.2, 0.05
    assert chat("compaction_proxy_archived_messages_total") == 4 + 3

    def responses(name: str, **labels: str) -> float:
        return value(samples, name, api="responses", **labels)

    assert responses("compaction_proxy_recall_requests_total", outcome="answered") == 1
    assert responses("compaction_proxy_recall_rounds_total") == 1
    assert responses("compaction_proxy_recall_calls_total") == 2
    assert responses("compaction_proxy_recall_tokens_total") == 700
    assert responses("compaction_proxy_archived_messages_total") == 2

    # The outcomes add up to the requests offered the tool; nothing else has an api label
    # (the /v1/models request's figures were not counted).
    offered = [r for r in SESSION if r.recall is not None and r.path != "/v1/models"]
    assert sum(samples["compaction_proxy_recall_requests_total"].values()) == len(offered)
    for family in RECALL_FAMILIES:
        apis = {dict(labels)["api"] for labels in samples.get(family, {})}
        assert apis <= {"chat", "responses"}, family


def test_requests_without_recall_count_nothing() -> None:
    telemetry = Telemetry(Settings())
    feed(telemetry, (Request(request_id="a"), Request(request_id="b", path="/v1/responses")))
    text = telemetry.exposition().decode()
    samples = parse_metrics(text)
    for family in RECALL_FAMILIES:
        assert not samples.get(family), family
    # The families are declared all the same, so a scraper knows them before the first recall.
    for name in ("recall_requests_total", "recall_seconds", "archived_messages_total"):
        assert f"# TYPE compaction_proxy_{name} " in text


def test_the_dashboard_data_has_the_recall_panel_and_each_rows_rounds() -> None:
    telemetry = Telemetry(Settings(), clock=lambda: 1_800_000_000.0)
    feed(telemetry)
    data = telemetry.snapshot()
    assert data["recall"] == {
        "offered": 7,
        "recalled": 5,
        "outcomes": {"answered": 3, "limit": 1, "deferred": 1, "unavailable": 1, "unused": 1},
        "rounds": 2 + 1 + 4 + 1 + 1,
        "calls": 3 + 1 + 3 + 1 + 2,
        "ids": 5 + 1 + 6 + 0 + 2,
        "tokens": 1_200 + 300 + 4_000 + 700,
        "deferred": 2 + 1,
        "unavailable": 1,
        "seconds": round(0.8 + 0.2 + 2.5 + 0.05 + 0.4, 3),
        "archived": 4 + 3 + 2,
    }
    rows = {row["id"]: row for row in data["recent"]}
    assert "recall" not in rows["plain"] and "archived" not in rows["plain"]
    assert "recall" not in rows["archived-only"] and rows["archived-only"]["archived"] == 4
    assert rows["answered-then-deferred"]["recall"] == {
        "outcome": "answered",
        "rounds": 1,
        "calls": 1,
        "ids": 1,
        "tokens": 300,
        "deferred": 2,
        "unavailable": False,
        "ms": 200.0,
    }
    assert rows["limit"]["recall"]["outcome"] == "limit"
    assert rows["unused"]["recall"]["rounds"] == 0
    assert "recall" not in rows["models"]  # a pass-through: its figures are not read
    json.dumps(data)


def test_the_recall_figures_are_frozen_when_recorded() -> None:
    # The loop's stats object is mutable: the dashboard keeps a copy, not the object.
    class Live:
        rounds, calls, ids, tokens, deferred = 1, 1, 1, 10, 0
        unavailable = limited = False
        seconds = 0.1

    live = Live()
    telemetry = Telemetry(Settings())
    telemetry.record_request(Request(recall=live), "POST", "/v1/chat/completions")
    live.rounds = 50
    assert telemetry.snapshot()["recent"][0]["recall"]["rounds"] == 1
    assert telemetry.snapshot()["recall"]["rounds"] == 1
