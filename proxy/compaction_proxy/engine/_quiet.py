"""Where a pipeline is quiet: the token count below which a request cannot make it act.

Most requests of an agent session are far below every trigger, and building the view to find
that out is most of what the proxy spends on them. When every trigger only grows into firing
as the prompt grows (token conditions), the point where the first one would fire is a number
per pipeline and budget; a request whose exact count is below it goes upstream unchanged
without the view (``Compactor.run``'s fast path, fed by
:func:`~compaction_proxy.compaction.prompt_bound.prompt_bound`).

Anything else takes the full path, because only the view can tell: a strategy whose trigger
counts messages, turns or groups, one that already fires on an empty request (``always``,
``tokens_below``, a nested pipeline's plain form), a strategy with its own ``should_run`` (a
group-shaped summarization counts messages). A nested pipeline with a ``token_budget`` fires on
tokens like any strategy and takes the quiet path below it. The limit is also kept at or under
the budget (over it the last-resort trim and the over-budget warnings run whatever the triggers
say) and under the background-summary threshold (``summarization.prepare``): a request past it
must reach ``Preparer.wants`` with the view's metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction_proxy.compaction import Pipeline, firing_point
from compaction_proxy.compaction.strategies.base import Strategy
from compaction_proxy.compaction.strategies.summarization import SummarizationStrategy
from compaction_proxy.compaction.triggers import (
    AllOf,
    AnyOf,
    Condition,
    Metrics,
    Never,
    OverBudget,
    RemainingTokens,
    TokenRatio,
    TokensExceed,
    firing_tokens,
)

_GROWING = (Never, OverBudget, RemainingTokens, TokenRatio, TokensExceed)
_MEMO_SIZE = 4096


def grows_into(condition: Condition) -> bool:
    """Whether ``condition`` depends on the token count alone and, once it fires, keeps
    firing as the count grows (so one number says where it starts)."""
    if isinstance(condition, AllOf | AnyOf):
        return all(grows_into(c) for c in condition.conditions)
    return isinstance(condition, _GROWING)


def token_driven(strategy: Strategy) -> bool:
    """Whether ``strategy`` runs exactly when its (growing) trigger fires."""
    if isinstance(strategy, SummarizationStrategy):
        return not strategy.by_groups and grows_into(strategy.trigger)
    return type(strategy).should_run is Strategy.should_run and grows_into(strategy.trigger)


def quiet_limit(pipeline: Pipeline, budget: int, prepare: Condition | None) -> int | None:
    """The calibrated count below which nothing of ``pipeline`` fires for a request with
    prompt budget ``budget``, nor the ``prepare`` threshold; ``None``: take the full path."""
    if not all(token_driven(s) for s in pipeline.strategies):
        return None
    empty = Metrics(tokens=0, messages=0, groups=0, turns=0, tool_call_groups=0, budget=budget)
    if any(s.trigger.fires(empty) for s in pipeline.strategies):
        return None
    point = firing_point(pipeline, empty)
    if point is None:
        return None
    limit = min(point, budget + 1)
    if prepare is not None:
        if not grows_into(prepare) or prepare.fires(empty):
            return None
        ahead = firing_tokens(prepare, empty, limit)
        if ahead is not None:
            limit = min(limit, ahead)
    return limit


def edits_limit(edits: Sequence[Strategy], budget: int) -> int | None:
    """The calibrated count below which none of a request's own strategies fires (each by its
    own trigger, :attr:`~compaction_proxy.compaction.CompactionRequest.edits`), capped at the
    budget's (the pipeline's limit never exceeds it); ``None``: take the full path."""
    if not all(token_driven(s) for s in edits):
        return None
    empty = Metrics(tokens=0, messages=0, groups=0, turns=0, tool_call_groups=0, budget=budget)
    if any(s.trigger.fires(empty) for s in edits):
        return None
    ceiling = budget + 1
    points = (firing_tokens(s.trigger, empty, ceiling) for s in edits)
    return min((p for p in points if p is not None), default=ceiling)


class QuietLimits:
    """:func:`quiet_limit` per pipeline and budget, remembered: the bisection behind it costs
    more than the rest of a quiet request's decision."""

    def __init__(self, prepare: Condition | None) -> None:
        self.prepare = prepare
        self._memo: dict[tuple[int, int], int | None] = {}
        self._edit_memo: dict[tuple[str, int], int | None] = {}

    def limit(self, pipeline: Pipeline, budget: int) -> int | None:
        # Keyed by identity: the compactor builds its pipelines once and keeps them alive.
        key = (id(pipeline), budget)
        try:
            return self._memo[key]
        except KeyError:
            pass
        value = quiet_limit(pipeline, budget, self.prepare)
        if len(self._memo) < _MEMO_SIZE:
            self._memo[key] = value
        return value

    def edits_limit(self, name: str, edits: Sequence[Strategy], budget: int) -> int | None:
        """:func:`edits_limit` of a request's own strategies (a client's context edits, built
        anew for each request), remembered by ``name``, the edits' canonical form; an unnamed
        set is worked out every time."""
        key = (name, budget)
        if name:
            try:
                return self._edit_memo[key]
            except KeyError:
                pass
        value = edits_limit(edits, budget)
        if name and len(self._edit_memo) < _MEMO_SIZE:
            self._edit_memo[key] = value
        return value
