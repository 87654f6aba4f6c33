from __future__ import annotations

import pytest
from pydantic import ValidationError

from compaction_proxy.compaction import CompactionSettings, SummarizationSettings, build_pipeline
from compaction_proxy.compaction.factory import default_pipeline_entries
from compaction_proxy.compaction.strategies import (
    StrategyRegistry,
    TruncationStrategy,
    UnknownStrategy,
    default_registry,
)
from compaction_proxy.compaction.triggers import RemainingTokens, TokenRatio

SEED = {
    "provider": "openAI",
    "model": "gpt-4o-mini",
    "maxSummaryTokens": 4096,
    "reserveRatio": 0.05,
    "trigger": {"type": "token_ratio", "value": 0.8},
    "contextPruning": {
        "enabled": True,
        "keepLastAssistants": 3,
        "softTrimRatio": 0.3,
        "hardClearRatio": 0.5,
        "minPrunableToolChars": 50000,
        "softTrim": {"maxChars": 4000, "headChars": 1500, "tailChars": 1500},
        "hardClear": {"enabled": True, "placeholder": "[Old tool result content cleared]"},
    },
}


def test_librechat_seed_block_validates() -> None:
    block = SummarizationSettings.model_validate(SEED)
    assert block.trigger == TokenRatio(0.8)
    assert block.context_pruning.soft_trim.head_chars == 1500
    assert block.max_summary_tokens == 4096
    assert (
        block.model_dump(mode="json", exclude_none=True)["contextPruning"]["softTrim"]
        == SEED["contextPruning"]["softTrim"]
    )  # type: ignore[index]


def test_librechat_defaults() -> None:
    """LibreChat's defaults, except pruning on by default (it runs before summarization here)."""
    block = SummarizationSettings()
    assert block.enabled and block.reserve_ratio == 0.05 and block.trigger is None
    assert block.retain_recent.turns == 2
    pruning = block.context_pruning
    assert (
        pruning.enabled,
        pruning.keep_last_assistants,
        pruning.soft_trim_ratio,
        pruning.hard_clear_ratio,
        pruning.min_prunable_tool_chars,
    ) == (True, 3, 0.3, 0.5, 50_000)
    assert pruning.hard_clear.placeholder == "[Old tool result content cleared]"


@pytest.mark.parametrize(
    ("block", "loc"),
    [
        ({"reserveRatio": 1.5}, ("reserveRatio",)),
        ({"maxSummaryTokens": 0}, ("maxSummaryTokens",)),
        ({"retainRecent": {"turns": 21}}, ("retainRecent", "turns")),
        ({"contextPruning": {"keepLastAssistants": 11}}, ("contextPruning", "keepLastAssistants")),
        ({"contextPruning": {"softTrimRatio": 2}}, ("contextPruning", "softTrimRatio")),
        (
            {"contextPruning": {"softTrim": {"maxChars": -1}}},
            ("contextPruning", "softTrim", "maxChars"),
        ),
        ({"contextPruning": {"unknown": 1}}, ("contextPruning", "unknown")),
        ({"trigger": {"type": "token_count", "value": 10}}, ("trigger",)),
        ({"bogus": True}, ("bogus",)),
    ],
)
def test_librechat_validation_names_the_key_path(
    block: dict[str, object], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as info:
        SummarizationSettings.model_validate(block)
    assert info.value.errors()[0]["loc"] == loc


def test_every_strategy_name_validates() -> None:
    names = default_registry().names
    entries = [{"strategy": name} for name in names]
    entries[names.index("sliding_window")]["keep_last_groups"] = 3
    entries[names.index("pipeline")]["strategies"] = []
    settings = CompactionSettings.model_validate({"pipeline": entries})
    assert [e.strategy for e in settings.pipeline or []] == list(names)


def test_af_parameter_names_and_both_trigger_forms() -> None:
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "tool_result_compaction",
                    "trigger": {"tokens_exceed": 512},
                    "keep_last_tool_call_groups": 1,
                },
                {
                    "strategy": "summarization",
                    "trigger": {"token_ratio": 0.8},
                    "target": {"type": "token_ratio", "value": 0.5},
                    "target_count": 4,
                    "threshold": 2,
                },
                {"strategy": "sliding_window", "trigger": {"turns_exceed": 4}},
                {"strategy": "truncation", "max_n": 32768, "compact_to": 16000},
                {"strategy": "selective_tool_calls", "keep_last_tool_call_groups": 0},
                {
                    "strategy": "clear_tool_uses",
                    "keep": 2,
                    "exclude_tools": ["search"],
                    "clear_at_least": 1000,
                    "clear_tool_inputs": True,
                },
                {
                    "strategy": "context_pruning",
                    "keepLastAssistants": 2,
                    "soft_trim": {"max_chars": 100, "head_chars": 10, "tail_chars": 10},
                },
            ]
        }
    )
    assert settings.pipeline is not None
    assert settings.pipeline[1].target == TokenRatio(0.5)


@pytest.mark.parametrize(
    ("entry", "loc_tail"),
    [
        ({"strategy": "truncation", "max_n": 10, "compact_to": 20}, ("truncation",)),
        ({"strategy": "truncation", "preserve_system": False}, ("truncation",)),
        ({"strategy": "truncation", "maxN": 10}, ("truncation", "maxN")),
        ({"strategy": "sliding_window"}, ("sliding_window",)),
        (
            {"strategy": "sliding_window", "keep_last_groups": 0},
            ("sliding_window", "keep_last_groups"),
        ),
        (
            {"strategy": "tool_result_compaction", "keep_last_tool_call_groups": -1},
            ("tool_result_compaction", "keep_last_tool_call_groups"),
        ),
        ({"strategy": "truncation", "target": {"tokens_below": 5}}, ("truncation", "target")),
        (
            {"strategy": "pipeline", "strategies": [{"strategy": "truncation", "x": 1}]},
            ("pipeline", "strategies", 0, "truncation", "x"),
        ),
    ],
)
def test_pipeline_entry_errors(entry: dict[str, object], loc_tail: tuple[object, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        CompactionSettings.model_validate({"pipeline": [entry]})
    assert info.value.errors()[0]["loc"] == ("pipeline", 0, *loc_tail)


def test_default_pipeline_entries_follow_the_librechat_block() -> None:
    entries = default_pipeline_entries(SummarizationSettings())
    assert [e.strategy for e in entries] == [
        "context_pruning",
        "tool_result_compaction",
        "summarization",
        "truncation",
    ]
    assert all(e.trigger == TokenRatio(0.8) and e.target == TokenRatio(0.5) for e in entries)
    off = SummarizationSettings.model_validate(
        {
            "contextPruning": {"enabled": False},
            "trigger": {"remaining_tokens": 8000},
            "enabled": False,
        }
    )
    entries = default_pipeline_entries(off)
    assert [e.strategy for e in entries] == ["tool_result_compaction", "truncation"]
    assert entries[0].trigger == RemainingTokens(8000)


def test_default_pipeline_is_pruning_tool_results_summarization_truncation() -> None:
    pipeline = build_pipeline(CompactionSettings())
    assert [s.name for s in pipeline.strategies] == [
        "context_pruning",
        "tool_result_compaction",
        "summarization",
        "truncation",
    ]
    assert pipeline.stop_when == TokenRatio(0.5)
    assert all(
        s.trigger == TokenRatio(0.8) and s.target == TokenRatio(0.5) for s in pipeline.strategies
    )


def test_a_registry_without_a_strategy_refuses_to_build_it() -> None:
    """The default pipeline no longer leaves out what is not registered: every built-in is, and
    a registry that lacks one (built by hand) says which, for the default pipeline too."""
    settings = CompactionSettings.model_validate({"pipeline": [{"strategy": "summarization"}]})
    with pytest.raises(UnknownStrategy, match="unknown strategy 'summarization'; known: none"):
        build_pipeline(settings, registry=StrategyRegistry())
    only_truncation = StrategyRegistry()
    spec = default_registry().spec("truncation")
    only_truncation.register("truncation", spec.params, spec.strategy)
    with pytest.raises(ValidationError, match="'context_pruning'; known: truncation"):
        build_pipeline(CompactionSettings(), registry=only_truncation)


def test_explicit_pipeline_options() -> None:
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "truncation",
                    "max_n": 100,
                    "compact_to": 50,
                    "metric": "messages",
                    "preserve_first_user_group": True,
                    "minimum_preserved": 2,
                }
            ],
            "stop_when": {"token_ratio": 0.6},
            "early_stop": True,
            "fallback_truncation": False,
        }
    )
    pipeline = build_pipeline(settings)
    strategy = pipeline.strategies[0]
    assert isinstance(strategy, TruncationStrategy)
    assert (
        strategy.max_n,
        strategy.compact_to,
        strategy.metric,
        strategy.preserve_first_user_group,
        strategy.minimum_preserved,
    ) == (100, 50, "messages", True, 2)
    assert (pipeline.stop_when, pipeline.early_stop, pipeline.fallback) == (
        TokenRatio(0.6),
        True,
        False,
    )


# ---------------------------------------------------------------- per-model overrides


def test_model_override_builds_a_pipeline() -> None:
    """A `models.<pattern>.compaction` block is a whole `compaction` block (key-path errors: see
    tests/unit/test_config.py, where start-up formats them)."""
    override = CompactionSettings.model_validate(
        {
            "pipeline": [
                {"strategy": "clear_tool_uses", "keep": 2},
                {"strategy": "selective_tool_calls", "trigger": {"tokens_exceed": 10}},
            ],
            "fallback_truncation": False,
        }
    )
    pipeline = build_pipeline(override)
    assert [s.name for s in pipeline.strategies] == ["clear_tool_uses", "selective_tool_calls"]
    assert not pipeline.fallback
    summarization = SummarizationSettings.model_validate({"contextPruning": {"enabled": False}})
    default = build_pipeline(CompactionSettings(), summarization)
    assert [s.name for s in default.strategies] == [
        "tool_result_compaction",
        "summarization",
        "truncation",
    ]


def test_context_pruning_entry_takes_the_librechat_block_as_is() -> None:
    """The pipeline entry and `summarization.contextPruning` are one model: same keys, defaults
    and ranges, written back with snake_case keys like every other entry."""
    block = {
        "enabled": False,
        "keepLastAssistants": 2,
        "softTrimRatio": 0.2,
        "hardClearRatio": 0.4,
        "minPrunableToolChars": 10,
        "softTrim": {"maxChars": 100, "headChars": 10, "tailChars": 10},
        "hardClear": {"enabled": False, "placeholder": "[x]"},
    }
    params = SummarizationSettings.model_validate({"contextPruning": block}).context_pruning
    settings = CompactionSettings.model_validate(
        {"pipeline": [{"strategy": "context_pruning", **block}]}
    )
    assert settings.pipeline is not None
    entry = settings.pipeline[0]
    assert {name: getattr(entry, name) for name in type(params).model_fields} == dict(params)
    dumped = entry.model_dump(mode="json", exclude_none=True)
    assert dumped["keep_last_assistants"] == 2 and dumped["strategy"] == "context_pruning"
    with pytest.raises(ValidationError) as info:
        CompactionSettings.model_validate(
            {"pipeline": [{"strategy": "context_pruning", "keepLastAssistants": 11}]}
        )
    assert info.value.errors()[0]["loc"] == (
        "pipeline",
        0,
        "context_pruning",
        "keepLastAssistants",
    )
