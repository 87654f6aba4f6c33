"""Checkpoint hits and dry runs as the client, /metrics and the dashboard see them.

Real processes: the proxy under ``serve``, the fake upstream (which also summarizes), SQLite
checkpoints. The reference count of a request is the preview of the same body by another
tenant (another key: another checkpoint namespace, so no hit and no checkpoint view), i.e.
what the proxy reports for the client's whole request when no checkpoint is involved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.observability.traffic import (
    AGENT_MODEL,
    CHAT,
    MODELS_CONFIG,
    Sent,
    Traffic,
    agent_conversation,
    parse_metrics,
    value,
)
from tests.support.agent_session import is_summarizer_text
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

CLIENT = {"Authorization": "Bearer sk-client-honest"}
OTHER_TENANT = {"Authorization": "Bearer sk-someone-else"}


class Session:
    def __init__(self, traffic: Traffic, reference: dict[int, int]) -> None:
        self.traffic = traffic
        self.reference = reference  # steps -> the client's whole request, by our count
        self.new: Sent = traffic.sent[0]
        self.hits: list[Sent] = [s for s in traffic.sent if s.checkpoint == "hit" and not s.dry_run]
        self.dry: Sent = next(s for s in traffic.sent if s.dry_run)


@pytest.fixture(scope="module")
def honest_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module()


@pytest.fixture(scope="module")
def honest_proxy(module_proxy_factory: Any, honest_upstream: UpstreamServer) -> ProxyServer:
    config = proxy_config(upstream_entry(honest_upstream), models=MODELS_CONFIG)
    return module_proxy_factory(config)


def _reference(proxy: ProxyServer, steps: int) -> int:
    body = {"model": AGENT_MODEL, "messages": agent_conversation(steps)}
    with proxy.http_client(headers=OTHER_TENANT) as client:
        response = client.post("/v1/compaction/preview", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["checkpoint"] != "hit"
    tokens = response.json()["report"]["tokens_before"]
    assert isinstance(tokens, int)
    return tokens


@pytest.fixture(scope="module")
def session(honest_proxy: ProxyServer, honest_upstream: UpstreamServer) -> Iterator[Session]:
    honest_upstream.reset()
    with honest_proxy.http_client(headers=CLIENT) as client:
        traffic = Traffic(client)
        new = traffic.chat(agent_conversation(20))
        assert new.checkpoint == "new" and "summarization" in new.strategies, new.headers
        for steps in (21, 22, 23):
            assert traffic.chat(agent_conversation(steps)).checkpoint == "hit"
        honest_upstream.clear()
        dry = traffic.chat(agent_conversation(24), headers={"X-Compaction": "dry-run"})
        assert dry.status == 200 and dry.dry_run
        forwarded = honest_upstream.requests(CHAT)
    # A dry run forwards the client's own messages, checkpoint or not.
    chats = [r for r in forwarded if not is_summarizer_text(r.text)]
    assert orjson.loads(chats[-1].body)["messages"] == agent_conversation(24)
    reference = {steps: _reference(honest_proxy, steps) for steps in range(20, 25)}
    yield Session(traffic, reference)


def test_a_hit_reports_what_the_client_sent(session: Session) -> None:
    assert len(session.hits) == 3
    for steps, hit in zip((21, 22, 23), session.hits, strict=True):
        assert hit.before == session.reference[steps], steps
        assert hit.after is not None and hit.after < hit.before / 2  # type: ignore[operator]
        assert hit.strategies[0] == "checkpoint", hit.headers
    # The request that made the checkpoint reported the same way.
    assert session.new.before == session.reference[20]


def test_a_dry_run_on_a_hit_reports_the_whole_request(session: Session) -> None:
    dry = session.dry
    assert dry.checkpoint == "hit"
    assert dry.before == session.reference[24]
    assert dry.after is not None and dry.after < dry.before  # type: ignore[operator]


def test_metrics_count_hits_as_savings_and_dry_runs_as_none(
    session: Session, honest_proxy: ProxyServer
) -> None:
    with honest_proxy.http_client() as client:
        samples = parse_metrics(client.get("/metrics").text)
    real = [s for s in session.traffic.sent if not s.dry_run]
    saved = sum(s.before - s.after for s in real)  # type: ignore[operator]
    hit_savings = sum(s.before - s.after for s in session.hits)  # type: ignore[operator]
    assert hit_savings > session.new.before  # type: ignore[operator]
    assert value(samples, "compaction_proxy_tokens_saved_total") == saved
    assert value(samples, "compaction_proxy_strategy_runs_total", strategy="checkpoint") == 3
    befores = [s.before or 0 for s in session.traffic.sent]
    assert value(samples, "compaction_proxy_prompt_tokens_before_sum") == sum(befores)


def test_the_dashboard_counts_hits_and_sets_dry_runs_apart(
    session: Session, honest_proxy: ProxyServer
) -> None:
    with honest_proxy.http_client() as client:
        data = client.get("/dashboard/data").json()
    totals = data["totals"]
    real = [s for s in session.traffic.sent if not s.dry_run]
    assert totals["compacted"] == len(real) == 4  # the new one and three hits
    assert totals["tokens_saved"] == sum(s.before - s.after for s in real)  # type: ignore[operator]
    assert totals["usd_saved"] == 0 and totals["unpriced_tokens_saved"] == totals["tokens_saved"]
    assert totals["dry_runs"] == 1
    dry = session.dry
    assert totals["dry_run_would_save"] == dry.before - dry.after  # type: ignore[operator]
    assert data["strategies"]["checkpoint"] == 3
    chats = [r for r in data["recent"] if r["route"] == "chat_completions"]
    dry_row = chats[0]
    assert dry_row["dry_run"] is True and dry_row["dry_run_after"] == dry.after
    assert dry_row["tokens_before"] == dry_row["tokens_after"] == dry.before
    assert dry_row["strategies"] == []
    assert all(r["dry_run"] is False for r in chats[1:])
    assert [r["tokens_before"] for r in chats[1:4]] == [s.before for s in session.hits[::-1]]
