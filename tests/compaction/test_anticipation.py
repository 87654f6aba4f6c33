"""The core's side of prepared summaries: where a growing conversation starts to fire, and a
run that compacts as if that growth were already there (Calibration.offset)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction import Calibration, Pipeline, firing_point
from compaction_proxy.compaction.strategies.composite import PipelineStrategy
from compaction_proxy.compaction.strategies.sliding_window import SlidingWindowStrategy
from compaction_proxy.compaction.triggers import (
    AllOf,
    Always,
    AnyOf,
    HasToolCalls,
    Metrics,
    TokenRatio,
    TokensBelow,
    TokensExceed,
    firing_tokens,
)


def metrics(tokens: int, budget: int = 1000, messages: int = 10) -> Metrics:
    return Metrics(tokens, messages, 8, 3, 1, budget)


def test_firing_tokens_finds_the_first_count_that_fires() -> None:
    assert firing_tokens(TokenRatio(0.8), metrics(600), 10_000) == 800
    assert firing_tokens(TokensExceed(700), metrics(600), 10_000) == 701
    # Combinations: `any` fires at the earliest, `all` at the latest of its token parts.
    both = AllOf((TokenRatio(0.8), TokensExceed(900)))
    either = AnyOf((TokenRatio(0.8), TokensExceed(650)))
    assert firing_tokens(both, metrics(600), 10_000) == 901
    assert firing_tokens(either, metrics(600), 10_000) == 651


def test_firing_tokens_is_none_for_what_growth_cannot_change() -> None:
    assert firing_tokens(TokenRatio(0.5), metrics(600), 10_000) is None  # fires already
    assert firing_tokens(TokensBelow(100), metrics(600), 10_000) is None  # never by growing
    assert firing_tokens(HasToolCalls(expected=False), metrics(600), 10_000) is None
    assert firing_tokens(TokensExceed(50_000), metrics(600), 10_000) is None  # past the ceiling


def test_firing_point_is_the_earliest_strategy_or_the_fallback() -> None:
    late = SlidingWindowStrategy(keep_last_turns=1, trigger=TokenRatio(0.9))
    early = SlidingWindowStrategy(keep_last_turns=1, trigger=TokensExceed(700))
    assert firing_point(Pipeline((late, early)), metrics(600)) == 701
    # Nothing token-driven but the fallback: it fires once the budget is exceeded.
    assert firing_point(Pipeline(()), metrics(600)) == 1001
    assert firing_point(Pipeline((), fallback=False), metrics(600)) is None
    # An open nested pipeline (``always``) fires where its first child does.
    nested = PipelineStrategy([late], trigger=Always())
    assert firing_point(Pipeline((nested,), fallback=False), metrics(600)) == 900


def test_an_offset_is_added_after_the_ratio() -> None:
    assert Calibration(ratio=1.5, offset=100).apply(1000) == 1600
    assert Calibration(offset=0).apply(7) == 7
    with pytest.raises(ValueError):
        Calibration(offset=-1)
