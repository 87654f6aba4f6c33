"""Property tests: the default pipeline WITH a summarizer keeps DESIGN invariants 1-8.

Reuses the rich conversation generator and the phase-2 invariant checks of
``test_properties``; summary checkpoints are the one kind of synthetic message added here.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    Mode,
    ModelFacts,
    Pipeline,
    SummarizationSettings,
    build_pipeline,
    compact_async,
)
from compaction_proxy.compaction.strategies import SummarizationStrategy

from .summarizer_fakes import TOK, FakeSummarizer, failing
from .test_properties import SYSTEM, check_invariants_phase2, rich_conversations

Msg = dict[str, Any]
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "300"))


@st.composite
def pipelines(draw: st.DrawFn) -> Pipeline:
    block: dict[str, Any] = {
        "contextPruning": {
            "keepLastAssistants": draw(st.integers(0, 3)),
            "minPrunableToolChars": 100,
            "softTrim": {"maxChars": 200, "headChars": 50, "tailChars": 50},
        },
        "retainRecent": {"turns": draw(st.integers(0, 3))},
        "placement": draw(st.sampled_from(["user", "assistant", "system"])),
    }
    if draw(st.booleans()):
        block["retainRecent"]["tokens"] = draw(st.integers(1, 3000))
    pipeline = build_pipeline(CompactionSettings(), SummarizationSettings.model_validate(block))
    if draw(st.integers(0, 3)) == 0:  # the Agent Framework shape in front of the default
        af = SummarizationStrategy(
            target_count=draw(st.integers(1, 6)), threshold=draw(st.integers(0, 3))
        )
        pipeline = Pipeline((af, *pipeline.strategies), stop_when=pipeline.stop_when)
    return pipeline


def run(msgs: list[Msg], pipeline: Pipeline, window: int, summarizer: Any, mode: Mode) -> Any:
    async def go() -> CompactionResult:
        return await compact_async(
            CompactionRequest(
                msgs,
                model="m",
                pipeline=pipeline,
                tokenizer=TOK,
                facts=ModelFacts(window, 0),
                reserve_ratio=0,
                mode=mode,
            ),
            summarizer=summarizer,
        )

    return asyncio.run(go())


def split_summaries(msgs: list[Msg], out: list[Msg]) -> list[Msg]:
    """Check the summary checkpoints' shape and place; return the other messages."""
    leading = 0
    while leading < len(msgs) and msgs[leading]["role"] in SYSTEM:
        leading += 1
    users = [m["x-id"] for m in msgs if m["role"] == "user"]
    task = next((p for p, m in enumerate(out) if users and m.get("x-id") == users[-1]), None)
    rest: list[Msg] = []
    for position, message in enumerate(out):
        if "x-id" in message:
            rest.append(message)
            continue
        if not str(message.get("content", "")).startswith("<summary>\n"):
            rest.append(message)  # a [Tool results: ...] collapse, checked by phase 2
            continue
        assert set(message) == {"role", "content"}
        assert message["role"] in ("user", "assistant", "system")
        # right after the leading system block, or ("progress so far" in an agent loop)
        # right after the task message
        assert position == leading or (task is not None and position == task + 1)
    assert sum(1 for m in out if "x-id" not in m and m["content"].startswith("<summary>")) <= 1
    return rest


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rich_conversations(),
    pipelines(),
    st.integers(50, 20_000),
    st.sampled_from([Mode.NORMAL, Mode.NORMAL, Mode.FORCE]),
)
def test_default_pipeline_with_a_summarizer_keeps_the_invariants(
    msgs: list[Msg], pipeline: Pipeline, window: int, mode: Mode
) -> None:
    snapshot = orjson.dumps(msgs)
    fake = FakeSummarizer()
    result = run(msgs, pipeline, window, fake, mode)
    assert orjson.dumps(msgs) == snapshot  # the input is never mutated
    # one call per event, and at most two more that fold more into it (the update prompt)
    # when the summary and what must stay do not fit the budget
    rounds = [s.max_rounds for s in pipeline.strategies if isinstance(s, SummarizationStrategy)]
    assert len(fake.calls) <= sum(rounds)
    for request in fake.calls:  # the summarizer sees client messages, never system ones
        assert request.messages and all(m["role"] not in SYSTEM for m in request.messages)
    check_invariants_phase2(
        msgs,
        split_summaries(msgs, result.messages),
        media_kept=True,
        last_resort=bool(result.report.last_resort and result.report.last_resort.changed),
    )
    if not result.changed:
        assert all(x is y for x, y in zip(result.messages, msgs, strict=True))
    # a short stretch can still beat the fake's summary by too little: the only failure
    assert all(f.reason == "not_shorter" for f in result.report.failures)
    # 6. deterministic
    again = run(msgs, pipeline, window, FakeSummarizer(), mode)
    assert orjson.dumps(again.messages) == orjson.dumps(result.messages)
    # 7. idempotent.  Not after a failed summary: the failed strategy changed nothing and later
    # ones did, so a second run may give it different (now foldable) input.  The edge never
    # stores a compaction with a failure and backs off, so that second run never happens there.
    second_fake = FakeSummarizer()
    second = run(result.messages, pipeline, window, second_fake, mode)
    if not result.report.failures:
        assert not second.changed, (second.report.to_dict(), result.report.to_dict())
        assert second_fake.calls == []
    # 8. under budget whenever possible, else a warning
    report = result.report
    if report.tokens_after > report.budget:
        assert report.warnings
    event(f"summarized={any(r.name == 'summarization' and r.changed for r in report.walk())}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rich_conversations(),
    pipelines(),
    st.integers(50, 20_000),
    st.sampled_from(["timeout", "error", "empty", "oversized", "backoff"]),
)
def test_a_failing_summarizer_still_yields_valid_output(
    msgs: list[Msg], pipeline: Pipeline, window: int, reason: str
) -> None:
    result = run(msgs, pipeline, window, failing(reason), Mode.NORMAL)
    out = result.messages
    assert not any("x-id" not in m and m["content"].startswith("<summary>") for m in out)
    check_invariants_phase2(
        msgs,
        out,
        media_kept=True,
        last_resort=bool(result.report.last_resort and result.report.last_resort.changed),
    )
    report = result.report
    assert all(f.reason == reason for f in report.failures)
    if report.failures:
        assert any("summarization failed" in w for w in report.warnings)
    if report.tokens_after > report.budget:
        assert any(w.startswith("over budget") for w in report.warnings)
    event(f"failed={bool(report.failures)}")
