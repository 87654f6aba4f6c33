"""The summarization strategy's stop at the target picks the same cut as folding each
candidate stretch anew and projecting it (the former quadratic search), on generated
conversations, budgets, targets and retention settings."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import ModelFacts, build_view
from compaction_proxy.compaction.budget import compute_budget
from compaction_proxy.compaction.draft import Draft, GroupState
from compaction_proxy.compaction.strategies._support.summary_selection import TargetStop
from compaction_proxy.compaction.strategies.base import StrategyContext
from compaction_proxy.compaction.strategies.summarization import SummarizationStrategy
from compaction_proxy.compaction.triggers import (
    MessagesExceed,
    Metrics,
    TokenRatio,
    TurnsExceed,
)
from compaction_proxy.compaction.view import Group, GroupKind

from .summarizer_fakes import TOK
from .test_properties import rich_conversations

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "300"))
_ANCHORS = (GroupKind.USER,)


def projected_reach(stop: TargetStop, folded: Sequence[Group]) -> bool:
    """The projection as written before the running tally: every sum taken anew."""
    draft, base = stop.draft, stop.base
    folded_tokens = sum(draft.group_tokens(g) for g in folded)
    added = stop.overhead + stop.strategy.summary_estimate(folded_tokens, stop.bound)
    per_turn: dict[int, int] = {}
    for group in folded:
        if group.turn:
            per_turn[group.turn] = per_turn.get(group.turn, 0) + 1
    gone_turns = sum(1 for t, n in per_turn.items() if n >= stop.turn_live.get(t, 0))
    remaining = base.messages
    projected: Metrics = replace(
        base,
        tokens=draft.calibration.apply(draft.prompt_tokens - folded_tokens + added),
        messages=base.messages - sum(g.message_count for g in folded) + 1,
        groups=base.groups - len(folded) + 1,
        turns=base.turns - gone_turns,
        tool_call_groups=base.tool_call_groups
        - sum(1 for g in folded if g.kind is GroupKind.TOOL_CALL),
        overflow_messages=lambda: remaining,
    )
    return not stop.target.fires(projected)


def quadratic_first_reaching(
    stop: TargetStop,
    non_system: Sequence[Group],
    cuts: Sequence[int],
    position: Callable[[Group], int],
    *,
    anchored: bool,
) -> int | None:
    for number, cut in enumerate(cuts):
        folded = [g for g in non_system if position(g) < cut and not stop.draft.is_protected(g)]
        if all(g.kind is GroupKind.SUMMARY for g in folded):
            continue
        if anchored and not any(g.kind in _ANCHORS for g in folded):
            continue
        if projected_reach(stop, folded):
            return number
    return None


@st.composite
def strategies(draw: st.DrawFn) -> SummarizationStrategy:
    target = draw(
        st.sampled_from(
            [
                TokenRatio(0.5),
                TokenRatio(0.2),
                TokenRatio(0.8),
                MessagesExceed(6),
                TurnsExceed(2),
            ]
        )
    )
    return SummarizationStrategy(
        retain_turns=draw(st.integers(0, 3)),
        retain_tokens=draw(st.one_of(st.none(), st.integers(1, 3000))),
        minimum_preserved=draw(st.integers(0, 2)),
        trigger=TokenRatio(0.1),
        target=target,
    )


def selections(
    messages: list[dict[str, Any]], strategy: SummarizationStrategy, window: int
) -> list[int]:
    view = build_view(messages, TOK)
    draft = Draft(view, tokenizer=TOK, budget=compute_budget(ModelFacts(window, 0)), tools_tokens=0)
    return [g.index for g in strategy.select(draft, StrategyContext(model="m"))]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=rich_conversations(),
    strategy=strategies(),
    window=st.sampled_from([500, 2000, 8000, 30000]),
)
def test_the_linear_stop_picks_the_quadratic_searchs_cut(
    messages: list[dict[str, Any]], strategy: SummarizationStrategy, window: int
) -> None:
    linear = selections(messages, strategy, window)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TargetStop, "first_reaching", quadratic_first_reaching)
        quadratic = selections(messages, strategy, window)
    assert linear == quadratic


def test_a_turn_is_gone_once_all_its_live_groups_are_folded() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"question {turn} " + "x " * 300})
        messages.append({"role": "assistant", "content": f"answer {turn} " + "y " * 300})
    view = build_view(messages, TOK)
    draft = Draft(view, tokenizer=TOK, budget=compute_budget(ModelFacts(4000, 0)), tools_tokens=0)
    strategy = SummarizationStrategy(trigger=TokenRatio(0.1), target=TurnsExceed(2))
    stop = TargetStop(strategy, draft)
    non_system = [g for g in draft.groups if g.kind is not GroupKind.SYSTEM]
    assert all(draft.state(g) is not GroupState.DROPPED for g in non_system)
    # Folding the first turn's question alone leaves four turns; with its answer, three: the
    # target (turns > 2) still fires; two whole turns folded, it no longer does.
    cuts = [g.index for g in non_system]
    found = stop.first_reaching(non_system, cuts, lambda g: g.index, anchored=True)
    assert found == quadratic_first_reaching(
        stop, non_system, cuts, lambda g: g.index, anchored=True
    )
    assert found is not None and cuts[found] == non_system[4].index
