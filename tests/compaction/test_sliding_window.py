"""Sliding window by groups (Agent Framework Python) and by turns (.NET)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.strategies import SlidingWindowStrategy
from compaction_proxy.compaction.triggers import TokensExceed, TurnsExceed

from .helpers import a, call, contents, s, tool, u
from .strategy_helpers import run


def test_af_provider_vector_keep_last_two_groups() -> None:
    msgs = [s("S"), u("u1"), a("a1"), u("u2"), a("a2"), u("u3"), a("a3")]
    result = run(SlidingWindowStrategy(keep_last_groups=2), msgs)
    assert contents(result.messages) == ["S", "u3", "a3"]


def test_af_reused_call_id_occurrences_stay_atomic() -> None:
    msgs = [
        u("u1"),
        call("c1"),
        tool("c1", "r1"),
        a("a1"),
        u("u2"),
        call("c1"),
        tool("c1", "r2"),
        a("a2"),
    ]
    out = run(SlidingWindowStrategy(keep_last_groups=2), msgs).messages
    assert contents(out) == ["u2", None, "r2", "a2"]


def test_window_larger_than_conversation_is_a_no_op() -> None:
    msgs = [s(), u(), a()]
    result = run(SlidingWindowStrategy(keep_last_groups=5), msgs)
    assert not result.changed
    assert result.messages == msgs


def test_dotnet_turns_exceed_two_over_three_turns() -> None:
    msgs = [u("Q1"), a("A1"), u("Q2"), a("A2"), u("Q3"), a("A3")]
    out = run(SlidingWindowStrategy(trigger=TurnsExceed(2)), msgs).messages
    assert contents(out) == ["Q2", "A2", "Q3", "A3"]


def test_keep_last_turns_keeps_turn_zero_and_whole_turns() -> None:
    msgs = [
        s("S"),
        a("Welcome"),
        u("Q1"),
        call("c1"),
        tool("c1"),
        a("A1"),
        u("Q2"),
        a("A2"),
        u("Q3"),
    ]
    out = run(SlidingWindowStrategy(keep_last_turns=2), msgs).messages
    assert contents(out) == ["S", "Welcome", "Q2", "A2", "Q3"]


def test_dotnet_minimum_zero_vector_keeps_newest_turn_by_design() -> None:
    # .NET keeps only "Welcome"; DESIGN invariant 4 keeps the newest turn as well.
    msgs = [a("Welcome"), u("Q1"), a("A1"), u("Q2"), a("A2")]
    strategy = SlidingWindowStrategy(trigger=TurnsExceed(0), minimum_preserved=0)
    assert contents(run(strategy, msgs).messages) == ["Welcome", "Q2", "A2"]


def test_turn_mode_target_stops_early() -> None:
    msgs = [u("x" * 400), a("x" * 400), u("q2"), a("a2"), u("q3"), a("a3"), u("q4")]
    strategy = SlidingWindowStrategy(trigger=TurnsExceed(1), target=TokensExceed(100))
    assert contents(run(strategy, msgs).messages) == ["q2", "a2", "q3", "a3", "q4"]


def test_force_mode_drops_to_the_floor() -> None:
    msgs = [u("Q1"), a("A1"), u("Q2"), a("A2"), u("Q3")]
    strategy = SlidingWindowStrategy(trigger=TurnsExceed(100))
    assert not run(strategy, msgs).changed
    assert contents(run(strategy, msgs, mode=Mode.FORCE).messages) == ["Q3"]


def test_parameter_validation() -> None:
    with pytest.raises(ValueError):
        SlidingWindowStrategy()
    with pytest.raises(ValueError):
        SlidingWindowStrategy(keep_last_groups=1, keep_last_turns=1)
    with pytest.raises(ValueError):
        SlidingWindowStrategy(keep_last_groups=0)
