from __future__ import annotations

import dataclasses

import orjson
import pytest

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionSettings,
    Mode,
    ModelCatalog,
    ModelFacts,
    Pipeline,
    TokenizerProvider,
    build_pipeline,
    compact,
)
from compaction_proxy.compaction.strategies import SlidingWindowStrategy, TruncationStrategy
from compaction_proxy.compaction.triggers import TokenRatio, TurnsExceed

from .helpers import a, call, contents, s, tool, u

TOK = CharacterEstimatorTokenizer()


def conversation(turns: int, size: int = 200) -> list[dict[str, object]]:
    msgs: list[dict[str, object]] = [s("system prompt")]
    for i in range(turns):
        msgs += [
            u(f"question {i} " + "q" * size),
            call(f"c{i}"),
            tool(f"c{i}", "r" * size),
            a(f"answer {i} " + "a" * size),
        ]
    return msgs


def facts_for(messages: list[dict[str, object]], ratio: float) -> ModelFacts:
    """A model whose budget makes ``messages`` fill ``ratio`` of it."""
    return ModelFacts(context_window=int(TOK.count_messages(messages) / ratio), max_output_tokens=0)


def run(
    messages: list[dict[str, object]],
    pipeline: Pipeline,
    facts: ModelFacts,
    mode: Mode = Mode.NORMAL,
):
    return compact(
        CompactionRequest(
            messages,
            model="m",
            pipeline=pipeline,
            tokenizer=TOK,
            facts=facts,
            reserve_ratio=0,
            mode=mode,
        )
    )


def test_nothing_fires_forwards_the_original() -> None:
    msgs = conversation(3)
    pipeline = build_pipeline(CompactionSettings())
    result = run(msgs, pipeline, facts_for(msgs, 0.5))
    assert not result.changed
    assert all(x is y for x, y in zip(result.messages, msgs, strict=True))
    assert result.report.tokens_before == result.report.tokens_after
    assert [r.skipped for r in result.report.strategies] == ["trigger"] * 4


def test_default_pipeline_fires_at_80_and_compacts_towards_50() -> None:
    msgs = conversation(10)
    facts = facts_for(msgs, 0.85)
    result = run(msgs, build_pipeline(CompactionSettings()), facts)
    assert result.changed
    report = result.report
    assert report.tokens_after <= 0.5 * report.budget
    names = [r.name for r in report.strategies]
    assert names == ["context_pruning", "tool_result_compaction", "summarization", "truncation"]
    pruning, collapse, summarization, truncation = report.strategies
    assert pruning.fired and not pruning.changed  # results far below minPrunableToolChars
    # collapsing 200-character results saves under 2 % of the budget: undone, the prefix stays
    assert collapse.fired and not collapse.changed
    assert any("under the minimum" in n for n in collapse.notes)
    # the synchronous compact has no summarizer: skipped with a note, nothing faked
    assert summarization.fired and not summarization.changed and not summarization.failed
    assert any("summarizer not available" in n for n in summarization.notes)
    assert truncation.fired and truncation.changed
    assert report.fallback is None
    assert result.messages[0] == msgs[0]
    # the newest turn is intact
    assert result.messages[-4:] == msgs[-4:]
    assert report.changed_by == ("truncation",)


def test_output_is_idempotent_and_deterministic() -> None:
    msgs = conversation(12)
    facts = facts_for(msgs, 1.3)
    pipeline = build_pipeline(CompactionSettings())
    first = run(msgs, pipeline, facts)
    again = run(msgs, pipeline, facts)
    assert orjson.dumps(first.messages) == orjson.dumps(again.messages)
    second = run(first.messages, pipeline, facts)
    assert not second.changed


def test_early_stop_skips_later_strategies_once_the_budget_holds() -> None:
    msgs = conversation(10)
    facts = facts_for(msgs, 1.2)
    pipeline = Pipeline((TruncationStrategy(), SlidingWindowStrategy(keep_last_groups=1)))
    report = run(msgs, pipeline, facts).report
    assert report.strategies[0].changed
    assert report.strategies[1].skipped == "early_stop"
    assert report.tokens_after <= report.budget
    no_stop = Pipeline(pipeline.strategies, early_stop=False)
    report2 = run(msgs, no_stop, facts).report
    assert report2.strategies[1].fired


def test_triggers_below_budget_still_run_before_any_change() -> None:
    msgs = conversation(6)
    pipeline = Pipeline((SlidingWindowStrategy(trigger=TurnsExceed(2)),))
    result = run(msgs, pipeline, facts_for(msgs, 0.2))
    assert result.changed
    assert sum(1 for m in result.messages if m["role"] == "user") == 2


def test_fallback_truncation_when_strategies_do_not_fit() -> None:
    msgs = conversation(8)
    pipeline = Pipeline((SlidingWindowStrategy(trigger=TurnsExceed(100)),))
    result = run(msgs, pipeline, facts_for(msgs, 1.5))
    report = result.report
    assert report.fallback is not None and report.fallback.changed
    assert report.fallback.name == "fallback_truncation"
    assert report.tokens_after <= report.budget
    assert not report.warnings


def test_unreachable_budget_sends_the_smallest_valid_request_with_a_warning() -> None:
    msgs = [s("S" * 4000), u("old"), a("old answer"), u("U" * 4000)]
    facts = ModelFacts(context_window=500, max_output_tokens=0)
    result = run(msgs, Pipeline(()), facts)
    assert contents(result.messages) == ["S" * 4000, "U" * 4000]
    assert any("over budget" in w for w in result.report.warnings)
    assert not run(result.messages, Pipeline(()), facts).changed


def test_force_treats_triggers_as_fired() -> None:
    msgs = conversation(5)
    pipeline = Pipeline((TruncationStrategy(trigger=TokenRatio(0.99)),))
    facts = facts_for(msgs, 0.3)
    assert not run(msgs, pipeline, facts).changed
    forced = run(msgs, pipeline, facts, Mode.FORCE)
    assert forced.changed
    # down to the invariants: the system prompt, the newest user message, the newest step
    assert forced.messages == [msgs[0], msgs[-4], msgs[-1]]
    assert forced.report.mode == "force"


def test_dry_run_computes_the_same_result() -> None:
    msgs = conversation(10)
    facts = facts_for(msgs, 1.3)
    pipeline = build_pipeline(CompactionSettings())
    normal = run(msgs, pipeline, facts)
    dry = run(msgs, pipeline, facts, Mode.DRY_RUN)
    assert dry.messages == normal.messages
    assert dry.report.mode == "dry-run"


def test_tools_count_into_the_budget(o200k) -> None:
    msgs = conversation(2)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with_tools = compact(
        CompactionRequest(msgs, model="gpt-4o", pipeline=Pipeline(()), tokenizer=o200k, tools=tools)
    )
    without = compact(
        CompactionRequest(msgs, model="gpt-4o", pipeline=Pipeline(()), tokenizer=o200k)
    )
    assert with_tools.report.tokens_before == without.report.tokens_before + o200k.count_tools(
        tools
    )


def test_provider_and_catalog_pick_encoding_and_window(provider: TokenizerProvider) -> None:
    msgs = conversation(1)
    result = compact(
        CompactionRequest(
            msgs,
            model="gpt-4-0613",
            pipeline=Pipeline(()),
            tokenizer=provider,
            facts=ModelCatalog(),
            max_tokens=1000,
        )
    )
    assert result.report.tokenizer == "cl100k_base"
    assert result.report.context_window == 8192
    assert result.report.output_reserve == 1000
    assert result.report.budget == 8192 - 1000 - int(0.05 * 8192)


def test_report_is_json_ready_and_nested_pipeline_reports_children() -> None:
    msgs = conversation(6)
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "pipeline",
                    "strategies": [
                        {"strategy": "sliding_window", "keep_last_turns": 3},
                        {"strategy": "truncation", "trigger": {"turns_exceed": 1}},
                    ],
                },
            ]
        }
    )
    result = run(msgs, build_pipeline(settings), facts_for(msgs, 0.3))
    data = result.report.to_dict()
    orjson.dumps(data)
    nested = data["strategies"][0]
    assert nested["name"] == "pipeline"
    assert [c["name"] for c in nested["children"]] == ["sliding_window", "truncation"]
    assert nested["children"][0]["changed"]
    # a plain pipeline runs every child by its own trigger (never an early stop)
    assert nested["children"][1]["fired"] and "skipped" not in nested["children"][1]


def test_calibration_changes_trigger_decisions() -> None:
    from compaction_proxy.compaction import Calibration

    msgs = conversation(6)
    facts = facts_for(msgs, 0.7)
    pipeline = Pipeline((TruncationStrategy(trigger=TokenRatio(0.8), target=TokenRatio(0.5)),))
    assert not run(msgs, pipeline, facts).changed
    calibrated = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=pipeline,
            tokenizer=TOK,
            facts=facts,
            reserve_ratio=0,
            calibration=Calibration(1.25),
        )
    )
    assert calibrated.changed
    assert calibrated.report.calibration == 1.25


@pytest.mark.parametrize("turns", [1, 3])
def test_short_conversations_never_lose_their_task_or_newest_step(turns: int) -> None:
    msgs = conversation(turns)
    result = run(msgs, Pipeline(()), ModelFacts(10, 0))
    assert result.messages == [msgs[0], msgs[-4], msgs[-1]]
    assert result.report.warnings  # still over: the smallest valid request, and it says so


def test_last_resort_trims_a_huge_newest_tool_result_to_fit() -> None:
    log = "".join(f"line {n}: compiling module {n}\n" for n in range(3000))
    msgs = [s("system prompt"), u("fix the build"), call("c1"), tool("c1", log)]
    result = run(msgs, build_pipeline(CompactionSettings()), ModelFacts(4_000, 500))
    assert result.changed
    assert result.report.tokens_after <= result.report.budget
    trimmed = result.messages[3]
    assert trimmed["tool_call_id"] == "c1" and "soft-trimmed" in trimmed["content"]
    assert trimmed["content"].startswith("line 0:") and trimmed["content"].endswith("2999\n")
    assert result.messages[:3] == msgs[:3]  # system, task and the call are never cut
    assert any("soft-trimmed" in w for w in result.report.warnings)
    assert "last_resort_trim" in result.report.changed_by
    again = run(result.messages, build_pipeline(CompactionSettings()), ModelFacts(4_000, 500))
    assert not again.changed


def test_last_resort_never_cuts_user_text() -> None:
    msgs = [s("system prompt"), u("x" * 40_000), call("c1"), tool("c1", "y" * 20_000)]
    result = run(msgs, Pipeline(()), ModelFacts(4_000, 500))
    assert result.messages[1] is msgs[1]
    assert result.report.tokens_after > result.report.budget
    assert any(w.startswith("over budget") for w in result.report.warnings)


# ---------------------------------------------------------------- token-budget composition


def test_token_budget_keeps_system_and_newest_turn_with_a_warning() -> None:
    # Agent Framework: [S*100, U*100] with budget 1 -> [U] (its strict fallback drops the
    # system message).  We never drop it (DESIGN invariant 1) and say so in the report.
    from compaction_proxy.compaction.strategies import PipelineStrategy

    msgs = [s("S" * 100), u("U" * 100)]
    budget = PipelineStrategy([TruncationStrategy()], token_budget=1)
    result = run(msgs, Pipeline((budget,), fallback=False), ModelFacts(10_000, 0))
    assert not result.changed
    assert result.messages == msgs
    assert any("over its budget" in w for w in result.report.warnings)
    alone = run([s("S" * 100)], Pipeline((budget,), fallback=False), ModelFacts(10_000, 0))
    assert not alone.changed


def test_token_budget_entry_from_settings_runs_children_then_its_fallback() -> None:
    msgs = conversation(8)
    total = TOK.count_messages(msgs)
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "pipeline",
                    "token_budget": total // 2,
                    "strategies": [
                        {"strategy": "tool_result_compaction", "keep_last_tool_call_groups": 1},
                        {"strategy": "selective_tool_calls", "trigger": "never"},
                    ],
                }
            ],
            "min_saving": 0,  # the composition itself, not the minimum saving, is under test
        }
    )
    pipeline = build_pipeline(settings)
    result = run(msgs, pipeline, ModelFacts(10 * total, 0))
    report = result.report.strategies[0]
    assert [c.name for c in report.children] == [
        "tool_result_compaction",
        "selective_tool_calls",
        "fallback_truncation",
    ]
    assert report.children[0].changed and report.children[2].changed
    assert result.report.tokens_after <= total // 2
    assert not run(result.messages, pipeline, ModelFacts(10 * total, 0)).changed


def test_token_budget_early_stop() -> None:
    msgs = conversation(8)
    total = TOK.count_messages(msgs)
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "pipeline",
                    "token_budget": total - 10,
                    "strategies": [
                        {"strategy": "tool_result_compaction"},
                        {"strategy": "truncation", "trigger": "always"},
                    ],
                }
            ],
            "min_saving": 0,  # the composition itself, not the minimum saving, is under test
        }
    )
    report = run(msgs, build_pipeline(settings), ModelFacts(10 * total, 0)).report
    children = report.strategies[0].children
    assert [c.skipped for c in children] == [None, "early_stop"]


def test_hysteresis_lets_later_strategies_finish_what_the_first_started() -> None:
    """Fire at 0.8, compact to 0.5 in one go: a first strategy that only nudges the count
    under the trigger must not stop the rest (each would otherwise re-fire a few turns later,
    giving the upstream a new prefix every time)."""
    from compaction_proxy.compaction import CompactionSettings, build_pipeline
    from compaction_proxy.compaction.factory import default_target
    from compaction_proxy.compaction.triggers import TokenRatio

    messages = [{"role": "system", "content": "s"}]
    for i in range(12):
        messages.append({"role": "user", "content": f"q{i} " + "w " * 300})
        messages.append({"role": "assistant", "content": f"a{i} " + "w " * 300})
    facts = ModelFacts(4_400, 0)
    tokenizer = CharacterEstimatorTokenizer()
    nudge = SlidingWindowStrategy(keep_last_groups=22, trigger=TokenRatio(0.8))
    finish = TruncationStrategy(trigger=TokenRatio(0.8), target=default_target())
    flat = Pipeline((nudge, finish), stop_when=default_target(), fallback=False)
    gated = dataclasses.replace(flat, hysteresis=True)
    common = {"model": "m", "tokenizer": tokenizer, "facts": facts, "reserve_ratio": 0}
    budget_tokens = 4_400
    with_flat = compact(CompactionRequest(messages, pipeline=flat, **common))
    with_gate = compact(CompactionRequest(messages, pipeline=gated, **common))
    assert with_flat.report.tokens_before >= 0.8 * budget_tokens
    assert with_flat.report.changed_by == ("sliding_window",)  # stopped just under 0.8
    assert with_flat.report.tokens_after > 0.5 * budget_tokens
    assert with_gate.report.changed_by == ("sliding_window", "truncation")
    assert with_gate.report.tokens_after <= 0.5 * budget_tokens
    assert build_pipeline(CompactionSettings()).hysteresis is True
