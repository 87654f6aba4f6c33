"""Truncation, including the Agent Framework vectors of research/msaf.md section 5."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction import CharacterEstimatorTokenizer
from compaction_proxy.compaction.strategies import TruncationStrategy
from compaction_proxy.compaction.triggers import GroupsExceed, TokensExceed

from .helpers import a, call, contents, s, tool, u
from .strategy_helpers import run


def test_af_keeps_system_anchor() -> None:
    msgs = [s("S"), u("u1"), a("a1"), u("u2"), a("a2")]
    result = run(TruncationStrategy(max_n=3, compact_to=3, metric="messages"), msgs)
    assert contents(result.messages) == ["S", "u2", "a2"]
    assert result.changed


def test_af_keeps_latest_group_when_it_exceeds_target() -> None:
    result = run(TruncationStrategy(max_n=10, compact_to=5), [u("x" * 10_000)])
    assert not result.changed
    assert result.report.strategies[0].fired


def test_af_keeps_nonadjacent_tool_pair_atomic() -> None:
    msgs = [u("u1"), call("c1"), a("approval"), tool("c1"), a("after"), u("u2"), a("a2")]
    result = run(TruncationStrategy(max_n=5, compact_to=4, metric="messages"), msgs)
    out = result.messages
    declared = {c["id"] for m in out for c in m.get("tool_calls") or []}
    answered = {m["tool_call_id"] for m in out if m["role"] == "tool"}
    assert declared == answered
    assert contents(out) == ["approval", "after", "u2", "a2"]


def test_af_compact_to_must_not_exceed_max_n() -> None:
    with pytest.raises(ValueError):
        TruncationStrategy(max_n=3, compact_to=4)
    with pytest.raises(ValueError):
        TruncationStrategy(compact_to=4)


def test_preserve_system_false_is_rejected_by_design() -> None:
    # AF: preserve_system=False, max_n=2, compact_to=1 over [S,u1,a1] -> [a1]; DESIGN
    # invariant 1 forbids removing system messages, so the option is refused.
    with pytest.raises(ValueError, match="invariant 1"):
        TruncationStrategy(max_n=2, compact_to=1, preserve_system=False)


def test_preserve_first_user_group_diverges_only_for_the_newest_turn() -> None:
    # AF: [S,task,a1,u2,a2], max_n=3, compact_to=2 -> [S,task,a2]. Invariant 4 keeps u2.
    msgs = [s("S"), u("task"), a("a1"), u("u2"), a("a2")]
    strategy = TruncationStrategy(
        max_n=3, compact_to=2, metric="messages", preserve_first_user_group=True
    )
    assert contents(run(strategy, msgs).messages) == ["S", "task", "u2", "a2"]
    longer = [s("S"), u("task"), a("a1"), u("u2"), a("a2"), u("u3"), a("a3")]
    assert contents(run(strategy, longer).messages) == ["S", "task", "u3", "a3"]


def test_dotnet_groups_exceed_vector() -> None:
    msgs = [u("Q1"), a("A1"), u("Q2"), a("A2")]
    strategy = TruncationStrategy(trigger=GroupsExceed(2), minimum_preserved=1)
    assert contents(run(strategy, msgs).messages) == ["Q2", "A2"]


def test_dotnet_tool_group_excluded_atomically() -> None:
    msgs = [call("c1"), tool("c1"), u("user")]
    result = run(TruncationStrategy(trigger=GroupsExceed(1)), msgs)
    assert contents(result.messages) == ["user"]
    assert result.report.strategies[0].groups_affected == 1
    assert result.report.strategies[0].messages_affected == 2


def test_minimum_preserved_floor() -> None:
    msgs = [u("q1"), a("a1"), u("q2"), a("a2"), a("a3"), u("q3")]
    strategy = TruncationStrategy(trigger=GroupsExceed(0), minimum_preserved=3)
    # newest three non-system groups: a2, a3, q3
    assert contents(run(strategy, msgs).messages) == ["a2", "a3", "q3"]


def test_token_metric_stops_at_compact_to() -> None:
    tok = CharacterEstimatorTokenizer()
    msgs = [s("S"), *[m for i in range(10) for m in (u(f"q{i}" * 20), a(f"a{i}" * 20))]]
    total = tok.count_messages(msgs)
    strategy = TruncationStrategy(max_n=total - 1, compact_to=total // 2)
    out = run(strategy, msgs).messages
    assert tok.count_messages(out) <= total // 2
    # one group fewer dropped would have been above compact_to (oldest-first, minimal)
    assert out[0]["content"] == "S"


def test_trigger_target_form() -> None:
    msgs = [u("x" * 400), a("y" * 400), u("q"), a("r")]
    strategy = TruncationStrategy(trigger=TokensExceed(150), target=TokensExceed(50))
    assert contents(run(strategy, msgs).messages) == ["q", "r"]
