"""Compose strategies and run them over one request: the core's entry point.

:func:`compact` builds the view, the budget and a draft, then runs the pipeline:

1. Each strategy in order checks its own trigger on the current (partially compacted) state;
   when it fires it applies, and the draft is re-based so the next strategy sees the result.
2. Early stop (token-budget composition): once some strategy has changed the request, the
   remaining strategies are skipped as soon as the pipeline's ``stop_when`` condition no longer
   fires.  ``stop_when`` defaults to ``over_budget`` ("stop as soon as the budget holds");
   the default pipeline uses its own target (``token_ratio: 0.5``) so it compacts towards it.
   Early stop never applies before the first change, so triggers below the budget (``fire at
   0.8``, ``turns_exceed``) still work on a request that fits.
3. Fallback: if the request is still over budget, drop the oldest groups the invariants allow.
4. Last resort: if nothing is left to drop and it still does not fit, soft-trim the largest
   tool results (even the newest step's) to head + marker + tail until it does
   (:class:`~.strategies.last_resort.OversizedResultTrim`).  If even that cannot fit (user or
   system text alone is too large: never cut), the smallest valid list goes out and the
   report carries a warning.

Determinism and idempotency: everything is a function of the input; every strategy's target
is met (or nothing removable is left) on its output, so compacting the output again with the
same budget finds no trigger that can change anything.

Sync and async: the run loop exists once, as coroutines (:func:`compact_async`,
:func:`run_sequence_async`, :func:`run_strategy_async`).  A strategy that awaits (only the
summarization strategy, on the summarizer) overrides ``apply_async``; every other strategy's
``apply_async`` just calls its ``apply``.  The synchronous :func:`compact` and
:func:`run_strategy` run the same coroutines with no summarizer in the context, so nothing ever
suspends and :func:`_run_to_completion` steps them to the end in one ``send``; the summarization
strategy then skips with the note "summarizer not available" and the later strategies
(truncation at worst) still bring the request under budget.

Failures: a strategy that fired but could not do its work (a summarizer failure) changed
nothing and reports ``failed``; the pipeline continues with the next strategy, and the report
gets the warning ``"<strategy> failed (<reason>): <message>; fell back to <next>"`` where
``<next>`` is the first later strategy that changed the request (see
:attr:`~.report.CompactionReport.failures`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar

from .budget import Calibration, ModelCatalog, ModelFacts, compute_budget
from .draft import Draft
from .messages import Message
from .report import CompactionReport, StrategyReport
from .strategies.base import Strategy, StrategyContext, StrategyOutcome
from .strategies.last_resort import OversizedResultTrim
from .strategies.truncation import TruncationStrategy
from .summarizer import Summarizer
from .tokenizer_provider import TokenizerProvider
from .tokens import Tokenizer
from .triggers import Always, Condition, OverBudget, TokensExceed
from .view import DEFAULT_SUMMARY_MARKER, SummaryMarker, build_view

T = TypeVar("T")


class Mode(StrEnum):
    """How the caller wants compaction applied (``X-Compaction`` header).

    ``off`` is handled by the edge (it does not call :func:`compact`).  ``dry-run`` computes
    exactly what ``normal`` would; the caller forwards the original and shows the result.
    """

    NORMAL = "normal"
    FORCE = "force"
    DRY_RUN = "dry-run"


def _run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a pipeline coroutine that never suspends (no summarizer in its context)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError(
        "a compaction strategy awaited in a synchronous call; use compact_async with a summarizer"
    )


def _without_summarizer(ctx: StrategyContext) -> StrategyContext:
    return ctx if ctx.summarizer is None else replace(ctx, summarizer=None)


async def run_strategy_async(
    strategy: Strategy, draft: Draft, ctx: StrategyContext
) -> StrategyReport:
    """Check the trigger, apply, re-base the draft, and report."""
    tokens_before = draft.prompt_tokens
    if not strategy.should_run(draft, ctx):
        return StrategyReport(
            strategy.name,
            fired=False,
            changed=False,
            tokens_before=tokens_before,
            tokens_after=tokens_before,
            skipped="trigger",
        )
    counters_before = draft.counters
    outcome = await strategy.apply_async(draft, ctx)
    delta = draft.counters - counters_before
    draft.commit()
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
    )


def run_strategy(strategy: Strategy, draft: Draft, ctx: StrategyContext) -> StrategyReport:
    """Synchronous :func:`run_strategy_async` (no summarizer: see the module docstring)."""
    return _run_to_completion(run_strategy_async(strategy, draft, _without_summarizer(ctx)))


async def run_sequence_async(
    strategies: Sequence[Strategy],
    draft: Draft,
    ctx: StrategyContext,
    *,
    stop_when: Condition,
    early_stop: bool,
    hysteresis: bool = False,
) -> list[StrategyReport]:
    """Run ``strategies`` in order with the early-stop rule of the module docstring.

    ``hysteresis``: once one strategy acted, the later ones run towards ``stop_when`` even
    where their own trigger no longer fires (see :class:`Pipeline`).
    """
    reports: list[StrategyReport] = []
    acted = False
    engaged_ctx = dataclasses.replace(ctx, engaged=True) if hysteresis else ctx
    for strategy in strategies:
        if acted and early_stop and not ctx.force and not stop_when.fires(draft.metrics()):
            tokens = draft.prompt_tokens
            reports.append(
                StrategyReport(
                    strategy.name,
                    fired=False,
                    changed=False,
                    tokens_before=tokens,
                    tokens_after=tokens,
                    skipped="early_stop",
                )
            )
            continue
        report = await run_strategy_async(strategy, draft, engaged_ctx if acted else ctx)
        reports.append(report)
        acted = acted or report.changed
    return reports


def run_sequence(
    strategies: Sequence[Strategy],
    draft: Draft,
    ctx: StrategyContext,
    *,
    stop_when: Condition,
    early_stop: bool,
) -> list[StrategyReport]:
    """Synchronous :func:`run_sequence_async` (no summarizer)."""
    return _run_to_completion(
        run_sequence_async(
            strategies,
            draft,
            _without_summarizer(ctx),
            stop_when=stop_when,
            early_stop=early_stop,
        )
    )


def summary_marker_for(strategies: Sequence[Strategy]) -> SummaryMarker:
    """The default marker, extended with every role the strategies place summaries in.

    A ``system`` placement is opt-in (DESIGN section 7.8), so only a pipeline that writes
    system-role summaries recognises a ``<summary>`` system message as a checkpoint.
    """
    roles = frozenset().union(*(s.summary_roles for s in strategies))
    if roles <= DEFAULT_SUMMARY_MARKER.roles:
        return DEFAULT_SUMMARY_MARKER
    return replace(DEFAULT_SUMMARY_MARKER, roles=DEFAULT_SUMMARY_MARKER.roles | roles)


def failure_warnings(reports: Sequence[StrategyReport]) -> list[str]:
    """``"<name> failed (<reason>): <message>; fell back to <next>"`` per failed strategy.

    ``reports`` in run order (nested ones flattened); ``<next>`` is the first later strategy
    that changed the request.
    """
    warnings: list[str] = []
    for position, report in enumerate(reports):
        if not report.failed:
            continue
        after = (r.name for r in reports[position + 1 :] if r.changed and not r.children)
        fallback = next(after, "nothing (no later strategy changed the request)")
        warnings.append(
            f"{report.name} failed ({report.failed}): {report.failure_message or ''}; "
            f"fell back to {fallback}"
        )
    return warnings


class PipelineStrategy(Strategy):
    """A nested pipeline entry (``strategy: pipeline``): children in order, one report.

    Plain form (.NET ``PipelineCompactionStrategy``): the trigger defaults to ``always`` (each
    child checks its own), the early-stop condition to ``over_budget``.

    Token-budget form (Agent Framework ``TokenBudgetComposedStrategy``, DESIGN section 6): with
    ``token_budget=N`` the entry fires when the prompt exceeds N tokens, runs its children in order,
    stops as soon as it fits N (``early_stop``), and with ``fallback`` (the default when a budget is
    given) drops the oldest groups until it fits, keeping the newest non-system group (the Agent
    Framework's "minimum retained group").  Without ``token_budget`` the budget is the request's own
    (``over_budget``).  Differences from the Agent Framework: the fallback never removes system
    messages, the newest user message or the newest step (DESIGN invariants 1 and 4; the Agent
    Framework's "strict" fallback drops system messages last), and when they alone exceed the budget
    the entry reports a warning instead.
    """

    name = "pipeline"

    def __init__(
        self,
        strategies: Sequence[Strategy],
        *,
        stop_when: Condition | None = None,
        early_stop: bool = True,
        trigger: Condition | None = None,
        token_budget: int | None = None,
        fallback: bool | None = None,
    ) -> None:
        super().__init__(trigger=trigger)
        if token_budget is not None and token_budget < 0:
            raise ValueError("token_budget must be >= 0")
        self.strategies = tuple(strategies)
        self.token_budget = token_budget
        self.budget_condition: Condition = (
            TokensExceed(token_budget) if token_budget is not None else OverBudget()
        )
        self.stop_when = stop_when or self.budget_condition
        self.early_stop = early_stop
        self.fallback = fallback if fallback is not None else token_budget is not None

    def default_trigger(self) -> Condition:
        return self.budget_condition if self.token_budget is not None else Always()

    @property
    def summary_roles(self) -> frozenset[str]:
        return frozenset().union(*(s.summary_roles for s in self.strategies))

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        return _run_to_completion(self.apply_async(draft, _without_summarizer(ctx)))

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
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


@dataclass(frozen=True)
class Pipeline:
    """The configured strategies plus the composition rules.

    ``stop_when``: early-stop condition (continue while it fires), default ``over_budget``.
    ``fallback``: run the oldest-first truncation fallback when still over budget.
    ``hysteresis``: once a strategy acted, the later ones keep going towards ``stop_when``
    even where their own trigger (say ``token_ratio: 0.8``) no longer fires. The default
    pipeline uses it: fire at 0.8, compact to 0.5 in one go, rather than every strategy
    nudging the count just under 0.8 and a new prefix every few turns.
    ``summary_marker``: how checkpoints are recognised; ``None`` (the default) derives it from
    the strategies (:func:`summary_marker_for`: ``system`` joins the roles only when a
    summarization strategy places its summary there).
    """

    strategies: tuple[Strategy, ...] = ()
    stop_when: Condition | None = None
    early_stop: bool = True
    fallback: bool = True
    summary_marker: SummaryMarker | None = None
    hysteresis: bool = False

    def marker(self) -> SummaryMarker:
        """The summary marker this pipeline uses (see ``summary_marker``)."""
        if self.summary_marker is not None:
            return self.summary_marker
        return summary_marker_for(self.strategies)


class FallbackTruncation(TruncationStrategy):
    """The last resort: drop oldest groups until the budget holds, within the invariants."""

    name = "fallback_truncation"

    def __init__(self, *, condition: Condition | None = None, minimum_preserved: int = 0) -> None:
        condition = condition or OverBudget()
        super().__init__(trigger=condition, target=condition, minimum_preserved=minimum_preserved)


@dataclass(frozen=True)
class CompactionResult:
    """The messages to forward, whether they differ from the input, and the report.

    When ``changed`` is false, ``messages`` holds the input's own dicts and the edge should
    forward the original request bytes.
    """

    messages: list[Message]
    changed: bool
    report: CompactionReport


def compact(
    messages: Sequence[Message],
    *,
    model: str,
    pipeline: Pipeline,
    tokenizer: Tokenizer | TokenizerProvider,
    facts: ModelFacts | ModelCatalog | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_completion_tokens: int | None = None,
    max_tokens: int | None = None,
    reserve_ratio: float = 0.05,
    calibration: Calibration | None = None,
    mode: Mode = Mode.NORMAL,
    summary_marker: SummaryMarker | None = None,
) -> CompactionResult:
    """Compact one chat-completions request, synchronously and without a summarizer.

    The same run as :func:`compact_async` with ``summarizer=None``: a summarization strategy
    skips with the note "summarizer not available" and the later strategies take over.
    """
    return _run_to_completion(
        compact_async(
            messages,
            model=model,
            pipeline=pipeline,
            tokenizer=tokenizer,
            facts=facts,
            tools=tools,
            max_completion_tokens=max_completion_tokens,
            max_tokens=max_tokens,
            reserve_ratio=reserve_ratio,
            calibration=calibration,
            mode=mode,
            summary_marker=summary_marker,
            summarizer=None,
        )
    )


async def compact_async(
    messages: Sequence[Message],
    *,
    model: str,
    pipeline: Pipeline,
    tokenizer: Tokenizer | TokenizerProvider,
    facts: ModelFacts | ModelCatalog | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_completion_tokens: int | None = None,
    max_tokens: int | None = None,
    reserve_ratio: float = 0.05,
    calibration: Calibration | None = None,
    mode: Mode = Mode.NORMAL,
    summary_marker: SummaryMarker | None = None,
    summarizer: Summarizer | None = None,
) -> CompactionResult:
    """Compact one chat-completions request (pure apart from ``summarizer``; see the module
    docstring).

    ``facts``: the model's facts, or a catalog to resolve them from ``model`` (default: the
    built-in catalog).  ``tokenizer``: a tokenizer, or a provider that picks one by the
    model's encoding.  ``max_completion_tokens`` / ``max_tokens``: the request's output limit
    (the output reserve).  ``tools``: the request's ``tools`` (or legacy ``functions``).
    ``summary_marker``: how summary checkpoints are recognised (default: the pipeline's,
    :meth:`Pipeline.marker`).  ``summarizer``: used by the summarization strategy; at most one
    call per summarization strategy in the pipeline.
    """
    if isinstance(facts, ModelFacts):
        model_facts = facts
    else:
        model_facts = (facts or ModelCatalog()).facts_for(model)
    if isinstance(tokenizer, TokenizerProvider):
        tokenizer = tokenizer.get(model_facts.encoding)
    calibration = calibration or Calibration()
    marker = summary_marker if summary_marker is not None else pipeline.marker()
    budget = compute_budget(
        model_facts,
        max_completion_tokens=max_completion_tokens,
        max_tokens=max_tokens,
        reserve_ratio=reserve_ratio,
    )
    view = build_view(messages, tokenizer, summary_marker=marker)
    draft = Draft(
        view,
        tokenizer=tokenizer,
        budget=budget,
        tools_tokens=tokenizer.count_tools(tools),
        calibration=calibration,
        summary_marker=marker,
    )
    tokens_before = draft.prompt_tokens
    ctx = StrategyContext(force=mode is Mode.FORCE, summarizer=summarizer, model=model)

    reports = await run_sequence_async(
        pipeline.strategies,
        draft,
        ctx,
        stop_when=pipeline.stop_when or OverBudget(),
        early_stop=pipeline.early_stop,
        hysteresis=pipeline.hysteresis,
    )
    fallback_report = None
    if pipeline.fallback and draft.over_budget():
        fallback_report = await run_strategy_async(FallbackTruncation(), draft, StrategyContext())
    last_resort = None
    trim = OversizedResultTrim()
    if trim.should_run(draft, StrategyContext()):
        last_resort = await run_strategy_async(trim, draft, StrategyContext())
    warnings: list[str] = []
    ran = tuple(r for r in (*reports, fallback_report, last_resort) if r is not None)
    for strategy_report in ran:
        warnings.extend(strategy_report.warnings)
    warnings.extend(failure_warnings([r for top in ran for r in top.walk()]))
    if draft.over_budget():
        tokens_now = calibration.apply(draft.prompt_tokens)
        if any(True for _ in draft.removable()):
            warnings.append(
                f"over budget: {tokens_now} tokens > {budget.limit}; fallback "
                "truncation is disabled"
            )
        else:
            warnings.append(
                f"over budget: {tokens_now} tokens > {budget.limit}; the system "
                "messages, the newest user message and the newest step alone exceed it, "
                "so the smallest valid request is forwarded"
            )
    out = draft.project()
    changed = draft.changed
    report = CompactionReport(
        model=model,
        mode=str(mode),
        tokenizer=tokenizer.name,
        context_window=budget.context_window,
        output_reserve=budget.output_reserve,
        safety_reserve=budget.safety_reserve,
        budget=budget.limit,
        calibration=calibration.effective,
        tokens_before=tokens_before,
        tokens_after=draft.prompt_tokens,
        messages_before=len(view.messages),
        messages_after=len(out),
        strategies=tuple(reports),
        fallback=fallback_report,
        warnings=tuple(warnings),
        last_resort=last_resort,
    )
    return CompactionResult(
        messages=out if changed else list(messages), changed=changed, report=report
    )
