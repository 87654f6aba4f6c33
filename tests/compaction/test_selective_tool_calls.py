"""Selective tool calls: the Agent Framework's vectors plus our trigger/target."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.strategies import SelectiveToolCallsStrategy
from compaction_proxy.compaction.triggers import HasToolCalls, TokensExceed

from .helpers import a, call, contents, s, tool, u
from .strategy_helpers import run


def two_pairs() -> list[dict[str, object]]:
    return [
        s(),
        u("q1"),
        call("c1"),
        tool("c1", "r1"),
        a("a1"),
        u("q2"),
        call("c2"),
        tool("c2", "r2"),
        a("a2"),
        u("q3"),
    ]


def test_keep_one_drops_the_older_pair() -> None:
    result = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=1), two_pairs())
    assert contents(result.messages) == ["sys", "q1", "a1", "q2", None, "r2", "a2", "q3"]


def test_keep_zero_drops_all_pairs() -> None:
    result = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=0), two_pairs())
    assert contents(result.messages) == ["sys", "q1", "a1", "q2", "a2", "q3"]
    assert not run(
        SelectiveToolCallsStrategy(keep_last_tool_call_groups=0), result.messages
    ).changed


def test_nothing_to_do_with_at_most_n_groups() -> None:
    result = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=2), two_pairs())
    assert not result.changed


def test_the_newest_turn_is_never_dropped() -> None:
    msgs = [u("q1"), call("c1"), tool("c1"), u("q2"), call("c2"), tool("c2")]
    result = run(SelectiveToolCallsStrategy(keep_last_tool_call_groups=0), msgs)
    assert contents(result.messages) == ["q1", "q2", None, "sunny"]


def test_configured_trigger_and_target() -> None:
    msgs = [u("q")]
    for i in range(5):
        msgs += [call(f"c{i}"), tool(f"c{i}", "r" * 400)]
    msgs.append(u("last"))
    result = run(
        SelectiveToolCallsStrategy(keep_last_tool_call_groups=0, trigger=TokensExceed(400)), msgs
    )
    assert result.report.tokens_after <= 400
    assert 0 < sum(1 for m in result.messages if "tool_calls" in m) < 5
    # a target other than the trigger: drop while any tool call is kept
    result = run(
        SelectiveToolCallsStrategy(
            keep_last_tool_call_groups=3, trigger=TokensExceed(0), target=HasToolCalls()
        ),
        msgs,
    )
    assert sum(1 for m in result.messages if "tool_calls" in m) == 3


def test_negative_keep_is_rejected() -> None:
    with pytest.raises(ValueError):
        SelectiveToolCallsStrategy(keep_last_tool_call_groups=-1)
