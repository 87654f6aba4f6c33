"""Sticky checkpoints through real processes: the proxy, the fake upstream (which also plays the
summarizer and enforces an 8k window), SQLite files and a real redis-server.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import SUMMARIZER_PREFIX_MARKER
from tests.support.agent_session import (
    CHAT,
    TOOLS,
    SessionReport,
    assert_valid_pairing,
    count_summarizer_calls,
    forwarded_requests,
    is_summarizer_text,
    run_session,
)
from tests.support.in_thread import InThreadServers
from tests.support.redis_server import RedisServer, free_port
from tests.support.servers import (
    UpstreamControl,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

WINDOW = 8_000
MODEL = "agent-8k"


def checkpoint_config(
    upstream: UpstreamControl, store: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    summarization = {
        "enabled": True,
        "maxSummaryTokens": 800,
        "retainRecent": {"turns": 2},
        "timeout": 5,
        **extra.pop("summarization", {}),
    }
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store=store,
        summarization=summarization,
        **extra,
    )


@pytest.fixture(scope="module")
def window_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module(WINDOW)


@pytest.fixture
def small_upstream(window_upstream: UpstreamServer) -> Iterator[UpstreamServer]:
    window_upstream.reset()
    yield window_upstream
    window_upstream.reset()


def conversation_over_budget(tag: str, steps: int = 12) -> list[dict[str, Any]]:
    """A conversation well past the trigger, with a fact that must survive into the summary."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task {tag}: remember FACT-{tag}."},
    ]
    for step in range(steps):
        call = {
            "id": f"c{tag}{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": f"{tag} {step} " + "z " * 700}
        )
        if step % 4 == 3:
            messages.append({"role": "user", "content": f"Continue {tag} {step}."})
    return messages


# --------------------------------------------------------------------------- the long session


@pytest.fixture(scope="module")
def session(in_thread: InThreadServers, tmp_path_factory: Any) -> SessionReport:
    """The long session needs only HTTP: it runs in this process (tests/support/in_thread.py);
    the restarts, replicas and stores below keep their processes."""
    upstream = in_thread.upstream(WINDOW)
    db = tmp_path_factory.mktemp("session") / "checkpoints.db"
    proxy = in_thread.proxy(checkpoint_config(upstream, {"backend": "sqlite", "path": str(db)}))
    # Turns of a few tool steps each: the retained two turns fit the target, so compaction
    # summarizes older turns (a single endless turn is the newest turn, and never compacted).
    return run_session(
        proxy.openai_client(),
        upstream,
        model=MODEL,
        requests=160,
        tool_output_chars=300,
        turn_every=4,
    )


def test_every_request_of_a_long_agent_session_succeeds_under_budget(
    session: SessionReport,
) -> None:
    assert len(session.steps) == 160
    for step in session.steps:
        assert step.prompt_tokens < WINDOW, step.index
        assert_valid_pairing(step.forwarded)
        assert step.forwarded[0]["role"] == "system"
        # The one warning a long session may carry: how many items the ledger's share left out.
        # (Several warnings arrive joined in one value: anything else breaks either end.)
        said = step.warning
        assert said is None or (
            said.startswith("ledger: ") and said.endswith("recall finds them)")
        ), (step.index, said)


def test_summarizer_calls_equal_compaction_events_not_requests(session: SessionReport) -> None:
    events = session.compaction_events
    assert events >= 3, "the session must compact several times to test rolling updates"
    # At most one call per event, plus one summary prepared in the background for the event
    # after the session's last request (summarization.prepare).
    assert 1 <= session.summarizer_calls <= events + 1
    assert events < len(session.steps) / 5
    hits = sum(1 for s in session.steps if s.checkpoint == "hit")
    assert hits > len(session.steps) / 2


def test_between_compactions_each_request_extends_the_previous_one(
    session: SessionReport,
) -> None:
    steps = session.steps
    for before, after in itertools.pairwise(steps):
        if after.checkpoint == "new":
            continue  # a compaction event: the prefix is allowed to change here, once
        assert after.forwarded[: len(before.forwarded)] == before.forwarded, after.index
    # Summarization folds only down to the target (0.5 of the budget), so an event follows every
    # 0.3 of the budget of growth: 9 events in 160 requests of this session (6 when every event
    # folded all but the retained turns), a share of 94.3% (was 96.2%).
    assert session.stable_share() >= 0.93


def test_what_the_summarizer_saw_survives_rolling_updates(session: SessionReport) -> None:
    last = session.steps[-1].forwarded
    text = "\n".join(str(m.get("content") or "") for m in last)
    missing = [fact for fact in session.facts_shown if fact not in text]
    assert not missing, missing
    summaries = [m for m in last if str(m.get("content") or "").startswith("<summary>")]
    assert len(summaries) == 1 and summaries[0]["role"] == "user"


# --------------------------------------------------------------------------- persistence


def test_a_sqlite_checkpoint_survives_a_restart(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    config = checkpoint_config(
        small_upstream, {"backend": "sqlite", "path": str(tmp_path / "cp.db")}
    )
    messages = conversation_over_budget("S")
    first = proxy_factory(config)
    raw = first.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS
    )
    assert raw.headers["x-compaction-checkpoint"] == "new"
    forwarded_first = forwarded_requests(small_upstream)[-1]["messages"]
    calls = count_summarizer_calls(small_upstream)
    assert calls == 1
    first.stop()

    second = proxy_factory(config)
    raw = second.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS
    )
    assert raw.headers["x-compaction-checkpoint"] == "hit"
    assert count_summarizer_calls(small_upstream) == calls, "no summarizer call after restart"
    assert forwarded_requests(small_upstream)[-1]["messages"] == forwarded_first


def test_another_credential_never_reuses_a_checkpoint(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(tmp_path / "cp.db")})
    )
    messages = conversation_over_budget("K")
    alice = proxy.openai_client(api_key="sk-alice")
    bob = proxy.openai_client(api_key="sk-bob")
    first = alice.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert first.headers["x-compaction-checkpoint"] == "new"
    again = alice.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert again.headers["x-compaction-checkpoint"] == "hit"
    other = bob.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert other.headers["x-compaction-checkpoint"] == "new"
    assert count_summarizer_calls(small_upstream) == 2
    # The summarizer used each caller's own key.
    keys = [
        r.headers.get("authorization")
        for r in small_upstream.requests(CHAT)
        if is_summarizer_text(r.text)
    ]
    assert keys == ["Bearer sk-alice", "Bearer sk-bob"]


# --------------------------------------------------------------------------- redis


def test_two_proxies_share_checkpoints_through_redis(
    small_upstream: UpstreamServer, proxy_factory: Any, redis_url: str
) -> None:
    config = checkpoint_config(small_upstream, {"backend": "redis", "url": redis_url})
    one, two = proxy_factory(config), proxy_factory(config)
    messages = conversation_over_budget("R")
    made = one.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages
    )
    assert made.headers["x-compaction-checkpoint"] == "new"
    reused = two.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages
    )
    assert reused.headers["x-compaction-checkpoint"] == "hit"
    assert count_summarizer_calls(small_upstream) == 1
    sent = forwarded_requests(small_upstream)
    assert sent[-1]["messages"] == sent[-2]["messages"]


def test_concurrent_identical_requests_make_one_summarizer_call(
    small_upstream: UpstreamServer, proxy_factory: Any, redis_url: str
) -> None:
    config = checkpoint_config(small_upstream, {"backend": "redis", "url": redis_url})
    proxies = [proxy_factory(config), proxy_factory(config)]
    small_upstream.control(summarizer_delay_ms=1500)
    messages = conversation_over_budget("C")

    def send(index: int) -> str:
        client = proxies[index % 2].openai_client()
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        raw.parse()
        return str(raw.headers["x-compaction-checkpoint"])

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        states = list(pool.map(send, range(8)))
    assert count_summarizer_calls(small_upstream) == 1
    assert all(state in ("new", "hit") for state in states), states
    sent = [r["messages"] for r in forwarded_requests(small_upstream)]
    assert len(sent) == 8 and all(m == sent[0] for m in sent), "all eight forwarded alike"


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("mode", ["error", "hang", "empty", "oversized"])
def test_a_failing_summarizer_never_fails_the_request(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path, mode: str
) -> None:
    proxy = proxy_factory(
        checkpoint_config(
            small_upstream,
            {"backend": "sqlite", "path": str(tmp_path / "cp.db")},
            summarization={"timeout": 2, "maxSummaryTokens": 400},
        )
    )
    small_upstream.control(summarizer=mode)
    client = proxy.openai_client()
    messages = conversation_over_budget("F")
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens < WINDOW
    assert "summarization failed" in raw.headers["x-compaction-warning"]
    assert raw.headers["x-compaction-checkpoint"] == "none", "a failed summary is not stored"
    assert "truncation" in raw.headers["x-compaction-strategies"]
    assert_valid_pairing(forwarded_requests(small_upstream)[-1]["messages"])
    calls = count_summarizer_calls(small_upstream)
    assert calls == 1

    # The next request for the same conversation backs off instead of calling again.
    messages.append({"role": "assistant", "content": "noted"})
    messages.append({"role": "user", "content": "and now?"})
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert raw.status_code == 200
    assert "backoff" in raw.headers["x-compaction-warning"]
    assert count_summarizer_calls(small_upstream) == calls


def test_redis_down_at_start_degrades_to_no_checkpoints(
    small_upstream: UpstreamServer, proxy_factory: Any
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    proxy = proxy_factory(checkpoint_config(small_upstream, {"backend": "redis", "url": url}))
    raw = proxy.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation_over_budget("D")
    )
    assert raw.status_code == 200
    # The checkpoint the store cannot take is held in the process (what it holds was paid
    # for), and the response says so.
    assert raw.headers["x-compaction-checkpoint"] == "new"
    warnings = raw.headers.get_list("x-compaction-warning")
    assert any("store unavailable" in w for w in warnings), warnings
    assert any("kept in this process's memory only" in w for w in warnings), warnings
    with httpx.Client(base_url=proxy.url, trust_env=False) as http:
        ready = http.get("/readyz")
    # Requests are served without checkpoints: degraded, still ready (docs/deploy.md).
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    assert "marked down" in ready.json()["checks"]["store:redis"]


def test_redis_going_down_mid_run_keeps_requests_working(
    small_upstream: UpstreamServer, proxy_factory: Any, own_redis: RedisServer
) -> None:
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "redis", "url": own_redis.url})
    )
    client = proxy.openai_client()
    messages = conversation_over_budget("M")
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert first.headers["x-compaction-checkpoint"] == "new"
    own_redis.stop()
    messages.append({"role": "user", "content": "still there?"})
    after = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert after.status_code == 200
    assert "unavailable" in after.headers["x-compaction-warning"]
    completion = after.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens < WINDOW


def test_an_unknown_summarizer_provider_stops_start_up(
    small_upstream: UpstreamServer, tmp_path: Path
) -> None:
    config = checkpoint_config(
        small_upstream,
        {"backend": "memory"},
        summarization={"provider": "nope"},
    )
    path = write_config(tmp_path / "bad.yaml", config)
    done = subprocess.run(
        [sys.executable, "-m", "compaction_proxy", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode != 0
    assert "provider" in done.stderr


def test_a_compaction_the_upstream_refuses_is_not_stored(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(tmp_path / "cp.db")})
    )
    messages = conversation_over_budget("X")
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60) as http:
        refused = http.post(
            CHAT,
            json={"model": MODEL, "messages": messages},
            headers={"X-Fake-Status": "500"},  # the upstream fails this one request
        )
        assert refused.status_code == 500
        accepted = http.post(CHAT, json={"model": MODEL, "messages": messages})
    assert accepted.status_code == 200
    # Not a hit: the refused request's compaction never became the checkpoint.
    assert accepted.headers["x-compaction-checkpoint"] == "new"


def test_forced_compaction_does_not_become_the_checkpoint(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(tmp_path / "cp.db")})
    )
    client = proxy.openai_client()
    messages = conversation_over_budget("Q", steps=6)  # between the target and the trigger
    forced = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, extra_headers={"X-Compaction": "force"}
    )
    assert forced.headers["x-compaction-strategies"] != "none"
    assert forced.headers["x-compaction-checkpoint"] == "none"
    normal = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert normal.headers["x-compaction-checkpoint"] == "none"
    assert forwarded_requests(small_upstream)[-1]["messages"] == messages


def test_one_summary_has_one_time_budget_whatever_it_waits_for(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    """summarization.timeout bounds the whole summary, not each call of it."""
    proxy = proxy_factory(
        checkpoint_config(
            small_upstream,
            {"backend": "sqlite", "path": str(tmp_path / "cp.db")},
            summarization={"timeout": 1},
        )
    )
    # Summarizer calls are held until the test lets them go: only the 1 s budget can end the
    # summary, and the client's generous 30 s bound raises if the request waits for them.
    small_upstream.control(summarizer_hold=True)
    try:
        raw = proxy.openai_client(timeout=30).chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation_over_budget("T")
        )
    finally:
        small_upstream.control(summarizer_hold=False)
    assert raw.status_code == 200
    assert "timeout" in raw.headers["x-compaction-warning"]


# --------------------------------------------------------------------------- prefix reuse


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_summary_call_reuses_the_requests_prefix_and_hits_the_cache(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    """The default (`reusePrefix: auto`, the request's own upstream and model): the summary
    call is the forwarded request's own prefix plus our instruction, so the upstream's prompt
    cache serves it; the fake reports the cached tokens and they reach /metrics."""
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(tmp_path / "cp.db")})
    )
    client = proxy.openai_client()
    messages = conversation_over_budget("Q")
    # Earlier in the session, below the trigger: forwarded as sent, the upstream has read it.
    early = messages[:8]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=early, tools=TOOLS)
    assert raw.headers.get("x-compaction-checkpoint", "none") == "none"
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS
    )
    assert raw.headers["x-compaction-checkpoint"] == "new"
    summaries = [r for r in small_upstream.requests(CHAT) if is_summarizer_text(r.text)]
    assert len(summaries) == 1
    body = summaries[0].json()
    sent = body["messages"]
    assert sent[-1]["role"] == "user"
    assert sent[-1]["content"].startswith(SUMMARIZER_PREFIX_MARKER)
    assert "<conversation>\n[" not in sent[-1]["content"], "not the transcript form"
    assert body["tools"] == TOOLS
    # The request's own messages, as the client sent them, up to the stretch's end.
    assert len(sent) - 1 > len(early)
    assert sent[: len(early)] == early
    placed = [m for m in sent[:-1] if m in messages]
    assert placed == messages[: len(placed)]
    # The fake's prompt cache recognised the early request's prefix.
    with proxy.http_client() as http:
        metrics = http.get("/metrics").text
        dashboard = http.get("/dashboard/data").json()
    cached = _metric(metrics, "compaction_proxy_summarizer_cached_tokens_total")
    assert cached > 1_000
    assert dashboard["summarizer"]["cached_tokens"] == cached
    assert dashboard["summarizer"]["prefix_calls"] == 1
