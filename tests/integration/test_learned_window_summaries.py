"""Summaries on a small local model whose window the proxy learned from a refusal, through the
proxy's app in this process (tests/support/in_thread.py).

The fake upstream enforces a 4,096-token window and counts every prompt 1.63x the proxy's
count (``token_scale``: a tokenizer that is not OpenAI's). The proxy has no ``models:`` entry:
it learns the window from the upstream's first refusal and the ratio from ``usage``. Sized
with its own count, every summary call was refused, backed off and never tried smaller: all
the compactions of a session were truncations. Sized by the calibrated count, the summaries
are made; a call still refused (a summarizer model it knows nothing of yet) is made once more,
smaller, and succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agent_session import SessionReport, run_session
from tests.support.in_thread import InThreadProxy, InThreadServers
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry

WINDOW = 4_096
SCALE = 1.63
MODEL = "local-4k"
REQUESTS = 30


def _session(
    in_thread: InThreadServers, tmp_path: Path, **summarization: Any
) -> tuple[SessionReport, UpstreamControl, InThreadProxy]:
    upstream = in_thread.upstream(WINDOW)
    upstream.control(token_scale=SCALE, model_context_windows={"summ-3k": 3_072})
    config = proxy_config(
        upstream_entry(upstream),
        store={"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")},
        summarization={"enabled": True, "retainRecent": {"turns": 2}, **summarization},
    )
    proxy = in_thread.proxy(config)
    session = run_session(
        proxy.openai_client(),
        upstream,
        model=MODEL,
        requests=REQUESTS,
        tool_output_chars=300,
        turn_every=4,
    )
    return session, upstream, proxy


def _refused(upstream: UpstreamControl, *, summarizer: bool) -> list[dict[str, Any]]:
    return [
        e
        for e in upstream.events()
        if e["type"] == "refused" and bool(e.get("summarizer")) is summarizer
    ]


def _compactions(session: SessionReport) -> list[set[str]]:
    """The strategies of each response that compacted its request (checkpoint hits aside)."""
    return [
        set(step.strategies.split(","))
        for step in session.steps
        if step.checkpoint != "hit" and step.strategies not in ("", "none")
    ]


def test_summaries_are_made_on_a_window_learned_from_a_refusal(
    in_thread: InThreadServers, tmp_path: Path
) -> None:
    session, upstream, _ = _session(in_thread, tmp_path)
    # The window was learned from the upstream refusing a request, as a new user's would be.
    assert _refused(upstream, summarizer=False), "the window was never learned from a refusal"
    compactions = _compactions(session)
    assert len(compactions) >= 4, [s.strategies for s in session.steps]
    # Every compaction a summary, none a truncation in its place.
    assert all("summarization" in c for c in compactions), [s.strategies for s in session.steps]
    # Sized by the calibrated count for the learned window: no summary call is refused.
    assert _refused(upstream, summarizer=True) == []
    for step in session.steps:
        assert "failed" not in (step.warning or ""), (step.index, step.warning)
    assert all(step.prompt_tokens <= WINDOW for step in session.steps)
    assert any(step.checkpoint == "hit" for step in session.steps)


def test_a_refused_summary_call_is_retried_smaller_not_backed_off(
    in_thread: InThreadServers, tmp_path: Path
) -> None:
    # A summarizer model the proxy has never seen: no calibration, no window (3,072 at the
    # upstream). Its first call is refused; the refusal teaches both, and one smaller try
    # (the transcript cut into chunks that fit) makes the summary.
    session, upstream, proxy = _session(in_thread, tmp_path, model="summ-3k")
    refused = _refused(upstream, summarizer=True)
    assert len(refused) == 1, refused
    compactions = _compactions(session)
    assert compactions and all("summarization" in c for c in compactions), [
        (s.strategies, s.warning) for s in session.steps
    ]
    warnings = " ".join(step.warning or "" for step in session.steps)
    assert "backoff" not in warnings and "summarization failed" not in warnings, warnings
    with proxy.http_client() as http:
        metrics = http.get("/metrics").text
    # The window the summary call's refusal taught is kept like a request's.
    assert (
        'compaction_proxy_context_window_tokens{model="summ-3k",source="learned",upstream="fake"}'
        " 3072.0" in metrics
    ), [line for line in metrics.splitlines() if "context_window_tokens" in line]
    assert 'compaction_proxy_summarizer_calls_total{outcome="overflow"} 1.0' in metrics
