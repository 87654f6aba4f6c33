"""Every strategy inside a single-turn agent loop (DESIGN invariant 4, "Agent loops").

One task message, then tool steps in the same turn: the task and the newest step are kept
verbatim, every older step is handled like any older group, and each strategy's own
keep-parameter still protects what it names.
"""

from __future__ import annotations

from typing import Any

from compaction_proxy.compaction import CompactionSettings, ModelFacts, build_pipeline
from compaction_proxy.compaction.strategies import (
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    SelectiveToolCallsStrategy,
    SlidingWindowStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.triggers import Always

from .helpers import call, s, tool, u
from .strategy_helpers import run

Msg = dict[str, Any]
BIG_RESULT = "r" * 600
GONE = "[Old tool result content cleared]"


def loop(steps: int, *, final_text: bool = False) -> list[Msg]:
    msgs: list[Msg] = [s(), u("fix the failing tests")]
    for n in range(steps):
        msgs += [call(f"c{n}", name="read"), tool(f"c{n}", f"result {n} {BIG_RESULT}")]
    if final_text:
        msgs.append({"role": "assistant", "content": "all green"})
    return msgs


def call_ids(messages: list[Msg]) -> list[str]:
    return [c["id"] for m in messages for c in m.get("tool_calls") or []]


def assert_task_and_newest_step_kept(before: list[Msg], after: list[Msg]) -> None:
    assert after[0] is before[0] and after[1] is before[1]
    assert after[-2] is before[-2] and after[-1] is before[-1]


def test_selective_tool_calls_drops_older_steps_of_the_running_turn() -> None:
    msgs = loop(6)
    out = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=2), msgs).messages
    assert call_ids(out) == ["c4", "c5"]
    assert_task_and_newest_step_kept(msgs, out)


def test_tool_result_compaction_collapses_older_steps() -> None:
    msgs = loop(5)
    out = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=1), msgs).messages
    assert call_ids(out) == ["c4"]
    collapsed = [m["content"] for m in out if str(m.get("content")).startswith("[Tool results")]
    assert len(collapsed) == 4 and collapsed[0].startswith("[Tool results: read: result 0")
    assert_task_and_newest_step_kept(msgs, out)


def test_clear_tool_uses_clears_all_but_the_newest_results() -> None:
    msgs = loop(6)
    out = run(ClearToolUsesStrategy(keep=2, trigger=Always()), msgs).messages
    cleared = [m["tool_call_id"] for m in out if m.get("role") == "tool" and m["content"] == GONE]
    assert cleared == ["c0", "c1", "c2", "c3"]
    assert call_ids(out) == [f"c{n}" for n in range(6)]  # calls kept: pairing intact
    assert_task_and_newest_step_kept(msgs, out)


def test_context_pruning_ages_steps_and_keeps_the_last_assistants() -> None:
    msgs = loop(8)
    pruning = ContextPruningStrategy(
        keep_last_assistants=3,
        min_prunable_tool_chars=100,
        soft_trim_max_chars=200,
        soft_trim_head_chars=20,
        soft_trim_tail_chars=20,
        trigger=Always(),
    )
    out = run(pruning, msgs).messages
    changed = [i for i, (a, b) in enumerate(zip(msgs, out, strict=True)) if a is not b]
    assert changed and all(msgs[i]["role"] == "tool" for i in changed)
    assert max(changed) < 2 + 2 * 5  # the last three steps (c5-c7) are untouched
    assert_task_and_newest_step_kept(msgs, out)


def test_sliding_window_by_groups_counts_steps() -> None:
    msgs = loop(6)
    out = run(SlidingWindowStrategy(keep_last_groups=3), msgs).messages
    assert call_ids(out) == ["c3", "c4", "c5"]  # the task is kept too (invariant 4)
    assert_task_and_newest_step_kept(msgs, out)


def test_sliding_window_by_turns_never_splits_the_running_turn() -> None:
    msgs = loop(6)
    assert not run(SlidingWindowStrategy(keep_last_turns=1), msgs).changed


def test_truncation_drops_the_oldest_steps_first() -> None:
    msgs = loop(10)
    window = 1_200  # about three steps besides the task
    out = run(TruncationStrategy(), msgs, facts=ModelFacts(window, 0)).messages
    assert call_ids(out) == [f"c{n}" for n in range(10)][-len(call_ids(out)) :]
    assert 1 <= len(call_ids(out)) < 10
    assert_task_and_newest_step_kept(msgs, out)


def test_a_final_answer_is_the_newest_step() -> None:
    msgs = loop(4, final_text=True)
    out = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=0), msgs).messages
    assert call_ids(out) == []  # every tool step is older than the final answer
    assert out == [msgs[0], msgs[1], msgs[-1]]


def test_the_default_pipeline_fits_a_long_loop_and_is_idempotent() -> None:
    msgs = loop(60)
    pipeline = build_pipeline(CompactionSettings())
    facts = ModelFacts(8_000, 500)
    result = run_pipeline(pipeline, msgs, facts)
    assert result.changed and result.report.tokens_after <= result.report.budget
    assert_task_and_newest_step_kept(msgs, result.messages)
    assert not run_pipeline(pipeline, result.messages, facts).changed


def run_pipeline(pipeline: Any, msgs: list[Msg], facts: ModelFacts) -> Any:
    from compaction_proxy.compaction import CharacterEstimatorTokenizer, CompactionRequest, compact

    return compact(
        CompactionRequest(
            msgs, model="m", pipeline=pipeline, tokenizer=CharacterEstimatorTokenizer(), facts=facts
        )
    )
