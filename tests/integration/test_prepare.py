"""Summaries prepared ahead of time, through real processes (compaction_proxy/engine/_prepare.py).

An agent loop is driven request by request through the prepare threshold (0.6 of the budget here)
to the trigger (0.8) and on, against a window-enforcing fake upstream. With `prepare` the request
on which compaction happens must not wait for the summarizer: the upstream holds every summarizer
call at a gate while a request is in flight (and lets it go once the request is answered, while
the agent runs its tool), so a request that waited for one could not be answered but by the
proxy's summarization timeout. The summarizer is still called once per compaction event, the
prefix stays as stable as without `prepare`, and the facts the agent found survive. A summarizer
that fails in the background leaves the requests exactly as they are without `prepare`. Two
replicas over one real redis-server prepare each summary once.

No test here times anything: how much latency `prepare` saves is measured by
`bench/session.py --latency`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_loop import SYSTEM, TASK, LoopReport, add_step
from tests.support.agent_session import CHAT, TOOLS, assert_valid_pairing, is_summarizer_text
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry
from tests.support.timed_loop import Session, drive

WINDOW = 16_000
MODEL = "agent-16k"
STEPS = 48
THINK_SECONDS = 0.1  # the agent running its tool between two requests


def prepare_config(
    upstream: UpstreamServer, store: dict[str, Any], *, prepare: bool
) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 2_000}},
        store=store,
        summarization={
            "enabled": True,
            "maxSummaryTokens": 600,
            "retainRecent": {"turns": 2},
            "timeout": 20,
            "prepare": {"type": "token_ratio", "value": 0.6} if prepare else False,
        },
    )


def pending_at_end(session: Session) -> int:
    """A summary prepared for a compaction that has not happened yet: at most one."""
    return 1 if session.steps[-1].prepared in ("pending", "ready") else 0


@pytest.fixture(scope="module")
def upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module(WINDOW)


def _run(
    upstream: UpstreamServer,
    proxies: list[ProxyServer],
    *,
    hold_summarizer: bool = False,
    **control: Any,
) -> Session:
    upstream.reset()
    if control:
        upstream.control(**control)
    clients = [p.openai_client() for p in proxies]
    try:
        return drive(
            clients,
            upstream,
            model=MODEL,
            steps=STEPS,
            think_seconds=THINK_SECONDS,
            settle_seconds=10,  # a bound: the wait ends when the last summary call lands
            hold_summarizer=hold_summarizer,
        )
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="module")
def with_prepare(
    upstream: UpstreamServer, module_proxy_factory: Any, tmp_path_factory: pytest.TempPathFactory
) -> Session:
    db = tmp_path_factory.mktemp("prepare-on") / "checkpoints.db"
    store = {"backend": "sqlite", "path": str(db)}
    proxy = module_proxy_factory(prepare_config(upstream, store, prepare=True))
    return _run(upstream, [proxy], hold_summarizer=True)


@pytest.fixture(scope="module")
def without_prepare(
    upstream: UpstreamServer, module_proxy_factory: Any, tmp_path_factory: pytest.TempPathFactory
) -> Session:
    db = tmp_path_factory.mktemp("prepare-off") / "checkpoints.db"
    store = {"backend": "sqlite", "path": str(db)}
    proxy = module_proxy_factory(prepare_config(upstream, store, prepare=False))
    return _run(upstream, [proxy])


def test_compaction_turns_do_not_wait_for_the_summarizer(
    with_prepare: Session, without_prepare: Session
) -> None:
    # Without prepare, every turn that summarizes calls the summarizer itself and waits for
    # it (the summary is in what it forwards): the reference. (An event that only collapses
    # old tool results calls no summarizer.) No background call exists to be counted instead.
    assert without_prepare.summarized
    assert all(s.summarizer_calls >= 1 for s in without_prepare.summarized)
    assert sum(s.summarizer_calls for s in without_prepare.steps) == len(without_prepare.summarized)
    # With it, each event that summarizes continues from a summary made ahead of time...
    events = with_prepare.summarized
    assert len(events) >= 2
    assert all(s.prepared == "ready" for s in events), [(s.index, s.prepared) for s in events]
    # ...and was answered while every summarizer call was held at the upstream's gate, as
    # was every other request: none waited for a summarizer (one that had would have been
    # answered only by the summarization timeout, with a warning saying so).
    assert with_prepare.held_summarizer
    assert not [(s.index, s.warnings) for s in with_prepare.steps if s.warnings]


def test_requests_between_the_thresholds_go_upstream_untouched(with_prepare: Session) -> None:
    pending = [s for s in with_prepare.steps if s.prepared == "pending"]
    assert pending, "nothing was ever prepared"
    for step in pending:
        assert step.checkpoint != "new", step.index  # nothing compacted on that request


def test_one_summarizer_call_per_compaction_event(
    with_prepare: Session, without_prepare: Session
) -> None:
    assert without_prepare.summarizer_calls == len(without_prepare.summarized)
    expected = len(with_prepare.summarized) + pending_at_end(with_prepare)
    assert with_prepare.summarizer_calls == expected


def test_the_prefix_is_as_stable_as_without_prepare(
    with_prepare: Session, without_prepare: Session
) -> None:
    for before, after in zip(with_prepare.steps, with_prepare.steps[1:], strict=False):
        if after.checkpoint == "new":
            continue  # a compaction event: the prefix may change here, once
        assert after.forwarded[: len(before.forwarded)] == before.forwarded, after.index
    # Events come where they would without prepare, give or take one step a cycle.
    assert abs(len(with_prepare.events) - len(without_prepare.events)) <= 1
    assert with_prepare.stable_share() >= without_prepare.stable_share() - 0.03


def test_pairing_and_window_hold_and_facts_survive(with_prepare: Session) -> None:
    for step in with_prepare.steps:
        assert_valid_pairing(step.forwarded)
        assert step.forwarded[0] == SYSTEM and step.forwarded[1] == TASK
    # Every fact the agent found before the last event reached a summary or is still verbatim.
    last = with_prepare.steps[-1].forwarded
    visible = "\n".join(with_prepare.summaries) + "\n" + str(last)
    missing = [fact for fact in with_prepare.facts_shown if fact not in visible]
    assert not missing


def test_a_failing_background_summary_falls_back_as_without_prepare(
    upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    sessions = {}
    for prepare in (False, True):
        store = {"backend": "sqlite", "path": str(tmp_path / f"prepare-{prepare}.db")}
        proxy = proxy_factory(prepare_config(upstream, store, prepare=prepare))
        sessions[prepare] = _run(upstream, [proxy], summarizer="error")
    off, on = sessions[False], sessions[True]
    # The summarizer fails either way, so nothing becomes a checkpoint; the requests go
    # upstream exactly as they do without prepare, fallback and all.
    assert [s.forwarded for s in on.steps] == [s.forwarded for s in off.steps]
    # Step i carries the task and i tool steps (2 + 2i messages); the fallback cut some.
    assert any(len(s.forwarded) < 2 + 2 * s.index for s in on.steps)
    assert any(any("summarization failed" in w for w in s.warnings) for s in on.steps)
    assert all(s.prepared != "ready" for s in on.steps)
    # The failed background call set the same back-off the request's own call would have.
    assert on.summarizer_calls == off.summarizer_calls == 1


def test_two_replicas_over_redis_prepare_each_summary_once(
    upstream: UpstreamServer, proxy_factory: Any, redis_url: str
) -> None:
    store = {"backend": "redis", "url": redis_url}
    replicas = [proxy_factory(prepare_config(upstream, store, prepare=True)) for _ in range(2)]
    session = _run(upstream, replicas)
    assert len(session.summarized) >= 2
    assert session.summarizer_calls == len(session.summarized) + pending_at_end(session)
    # Each replica used summaries the other may have made.
    assert all(s.prepared == "ready" for s in session.summarized)


def test_nothing_is_prepared_for_dry_runs_forced_runs_or_off(
    upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    upstream.reset()
    store = {"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")}
    proxy = proxy_factory(prepare_config(upstream, store, prepare=True))
    client = proxy.openai_client()
    conversation: list[dict[str, Any]] = [SYSTEM, TASK]
    report = LoopReport()
    seen: dict[str, list[str]] = {"dry-run": [], "off": [], "on": []}
    for index in range(40):
        for mode in ("dry-run", "off", "on"):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=conversation,
                tools=TOOLS,
                extra_headers={"X-Compaction": mode},
            )
            seen[mode].append(raw.headers.get("x-compaction-prepared", "absent"))
            if mode != "on":
                # No background work was started by this request: nothing reached the summarizer.
                assert not [r for r in upstream.requests(CHAT) if is_summarizer_text(r.text)]
        if seen["on"][-1] == "pending":
            break
        add_step(conversation, index, report)
    client.close()
    assert seen["on"][-1] == "pending", "the session never reached the prepare threshold"
    assert set(seen["dry-run"]) == {"none"}
    assert set(seen["off"]) == {"absent"}  # no compaction at all, no compaction headers
