"""Clear tool uses: Anthropic's context edit, applied client-side."""

from __future__ import annotations

import json

import pytest

from compaction_proxy.compaction import CompactionSettings, build_pipeline
from compaction_proxy.compaction.strategies import ClearToolUsesStrategy
from compaction_proxy.compaction.triggers import Always, TokensExceed

from .helpers import Msg, a, call, s, tool, u
from .strategy_helpers import run

PH = "[Old tool result content cleared]"


def five_results() -> list[Msg]:
    msgs: list[Msg] = [s(), u("go")]
    for i in range(5):
        name = "read_file" if i % 2 == 0 else "search"
        msgs += [
            call(f"c{i}", name=name, args=json.dumps({"path": f"/f{i}" * 20})),
            {**tool(f"c{i}", f"result {i} " + "r" * 400), "x-meta": i},
        ]
    msgs += [a("done"), u("next")]
    return msgs


def results(msgs: list[Msg]) -> list[str]:
    return [m["content"] for m in msgs if m["role"] == "tool"]


def test_keep_three_clears_the_two_oldest() -> None:
    msgs = five_results()
    out = run(ClearToolUsesStrategy(keep=3, trigger=Always()), msgs).messages
    assert results(out)[:2] == [PH, PH]
    assert results(out)[2:] == results(msgs)[2:]
    assert out[3] == {"role": "tool", "tool_call_id": "c0", "content": PH, "x-meta": 0}
    assert out[2] is msgs[2]  # arguments untouched without clear_tool_inputs


def test_exclude_tools_and_keep_zero() -> None:
    out = run(
        ClearToolUsesStrategy(keep=0, exclude_tools=["search"], trigger=Always()), five_results()
    ).messages
    assert [c == PH for c in results(out)] == [True, False, True, False, True]


def test_clear_tool_inputs_replaces_only_cleared_calls_arguments() -> None:
    msgs = five_results()
    out = run(
        ClearToolUsesStrategy(keep=3, clear_tool_inputs=True, trigger=Always()), msgs
    ).messages
    assert out[2]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": "{}"}
    assert out[2]["tool_calls"][0]["id"] == "c0"
    assert out[6] is msgs[6]
    for message in out:
        for c in message.get("tool_calls") or []:
            json.loads(c["function"]["arguments"])


def test_parallel_calls_are_cleared_per_result() -> None:
    msgs = [
        u(),
        call("p1", "p2", args='{"q": "long long long long"}'),
        tool("p1", "x" * 300),
        tool("p2", "y" * 300),
        u("last"),
    ]
    out = run(
        ClearToolUsesStrategy(keep=1, clear_tool_inputs=True, trigger=Always()), msgs
    ).messages
    assert [c["function"]["arguments"] for c in out[1]["tool_calls"]] == [
        "{}",
        '{"q": "long long long long"}',
    ]
    assert results(out) == [PH, "y" * 300]


def test_clear_at_least_guards_small_clears() -> None:
    msgs = five_results()
    strategy = ClearToolUsesStrategy(keep=4, clear_at_least=500, trigger=Always())
    result = run(strategy, msgs)
    assert not result.changed
    assert "clear_at_least" in result.report.strategies[0].notes[0]
    assert run(ClearToolUsesStrategy(keep=3, clear_at_least=150, trigger=Always()), msgs).changed


def test_target_stops_early_but_not_before_clear_at_least() -> None:
    msgs = five_results()
    before = run(ClearToolUsesStrategy(keep=0, trigger=Always()), msgs).report.tokens_before
    one = run(
        ClearToolUsesStrategy(keep=0, trigger=Always(), target=TokensExceed(before - 50)), msgs
    ).messages
    assert [c == PH for c in results(one)] == [True, False, False, False, False]
    two = run(
        ClearToolUsesStrategy(
            keep=0, clear_at_least=150, trigger=Always(), target=TokensExceed(before - 50)
        ),
        msgs,
    ).messages
    assert [c == PH for c in results(two)] == [True, True, False, False, False]


def test_custom_placeholder_idempotence_and_small_results() -> None:
    msgs = [*five_results(), call("z"), tool("z", "ok"), u("last")]
    strategy = ClearToolUsesStrategy(
        keep=0, placeholder="[gone]", clear_tool_inputs=True, trigger=Always()
    )
    first = run(strategy, msgs)
    assert results(first.messages)[:5] == ["[gone]"] * 5
    assert not run(strategy, first.messages).changed


def test_the_newest_turn_is_never_cleared() -> None:
    msgs = [u(), call("c1"), tool("c1", "x" * 300), u("last"), call("c2"), tool("c2", "y" * 300)]
    out = run(ClearToolUsesStrategy(keep=0, trigger=Always()), msgs).messages
    assert results(out) == [PH, "y" * 300]


def test_default_trigger_is_over_budget_and_entry_builds() -> None:
    assert not run(ClearToolUsesStrategy(keep=0), five_results()).changed
    pipeline = build_pipeline(
        CompactionSettings.model_validate(
            {
                "pipeline": [
                    {
                        "strategy": "clear_tool_uses",
                        "keep": 1,
                        "exclude_tools": ["search"],
                        "clear_at_least": 10,
                        "clear_tool_inputs": True,
                        "placeholder": "[x]",
                        "trigger": {"tokens_exceed": 10},
                    }
                ]
            }
        )
    )
    out = run(pipeline.strategies[0], five_results()).messages
    assert results(out)[:4] == [
        "[x]",
        results(five_results())[1],
        "[x]",
        results(five_results())[3],
    ]


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        ClearToolUsesStrategy(keep=-1)
    with pytest.raises(ValueError):
        ClearToolUsesStrategy(clear_at_least=-1)
