"""A single-turn agent loop through the proxy's app: one task, 150 tool steps, a 32k window.

The workload the proxy exists for: the client sends one user message and then re-sends the
whole list after every tool step, all in the same turn. The fake upstream enforces the window
(it answers 400 `context_length_exceeded` past it) and plays the summarizer. Without in-turn
compaction every request from about step 60 on failed; here every request must succeed, with
the task and the newest step verbatim, valid pairing, and a prefix that stays byte-identical
between compaction events.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from tests.support.agent_loop import SYSTEM, TASK, LoopReport, add_step, run_loop
from tests.support.agent_session import CHAT, TOOLS, assert_valid_pairing
from tests.support.in_thread import InThreadServers
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry

WINDOW = 32_000
MODEL = "agent-32k"
STEPS = 150


def loop_config(upstream: UpstreamControl, db: Path, summarize: bool) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 2_000}},
        store={"backend": "sqlite", "path": str(db)},
        summarization={
            "enabled": summarize,
            "maxSummaryTokens": 1_000,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
    )


@pytest.fixture(scope="module")
def loop_upstream(in_thread: InThreadServers) -> UpstreamControl:
    return in_thread.upstream(WINDOW)


@pytest.fixture(scope="module", params=["no_summarizer", "summarizer"])
def loop(
    request: pytest.FixtureRequest,
    loop_upstream: UpstreamControl,
    in_thread: InThreadServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, LoopReport]:
    loop_upstream.reset()
    db = tmp_path_factory.mktemp(f"loop-{request.param}") / "checkpoints.db"
    proxy = in_thread.proxy(loop_config(loop_upstream, db, request.param == "summarizer"))
    return request.param, run_loop(proxy.openai_client(), loop_upstream, model=MODEL, steps=STEPS)


def test_every_step_succeeds_under_the_window(loop: tuple[str, LoopReport]) -> None:
    _, report = loop
    assert len(report.steps) == STEPS  # the SDK raises on any non-2xx
    assert all(0 < step.prompt_tokens <= WINDOW for step in report.steps)
    # the raw conversation is far past the window: without in-turn compaction it fails
    tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
        "o200k_base"
    )
    assert tokenizer.count_messages(report.conversation) > 2 * WINDOW
    assert report.events, "nothing was ever compacted"


def test_the_task_and_the_newest_step_arrive_verbatim(loop: tuple[str, LoopReport]) -> None:
    _, report = loop
    for step in report.steps:
        forwarded = step.forwarded
        assert forwarded[0] == SYSTEM and forwarded[1] == TASK, step.index
        if step.index > 0:  # the newest step: the call made last and its result
            newest = report.conversation[2 + 2 * (step.index - 1) : 2 + 2 * step.index]
            assert forwarded[-2:] == newest, step.index
        assert_valid_pairing(forwarded)


def test_compaction_is_sticky_between_events(loop: tuple[str, LoopReport]) -> None:
    _, report = loop
    for before, after in itertools.pairwise(report.steps):
        if after.checkpoint == "new":
            continue  # a compaction event: the prefix may change here, once
        assert after.forwarded[: len(before.forwarded)] == before.forwarded, after.index
    assert report.stable_share() >= 0.95
    assert len(report.events) <= STEPS // 10  # hysteresis: many steps between events


def test_the_summarizer_is_called_once_per_event_and_carries_the_facts(
    loop: tuple[str, LoopReport],
) -> None:
    name, report = loop
    if name != "summarizer":
        assert report.summarizer_calls == 0
        return
    summarized = [s for s in report.events if "summarization" in s.strategies.split(",")]
    assert summarized, "the summarizer was never used in the loop"
    # Summaries are prepared in the background (summarization.prepare, on by default), so a
    # call lands before its event or during it (this loop's steps take no time, so an event can
    # wait for the job still running); one per event, plus at most one prepared for an event
    # the loop ended before. tests/integration/test_prepare.py times a realistic loop.
    assert len(summarized) <= report.summarizer_calls <= len(summarized) + 1
    last = report.steps[-1].forwarded
    # "progress so far" sits right after the task, and there is only one summary
    summaries = [i for i, m in enumerate(last) if str(m.get("content")).startswith("<summary>")]
    assert summaries == [2]
    text = "\n".join(str(m.get("content") or "") for m in last)
    # every fact a folded step showed the summarizer is still there (in the summary, or verbatim)
    missing = [fact for fact in report.facts_shown if fact not in text]
    assert not missing, missing
    assert "FACT-R5" not in json.dumps(last[3:])  # folded long ago: only the summary has it


def test_a_huge_newest_tool_result_is_trimmed_to_fit(
    loop_upstream: UpstreamControl, in_thread: InThreadServers, tmp_path: Path
) -> None:
    loop_upstream.reset()
    proxy = in_thread.proxy(loop_config(loop_upstream, tmp_path / "cp.db", summarize=False))
    log = "".join(f"line {n}: building target {n} ... ok\n" for n in range(20_000))
    conversation = [SYSTEM, TASK]
    report = LoopReport()
    add_step(conversation, 0, report)
    conversation[-1] = {**conversation[-1], "content": log}
    raw = proxy.openai_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation, tools=TOOLS
    )
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens <= WINDOW
    warnings = raw.headers.get_list("x-compaction-warning")
    assert any("soft-trimmed" in w for w in warnings), warnings
    forwarded = loop_upstream.last_request(CHAT).json()["messages"]
    assert forwarded[:3] == conversation[:3]  # system, task and the call untouched
    result = forwarded[3]["content"]
    assert result.startswith("line 0:") and result.endswith(
        "line 19999: building target 19999 ... ok\n"
    )
    assert "soft-trimmed" in result and len(result) < len(log) // 4
