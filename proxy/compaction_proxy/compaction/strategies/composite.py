"""Running strategies in order, and the two compositions of the Agent Framework.

:func:`run_strategy_async` runs one strategy over a draft (trigger check, apply, re-base, report)
and :func:`run_sequence_async` runs several in order.  The top-level pipeline
(:func:`compaction_proxy.compaction.pipeline.compact_async`) and the nested ``strategy: pipeline``
entry (:class:`PipelineStrategy`) both run through them, in one of two compositions (see
"Strategies" in compaction_proxy/compaction/README.md and "Agent Framework pipelines" in
docs/configuration.md):

* **plain** (.NET ``PipelineCompactionStrategy``): every strategy in order, each by its own
  trigger, and nothing else: ``early_stop=False``.  A strategy never skips because an earlier one
  already brought the request under some budget.
* **token budget** (Python ``TokenBudgetComposedStrategy``): ``early_stop=True``.  Once some
  strategy has changed the request, the remaining strategies are skipped as soon as the
  ``stop_when`` condition (the budget) no longer fires; then an oldest-first fallback.  Early stop
  never applies before the first change, so triggers below the budget (``fire at 0.8``,
  ``turns_exceed``) still work on a request that fits; a nested token-budget entry fires only
  over its budget anyway (the Agent Framework's "within budget: nothing to do").

Sync and async: the loop exists once, as coroutines.  A strategy that awaits (only the
summarization strategy, on the summarizer) overrides ``apply_async``; every other strategy's
``apply_async`` just calls its ``apply``.  The synchronous callers run the same coroutines with no
summarizer in the context (:func:`without_summarizer`), so nothing ever suspends and
:func:`run_to_completion` steps them to the end in one ``send``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from pydantic import Field, model_validator

from ..draft import Draft
from ..fields import TargetField
from ..report import StrategyReport
from ..triggers import Always, Condition, OverBudget, TokensExceed
from ._support.churn import held_to_minimum, savepoint_for
from .base import Strategy, StrategyContext, StrategyOutcome
from .params import BuildContext, StrategyParams
from .registry import StrategyEntry
from .truncation import TruncationStrategy

T = TypeVar("T")


def run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (no summarizer in its context)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError(
        "a compaction strategy awaited in a synchronous call; use compact_async with a summarizer"
    )


def without_summarizer(ctx: StrategyContext) -> StrategyContext:
    """``ctx`` for a synchronous run: no summarizer, so no strategy awaits."""
    return ctx if ctx.summarizer is None else dataclasses.replace(ctx, summarizer=None)


def skipped_report(name: str, tokens: int, reason: str) -> StrategyReport:
    """A strategy that did not run (``reason``: ``trigger`` or ``early_stop``)."""
    return StrategyReport(
        name, fired=False, changed=False, tokens_before=tokens, tokens_after=tokens, skipped=reason
    )


async def run_strategy_async(
    strategy: Strategy, draft: Draft, ctx: StrategyContext
) -> StrategyReport:
    """Check the trigger, apply, re-base the draft, and report."""
    tokens_before = draft.prompt_tokens
    if not strategy.should_run(draft, ctx):
        return skipped_report(strategy.name, tokens_before, "trigger")
    counters_before = draft.counters
    point = savepoint_for(strategy, draft, ctx)
    outcome = await strategy.apply_async(draft, ctx)
    draft.commit()
    outcome = held_to_minimum(draft, point, outcome, tokens_before, ctx)
    delta = draft.counters - counters_before
    return StrategyReport(
        strategy.name,
        fired=True,
        changed=outcome.changed,
        tokens_before=tokens_before,
        tokens_after=draft.prompt_tokens,
        groups_affected=delta.groups_affected,
        messages_affected=delta.messages_affected,
        notes=outcome.notes,
        warnings=outcome.warnings,
        children=outcome.children,
        failed=outcome.failed,
        failure_message=outcome.failure_message,
        summary_checks=outcome.summary_checks,
    )


def run_strategy(strategy: Strategy, draft: Draft, ctx: StrategyContext) -> StrategyReport:
    """Synchronous :func:`run_strategy_async` (no summarizer: see the module docstring)."""
    return run_to_completion(run_strategy_async(strategy, draft, without_summarizer(ctx)))


async def run_sequence_async(
    strategies: Sequence[Strategy],
    draft: Draft,
    ctx: StrategyContext,
    *,
    stop_when: Condition,
    early_stop: bool,
    hysteresis: bool = False,
) -> list[StrategyReport]:
    """Run ``strategies`` in order, in the composition ``early_stop`` names (module docstring):
    ``False`` is the plain pipeline (each by its own trigger; ``stop_when`` unused), ``True`` the
    token-budget composition's early stop at ``stop_when``.

    ``hysteresis`` (token budget only): once one strategy acted, the later ones run towards
    ``stop_when`` even where their own trigger no longer fires (see ``Pipeline.hysteresis``).
    """
    reports: list[StrategyReport] = []
    acted = False
    engaged_ctx = dataclasses.replace(ctx, engaged=True) if hysteresis else ctx
    for strategy in strategies:
        if acted and early_stop and not ctx.force and not stop_when.fires(draft.metrics()):
            reports.append(skipped_report(strategy.name, draft.prompt_tokens, "early_stop"))
            continue
        report = await run_strategy_async(strategy, draft, engaged_ctx if acted else ctx)
        reports.append(report)
        acted = acted or report.changed
    return reports


class FallbackTruncation(TruncationStrategy):
    """The last resort: drop oldest groups until the budget holds, within the invariants."""

    name = "fallback_truncation"

    def __init__(self, *, condition: Condition | None = None, minimum_preserved: int = 0) -> None:
        condition = condition or OverBudget()
        super().__init__(trigger=condition, target=condition, minimum_preserved=minimum_preserved)


def _token_budget_keys(early_stop: object, stop_when: object, fallback: object) -> list[str]:
    """The token-budget composition's keys that are set (a plain pipeline refuses them)."""
    keys = (("early_stop", early_stop), ("stop_when", stop_when), ("fallback", fallback))
    return [name for name, value in keys if value not in (None, False)]


class PipelineParams(StrategyParams):
    """``strategy: pipeline``: child entries in order, in one of the Agent Framework's two
    compositions.

    Without ``token_budget``: the plain pipeline (.NET ``PipelineCompactionStrategy``): fires
    always and runs every child by its own trigger; ``early_stop``, ``stop_when`` and
    ``fallback`` are refused there.  With ``token_budget: N``: the token-budget composition
    (Python ``TokenBudgetComposedStrategy``): fire above N tokens, stop as soon as it fits
    (``early_stop``, default true; ``stop_when`` another stop condition), then an oldest-first
    ``fallback`` (default true).  ``target`` and ``minimum_preserved`` have no effect here (the
    children have their own).
    """

    strategies: list[StrategyEntry]
    stop_when: TargetField | None = None
    early_stop: bool | None = None
    token_budget: int | None = Field(default=None, ge=0)
    fallback: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> PipelineParams:
        mixed = _token_budget_keys(self.early_stop, self.stop_when, self.fallback)
        if self.token_budget is None and mixed:
            raise ValueError(
                f"{' and '.join(mixed)} {'belongs' if len(mixed) == 1 else 'belong'} to a "
                "token_budget pipeline (the Agent Framework's TokenBudgetComposedStrategy): set "
                "token_budget, or leave them out for a plain pipeline "
                "(PipelineCompactionStrategy: every entry by its own trigger)"
            )
        return self

    def arguments(self, ctx: BuildContext) -> dict[str, Any]:
        return {
            "strategies": [ctx.build(child) for child in self.strategies],
            "stop_when": self.stop_when,
            "early_stop": self.early_stop,
            "trigger": self.trigger,
            "token_budget": self.token_budget,
            "fallback": self.fallback,
        }


class PipelineStrategy(Strategy):
    """A nested pipeline entry (``strategy: pipeline``): children in order, one report.

    Plain form, without ``token_budget`` (.NET ``PipelineCompactionStrategy``): the trigger is
    ``always``, each child then checks its own trigger and runs when it fires, in order, gentlest
    first; no early stop and no fallback of its own.

    Token-budget form, with ``token_budget=N`` (Python ``TokenBudgetComposedStrategy``; see
    "Strategies" in compaction_proxy/compaction/README.md): the entry fires when the prompt exceeds
    N tokens, runs
    its children in order (each by its own trigger), stops as soon as it fits N (``early_stop``,
    on by default; ``stop_when`` may name another condition), and with ``fallback`` (on by
    default) drops the oldest groups until it fits, keeping the newest non-system group (the
    Agent Framework's "minimum retained group").  Differences from the Agent Framework: the
    fallback never removes system messages, the newest user message or the newest step (see
    "Groups and invariants" in compaction_proxy/compaction/README.md; the Agent Framework's
    "strict" fallback
    drops system messages last), and when they alone exceed the budget the entry reports a
    warning instead.

    ``early_stop``, ``stop_when`` and ``fallback`` belong to the token-budget form: asking a
    plain pipeline for them raises :class:`ValueError` (the two compositions are never mixed).
    """

    name = "pipeline"

    def __init__(
        self,
        strategies: Sequence[Strategy],
        *,
        stop_when: Condition | None = None,
        early_stop: bool | None = None,
        trigger: Condition | None = None,
        token_budget: int | None = None,
        fallback: bool | None = None,
    ) -> None:
        super().__init__(trigger=trigger)
        if token_budget is not None and token_budget < 0:
            raise ValueError("token_budget must be >= 0")
        mixed = _token_budget_keys(early_stop, stop_when, fallback)
        if token_budget is None and mixed:
            raise ValueError(
                f"{' and '.join(mixed)} {'belongs' if len(mixed) == 1 else 'belong'} to a "
                "token_budget pipeline "
                "(TokenBudgetComposedStrategy); a plain pipeline "
                "(PipelineCompactionStrategy) runs every child by its own trigger"
            )
        self.strategies = tuple(strategies)
        self.token_budget = token_budget
        self.budget_condition: Condition = (
            TokensExceed(token_budget) if token_budget is not None else OverBudget()
        )
        self.stop_when = stop_when or self.budget_condition
        budgeted = token_budget is not None
        self.early_stop = early_stop if early_stop is not None else budgeted
        self.fallback = fallback if fallback is not None else budgeted

    def default_trigger(self) -> Condition:
        return self.budget_condition if self.token_budget is not None else Always()

    @property
    def summary_roles(self) -> frozenset[str]:
        return frozenset().union(*(s.summary_roles for s in self.strategies))

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        return run_to_completion(self.apply_async(draft, without_summarizer(ctx)))

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        if self.token_budget is not None:  # its children's budget is the entry's (churn.py)
            ctx = dataclasses.replace(ctx, budget=self.budget_condition)
        children = await run_sequence_async(
            self.strategies, draft, ctx, stop_when=self.stop_when, early_stop=self.early_stop
        )
        warnings: list[str] = []
        if self.fallback and self.budget_condition.fires(draft.metrics()):
            fallback = FallbackTruncation(condition=self.budget_condition, minimum_preserved=1)
            children.append(await run_strategy_async(fallback, draft, StrategyContext()))
            if self.budget_condition.fires(draft.metrics()):
                warnings.append(
                    f"pipeline: still over its budget ({draft.prompt_tokens} "
                    "tokens) after the fallback"
                )
        return StrategyOutcome(
            changed=any(c.changed for c in children),
            children=tuple(children),
            warnings=tuple(warnings),
        )
