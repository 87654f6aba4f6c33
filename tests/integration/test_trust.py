"""What compaction keeps of paid summaries and carried messages, through real processes.

LibreChat's `summarization:` example pasted exactly as its docs give it, with only
`models: {<name>: {context_window: N}}` besides; the fake upstream enforces the window and plays
the summarizer (its summary lists the FACT tokens it was shown, never the users' rules). The
sessions are tests/support/trust_session.py's: chat turns of two requests (a rule stated in every
user message, ~900-token tool results) and their figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.in_thread import InThreadServers
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry
from tests.support.trust_session import (
    LIBRECHAT_BLOCK,
    LIBRECHAT_UPSTREAM,
    TrustReport,
    run_trust_session,
)

WINDOW_8K = 8_192
WINDOW_32K = 32_768


def librechat_config(
    upstream: UpstreamControl, db: Path, model: str, window: int, *, summarize: bool = True
) -> dict[str, Any]:
    block = dict(LIBRECHAT_BLOCK) if summarize else {**LIBRECHAT_BLOCK, "enabled": False}
    return proxy_config(
        upstream_entry(upstream, name=LIBRECHAT_UPSTREAM),
        models={model: {"context_window": window}},
        store={"backend": "sqlite", "path": str(db)},
        summarization=block,
    )


# --------------------------------------------------------------------------- 8k, the block


@pytest.fixture(scope="module")
def chat_8k(in_thread: InThreadServers, tmp_path_factory: Any) -> TrustReport:
    """The sessions need only HTTP: in this process (tests/support/in_thread.py)."""
    upstream = in_thread.upstream(WINDOW_8K)
    db = tmp_path_factory.mktemp("trust-8k") / "checkpoints.db"
    proxy = in_thread.proxy(librechat_config(upstream, db, "acc-8k", WINDOW_8K))
    # 65 turns of two requests, each turn with a ~900-token tool result.
    return run_trust_session(
        proxy.openai_client(), upstream, model="acc-8k", shape="chat", requests=130
    )


def test_summaries_made_are_forwarded_at_8k(chat_8k: TrustReport) -> None:
    """Item 1: a summary is never made and then dropped (main: 0 % after the first)."""
    share = chat_8k.summary_share()
    assert share is not None and share >= 0.9, share
    assert chat_8k.false_summary_reports() == []


def test_facts_survive_to_the_last_request_at_8k(chat_8k: TrustReport) -> None:
    assert chat_8k.facts_carried() >= 0.9, chat_8k.facts_carried()


def test_at_most_one_summarizer_call_per_six_requests_at_8k(chat_8k: TrustReport) -> None:
    """Item 6 (main: 30 calls in 130 requests)."""
    assert chat_8k.summarizer_calls * 6 <= chat_8k.requests, chat_8k.summarizer_calls


def test_every_request_fits_and_says_nothing_false_at_8k(chat_8k: TrustReport) -> None:
    for step in chat_8k.steps:
        assert step.prompt_tokens < WINDOW_8K, step.index
        assert step.forwarded[0]["role"] == "system"
        assert not any("not forwarded" in w for w in step.warnings), (step.index, step.warnings)


# --------------------------------------------------------------------------- 32k, the rules


@pytest.fixture(scope="module", params=["summarizer", "no_summarizer"])
def chat_32k(
    request: pytest.FixtureRequest, in_thread: InThreadServers, tmp_path_factory: Any
) -> TrustReport:
    upstream = in_thread.upstream(WINDOW_32K)
    upstream.reset()
    db = tmp_path_factory.mktemp(f"trust-32k-{request.param}") / "checkpoints.db"
    config = librechat_config(
        upstream, db, "acc-32k", WINDOW_32K, summarize=request.param == "summarizer"
    )
    proxy = in_thread.proxy(config)
    return run_trust_session(
        proxy.openai_client(), upstream, model="acc-32k", shape="chat", requests=200
    )


def test_rules_users_stated_are_still_forwarded_after_100_turns(chat_32k: TrustReport) -> None:
    """Item 5: a rule stated in every user message (main: 24-26 % still forwarded)."""
    assert chat_32k.events > 0, "the session never needed compaction: it proves nothing"
    assert chat_32k.rules_carried() >= 0.95, chat_32k.rules_carried()
    last = chat_32k.steps[-1]
    sent = [m for m in last.raw if m["role"] == "user"]
    forwarded = [m for m in last.forwarded if m["role"] == "user"]
    # verbatim: the client's own messages, in their order
    carried = [m for m in forwarded if m in sent]
    assert carried == [m for m in sent if m in carried]
    assert len(carried) >= 0.95 * len(sent)


# --------------------------------------------------------------------------- one budget rule


def _budget(proxy: Any, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(trust_env=False, timeout=30) as client:
        response = client.post(f"{proxy.url}/v1/compaction/preview", json=body)
    assert response.status_code == 200, response.text
    budget: dict[str, Any] = response.json()["report"]["budget"]
    return budget


def test_a_declared_and_a_learned_8k_window_get_the_same_budget(
    upstream_factory: Any, proxy_factory: Any, tmp_path: Path
) -> None:
    """Item 2: declared without max_output_tokens, main reserved 4,096 (budget 3,687); learned
    from a refusal, 2,048. Both now reserve a quarter of the window (budget 5,735), and the
    preview says where each part came from."""
    upstream = upstream_factory(WINDOW_8K)
    config = proxy_config(
        upstream_entry(upstream),
        models={"acc-8k": {"context_window": WINDOW_8K}},
        store={"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")},
        summarization={"enabled": False},
    )
    proxy = proxy_factory(config)
    declared = _budget(proxy, "acc-8k")
    assert declared == {
        "context_window": 8_192,
        "output_reserve": 2_048,
        "safety_reserve": 409,
        "limit": 5_735,
        "window_source": "config",
        "output_source": "default",
        "reserve_ratio": 0.05,
    }
    # An undeclared model meets the 8k wall once; the window it learns gets the same rule.
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(12):
        messages.append({"role": "user", "content": f"question {turn} " + "q " * 500})
        messages.append({"role": "assistant", "content": f"answer {turn} " + "a " * 500})
    messages.append({"role": "user", "content": "and now?"})
    client = proxy.openai_client()
    raw = client.chat.completions.with_raw_response.create(model="mystery-8k", messages=messages)
    assert raw.headers.get("x-compaction-retry") == "1"
    learned = _budget(proxy, "mystery-8k")
    assert learned["context_window"] == WINDOW_8K
    assert learned["window_source"] == "learned"
    assert {k: learned[k] for k in ("output_reserve", "limit", "output_source")} == {
        "output_reserve": 2_048,
        "limit": 5_735,
        "output_source": "default",
    }
