"""Context pruning: LibreChat's position-based soft trim / hard clear (librechat.md section 2)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction import (
    CompactionSettings,
    ModelFacts,
    SummarizationSettings,
    build_pipeline,
)
from compaction_proxy.compaction.strategies import ContextPruningStrategy
from compaction_proxy.compaction.strategies.context_pruning import (
    assistant_protection_start,
    soft_trim,
    trimmed_original_length,
)
from compaction_proxy.compaction.triggers import Always, TokensExceed

from .helpers import Msg, a, call, s, tool, u
from .strategy_helpers import run

BIG = "".join(chr(ord("a") + i % 26) for i in range(300))
SMALL = dict(
    min_prunable_tool_chars=100,
    soft_trim_max_chars=50,
    soft_trim_head_chars=10,
    soft_trim_tail_chars=10,
)
MARKER_300 = "\n\n… [soft-trimmed: 300 chars → 20 chars, middle removed] …\n\n"


def pruning(**kwargs: Any) -> ContextPruningStrategy:
    params: dict[str, Any] = {**SMALL, "keep_last_assistants": 0, "trigger": Always()}
    params.update(kwargs)
    return ContextPruningStrategy(**params)


def twenty() -> list[Msg]:
    """N = 20; tool results at 3 (age .85), 11 (age .45) and 15 (age .25)."""
    msgs = [
        s(),
        u(),
        call("c0"),
        {**tool("c0", BIG), "x-extra": 1},
        a(),
        u(),
        a(),
        u(),
        a(),
        u(),
        call("c1"),
        tool("c1", BIG),
        a(),
        u(),
        call("c2"),
        tool("c2", BIG),
        a(),
        u(),
        a(),
        u("last"),
    ]
    assert len(msgs) == 20
    return msgs


def test_ages_decide_hard_clear_soft_trim_or_nothing() -> None:
    msgs = twenty()
    result = run(pruning(), msgs)
    out = result.messages
    assert out[3] == {
        "role": "tool",
        "tool_call_id": "c0",
        "content": "[Old tool result content cleared]",
        "x-extra": 1,
    }
    assert out[11]["content"] == BIG[:10] + MARKER_300 + BIG[-10:]
    assert out[11]["tool_call_id"] == "c1"
    assert out[15] is msgs[15]
    assert all(out[i] is msgs[i] for i in range(20) if i not in (3, 11))
    assert [n for r in result.report.strategies for n in r.notes] == [
        "soft-trimmed 1 tool result(s)",
        "hard-cleared 1 tool result(s)",
    ]


def test_keep_last_assistants_protects_the_last_steps() -> None:
    msgs = twenty()  # assistant messages (steps) at 2, 4, 6, 8, 10, 12, 14, 16, 18
    assert assistant_protection_start(msgs, 1) == 18
    assert assistant_protection_start(msgs, 2) == 16
    assert assistant_protection_start(msgs, 3) == 14
    assert assistant_protection_start(msgs, 5) == 10
    assert assistant_protection_start(msgs, 0) == 20
    assert assistant_protection_start(msgs, 10) == 0
    out = run(pruning(keep_last_assistants=3), msgs).messages
    assert out[3]["content"] == "[Old tool result content cleared]"
    assert out[11]["content"] == BIG[:10] + MARKER_300 + BIG[-10:]  # step 4 from the end
    assert out[15] is msgs[15]
    out = run(pruning(keep_last_assistants=5), msgs).messages
    assert out[11] is msgs[11]


def test_keep_last_assistants_counts_steps_inside_one_agent_loop() -> None:
    # One task, then five tool steps in the same turn: LibreChat's run counting would see a
    # single run and protect all of it; steps let the older results age.
    msgs: list[Msg] = [s(), u("fix the tests")]
    for n in range(5):
        msgs += [call(f"c{n}"), tool(f"c{n}", BIG)]
    assert assistant_protection_start(msgs, 2) == 8
    out = run(pruning(keep_last_assistants=2), msgs).messages
    assert out[3]["content"] == "[Old tool result content cleared]"  # age 9/12
    assert out[9] is msgs[9] and out[11] is msgs[11]  # the two newest steps
    assert out[1] is msgs[1]  # the task


def test_keep_zero_protects_no_run_unlike_librechat_quirk() -> None:
    msgs = [s(), u(), call("c0"), tool("c0", BIG), u("last")]  # age of the result: 2/5
    out = run(pruning(), msgs).messages
    assert out[3]["content"] == BIG[:10] + MARKER_300 + BIG[-10:]


def test_everything_before_the_first_user_message_is_protected() -> None:
    msgs = [s(), call("c0"), tool("c0", BIG), u(), a(), u(), a(), u(), a(), u("last")]
    assert not run(pruning(), msgs).changed


def test_min_prunable_chars_is_per_result() -> None:
    msgs = twenty()
    msgs[3] = tool("c0", BIG[:99])
    out = run(pruning(), msgs).messages
    assert out[3] is msgs[3]


def test_hard_clear_disabled_soft_trims_old_results() -> None:
    out = run(pruning(hard_clear_enabled=False), twenty()).messages
    assert out[3]["content"] == BIG[:10] + MARKER_300 + BIG[-10:]


def test_custom_soft_trim_and_placeholder_are_honoured() -> None:
    out = run(
        pruning(soft_trim_head_chars=3, soft_trim_tail_chars=0, placeholder="[gone]"), twenty()
    ).messages
    assert out[3]["content"] == "[gone]"
    assert out[11]["content"] == (
        BIG[:3] + "\n\n… [soft-trimmed: 300 chars → 3 chars, middle removed] …\n\n"
    )


def test_soft_trim_only_when_it_shortens() -> None:
    msgs = twenty()
    out = run(pruning(soft_trim_head_chars=150, soft_trim_tail_chars=150), msgs).messages
    assert out[11] is msgs[11]


def test_images_are_never_hard_cleared_but_their_text_is_trimmed() -> None:
    msgs = twenty()
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    msgs[3] = tool("c0", "")
    msgs[3]["content"] = [
        {"type": "text", "text": BIG[:150]},
        image,
        {"type": "text", "text": BIG[150:]},
    ]
    out = run(pruning(), msgs).messages
    joined = BIG[:150] + "\n" + BIG[150:]
    assert out[3]["content"] == [
        {"type": "text", "text": joined[:10] + MARKER_300.replace("300", "301") + joined[-10:]},
        image,
    ]


def test_text_part_arrays_keep_the_last_parts_extra_keys() -> None:
    msgs = twenty()
    msgs[11] = tool("c1", "")
    msgs[11]["content"] = [
        {"type": "text", "text": BIG},
        {"type": "text", "text": "", "cache_control": {"type": "ephemeral"}},
    ]
    out = run(pruning(), msgs).messages
    assert out[11]["content"] == [
        {
            "type": "text",
            "cache_control": {"type": "ephemeral"},
            "text": BIG[:10] + MARKER_300.replace("300", "301") + BIG[-9:] + "\n",
        }
    ]


def test_idempotent_and_a_trimmed_result_is_only_ever_hard_cleared() -> None:
    strategy = pruning()
    first = run(strategy, twenty()).messages
    assert not run(strategy, first).changed
    # the conversation grows: the trimmed result ages past hardClearRatio
    grown = [*first, a(), u(), a(), u(), a(), u(), a(), u(), a(), u("newest")]
    out = run(strategy, grown).messages
    assert out[11]["content"] == "[Old tool result content cleared]"
    assert out[3] is grown[3]
    # ... but a trimmed result that is not old enough for a clear is never trimmed again
    few = [*first, a()]  # N = 21: the trimmed result's age is 10/21 < hardClearRatio
    second = run(pruning(min_prunable_tool_chars=0), few)
    assert second.messages[11] is few[11]


def test_marker_helpers() -> None:
    trimmed = soft_trim("é" * 100 + "😀" * 100, 5, 5)
    assert (
        trimmed == "é" * 5 + "\n\n… [soft-trimmed: 200 chars → 10 chars, middle removed] …"
        "\n\n" + "😀" * 5
    )
    assert trimmed_original_length(trimmed) == 200
    assert trimmed_original_length("plain") is None


def test_orphans_and_the_newest_turn_are_left_alone() -> None:
    msgs = [
        s(),
        u(),
        a(),
        tool("ghost", BIG),
        u(),
        a(),
        u(),
        a(),
        u(),
        a(),
        u("last"),
        call("c9"),
        tool("c9", BIG),
    ]
    assert not run(pruning(), msgs).changed


def test_target_stops_after_the_oldest_results() -> None:
    msgs = twenty()
    full = run(pruning(), msgs)
    after_first = full.report.tokens_before - 60
    result = run(pruning(trigger=Always(), target=TokensExceed(after_first)), msgs)
    assert result.messages[3]["content"] == "[Old tool result content cleared]"
    assert result.messages[11] is msgs[11]


def test_default_trigger_is_over_budget() -> None:
    msgs = twenty()
    strategy = ContextPruningStrategy(**SMALL, keep_last_assistants=0)
    assert not run(strategy, msgs).changed
    tight = ModelFacts(
        context_window=run(strategy, msgs).report.tokens_before - 1, max_output_tokens=0
    )
    assert run(strategy, msgs, facts=tight).changed


def test_librechat_block_shapes_the_default_pipeline_entry() -> None:
    block = SummarizationSettings.model_validate(
        {
            "contextPruning": {
                "enabled": True,
                "keepLastAssistants": 0,
                "softTrimRatio": 0.25,
                "hardClearRatio": 0.6,
                "minPrunableToolChars": 100,
                "softTrim": {"maxChars": 50, "headChars": 4, "tailChars": 4},
                "hardClear": {"enabled": True, "placeholder": "[Content removed]"},
            }
        }
    )
    strategy = build_pipeline(CompactionSettings(), block).strategies[0]
    assert isinstance(strategy, ContextPruningStrategy)
    assert (
        strategy.soft_trim_ratio,
        strategy.hard_clear_ratio,
        strategy.max_chars,
        strategy.head_chars,
        strategy.tail_chars,
        strategy.placeholder,
    ) == (0.25, 0.6, 50, 4, 4, "[Content removed]")
    disabled = SummarizationSettings.model_validate({"contextPruning": {"enabled": False}})
    assert [x.name for x in build_pipeline(CompactionSettings(), disabled).strategies] == [
        "tool_result_compaction",
        "summarization",
        "truncation",
    ]


def test_pipeline_entry_accepts_camel_case_keys() -> None:
    pipeline = build_pipeline(
        CompactionSettings.model_validate(
            {
                "pipeline": [
                    {
                        "strategy": "context_pruning",
                        "trigger": "always",
                        "keepLastAssistants": 0,
                        "minPrunableToolChars": 100,
                        "softTrim": {"maxChars": 50, "headChars": 10, "tailChars": 10},
                        "hardClear": {"placeholder": "[cleared]"},
                    }
                ]
            }
        )
    )
    result = run(pipeline.strategies[0], twenty())
    assert result.messages[3]["content"] == "[cleared]"
    off = build_pipeline(
        CompactionSettings.model_validate(
            {"pipeline": [{"strategy": "context_pruning", "enabled": False, "trigger": "always"}]}
        )
    )
    assert not run(off.strategies[0], twenty()).changed


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        ContextPruningStrategy(soft_trim_ratio=1.5)
    with pytest.raises(ValueError):
        ContextPruningStrategy(soft_trim_head_chars=-1)
