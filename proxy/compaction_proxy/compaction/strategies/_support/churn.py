"""The minimum saving: a strategy that saves too little does not rewrite the prefix.

Every change to the forwarded prefix costs the upstream's prompt cache and a new checkpoint, so
a change must be worth it.  A strategy whose work saves fewer than ``StrategyContext.min_saving``
tokens (the pipeline's ``min_saving`` share of the budget; 2 % in the configuration's default
pipeline, none in an explicit one unless its block says so)
is undone and reported as not changing anything, so a pipeline whose tool-result compaction
would shave 7-30 tokens off every request leaves the prefix alone instead (see "What compaction
keeps (pins, bounds, churn)" in compaction_proxy/compaction/README.md).

The rule is a cut of churn, never of what was asked for.  It never undoes:

* **work a structural count demanded**: the strategy's trigger fired on a turn, message or
  group count (``turns_exceed``, ``messages_exceed``, ``groups_exceed``, alone or as the part
  of an ``any``/``all`` that fired; :meth:`~..base.Strategy.count_demanded`), or it
  is a sliding window with ``keep_last_turns`` / ``keep_last_groups``.  "Keep the last 4
  turns" takes effect even when the turns it drops are a few tokens each;
* **work done while the request was over budget** (before the strategy ran): over the
  request's budget, or over the budget of the composition it runs in (a nested
  ``token_budget: N`` entry, ``StrategyContext.budget``).  A change is due anyway, and every
  saving spares later ones;
* **a paid summary**: a strategy that pays for its work (summarization:
  :attr:`~..base.Strategy.minimum_saving_applies` is false), and any run that put a
  paid-for message in the draft (:attr:`~...draft.Draft.paid`): a summary that was paid for
  reaches the model;
* a container (a nested pipeline: its children were each held to it), or anything where
  ``min_saving`` is 0 (the core's default; the fallback and the last resort run with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import StrategyContext, StrategyOutcome

if TYPE_CHECKING:
    from ...draft import Draft, Savepoint
    from ..base import Strategy


def savepoint_for(strategy: Strategy, draft: Draft, ctx: StrategyContext) -> Savepoint | None:
    """A savepoint to undo ``strategy``'s run with, when the minimum applies to it (``None``:
    whatever the run does is kept; see the module docstring for when)."""
    if ctx.min_saving <= 0 or not strategy.minimum_saving_applies or draft.over_budget():
        return None
    metrics = draft.metrics()
    if ctx.budget is not None and ctx.budget.fires(metrics):
        return None
    if strategy.count_demanded(metrics):
        return None
    return draft.savepoint()


def held_to_minimum(
    draft: Draft,
    point: Savepoint | None,
    outcome: StrategyOutcome,
    tokens_before: int,
    ctx: StrategyContext,
) -> StrategyOutcome:
    """``outcome``, or the strategy's work undone (back to ``point``) when it saved too little.

    ``draft`` is committed; ``tokens_before`` is its prompt count when the strategy started.
    """
    if point is None or not outcome.changed or outcome.children:
        return outcome
    if len(draft.paid) > point.paid:  # it paid for a message: that reaches the model
        return outcome
    saved = tokens_before - draft.prompt_tokens
    if saved >= ctx.min_saving:
        return outcome
    draft.rollback(point)
    return StrategyOutcome(
        changed=False,
        notes=(
            *outcome.notes,
            f"not applied: it saves {saved} token(s), under the minimum of {ctx.min_saving}, "
            "so the prefix stays as it was",
        ),
        warnings=outcome.warnings,
    )
