"""The core's entry point: compact one request with a pipeline of strategies.

:func:`compact_async` (and its synchronous twin :func:`compact`) takes one
:class:`CompactionRequest`, builds the view, the budget and a draft, then runs the pipeline:

1. Each strategy in order checks its own trigger on the current (partially compacted) state;
   when it fires it applies, and the draft is re-based so the next strategy sees the result.
2. Early stop (token-budget composition, :mod:`.strategies.composite`): once some strategy has
   changed the request, the remaining strategies are skipped as soon as the pipeline's
   ``stop_when`` condition no longer fires.  ``stop_when`` defaults to ``over_budget`` ("stop as
   soon as the budget holds"); the default pipeline uses its own target (``token_ratio: 0.5``)
   so it compacts towards it.
3. Fallback: if the request is still over budget, drop the oldest groups the invariants and
   the run's pins allow.
4. Pins released (see :mod:`.carry`): still over budget, the carried user messages go, oldest
   first; then the last resort: if nothing is left to drop and it still does not fit,
   soft-trim the largest tool results (even the newest step's) to head + marker + tail until
   it does (:class:`~.strategies._support.last_resort.OversizedResultTrim`); then, only if that
   was not enough, the summaries, and the report says which summary did not reach the model
   (:attr:`~.report.CompactionReport.unforwarded`).  If even that cannot fit (user or system
   text alone is too large: never cut), the smallest valid list goes out and the report
   carries a warning.

Pins (:mod:`.carry`): before any strategy runs, every summary checkpoint and the newest user
messages that fit ``Pipeline.carry_user_share`` of the budget are pinned, so no strategy drops
them; the summarization strategy pins the summary it makes.  Churn
(:mod:`.strategies._support.churn`): a strategy whose work saves less than ``Pipeline.min_saving``
of the budget is undone, except work a turn/message/group count demanded, work done over budget and
what was paid for.

A request's own strategies (:attr:`CompactionRequest.edits`: a client's context edits a wire
format translated, say Anthropic's ``context_management``) run before step 1, each by its own
trigger and outside the pipeline's composition: they neither engage its hysteresis nor count for
its early stop, and what they save is never held to ``min_saving`` (the client's own guard, such
as ``clear_at_least``, decides).  They are reported first, like any strategy.

Determinism and idempotency: everything is a function of the input; every strategy's target
is met (or nothing removable is left) on its output, so compacting the output again with the
same budget finds no trigger that can change anything.

Sync and async: :func:`compact` runs the same coroutine as :func:`compact_async` with no
summarizer, so nothing suspends (see :mod:`.strategies.composite`); the summarization strategy
then skips with the note "summarizer not available" and the later strategies (truncation at
worst) still bring the request under budget.

Failures: a strategy that fired but could not do its work (a summarizer failure) changed
nothing and reports ``failed``; the pipeline continues with the next strategy, and the report
gets the warning ``"<strategy> failed (<reason>): <message>; fell back to <next>"`` where
``<next>`` is the first later strategy that changed the request (see
:attr:`~.report.CompactionReport.failures`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from .archive import Archived, RecallIds
from .budget import Budget, Calibration, ModelCatalog, ModelFacts, OutputLimit, compute_budget
from .carry import carry_user_messages, pin_summaries
from .chat_messages import Message
from .draft import Draft
from .forced import forced_without_summary
from .ledger.state import DraftLedger
from .ledger_run import ledger_role, ledger_warnings, place_ledger, start_ledger
from .release import release_pins
from .report import CompactionReport, StrategyFailure, StrategyReport
from .strategies.base import Strategy, StrategyContext
from .strategies.composite import (
    FallbackTruncation,
    PipelineStrategy,
    run_sequence_async,
    run_strategy_async,
    run_to_completion,
    skipped_report,
)
from .summarizer_contract import Summarizer
from .tokenizer_provider import TokenizerProvider
from .tokens import Tokenizer
from .triggers import Condition, Metrics, OverBudget, firing_tokens
from .view import DEFAULT_SUMMARY_MARKER, SummaryMarker, build_view


class Mode(StrEnum):
    """How the caller wants compaction applied (``X-Compaction`` header).

    ``off`` is handled by the edge (it does not call :func:`compact`).  ``dry-run`` computes
    exactly what ``normal`` would; the caller forwards the original and shows the result.
    ``dry-run-local`` is a dry run that must not reach the network: the edge runs it as
    ``dry-run`` without a summarizer, so summarization is reported as skipped.
    """

    NORMAL = "normal"
    FORCE = "force"
    DRY_RUN = "dry-run"
    DRY_RUN_LOCAL = "dry-run-local"


def summary_marker_for(strategies: Sequence[Strategy]) -> SummaryMarker:
    """The default marker, extended with every role the strategies place summaries in.

    A ``system`` placement is opt-in (see "Checkpoints" in compaction_proxy/checkpoints/README.md),
    so only a
    pipeline that writes system-role summaries recognises a ``<summary>`` system message as a
    checkpoint.
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
    ``carry_user_share``: the share of the budget the newest user messages may take to be
    carried verbatim when their turns are folded (:mod:`.carry`); 0 (the core's default, the
    anchors' behaviour): none are.  The configuration's default pipeline has
    :data:`~.carry.DEFAULT_CARRY_SHARE`; an explicit one only what its block writes.
    ``min_saving``: the share of the budget a strategy's work must save to be kept
    (:mod:`.strategies._support.churn`); 0 (the core's default): every change is kept.  The
    configuration's default pipeline has :data:`~.settings.DEFAULT_MIN_SAVING`; an explicit one only
    what its block writes.
    """

    strategies: tuple[Strategy, ...] = ()
    stop_when: Condition | None = None
    early_stop: bool = True
    fallback: bool = True
    summary_marker: SummaryMarker | None = None
    hysteresis: bool = False
    carry_user_share: float = 0.0
    min_saving: float = 0.0
    ledger_share: float | None = None
    """The ledger's share of the budget (:mod:`.ledger_run`); ``None``: no ledger (the core's
    default; the configuration's default pipeline has one)."""

    def marker(self) -> SummaryMarker:
        """The summary marker this pipeline uses (see ``summary_marker``)."""
        if self.summary_marker is not None:
            return self.summary_marker
        return summary_marker_for(self.strategies)


@dataclass(frozen=True)
class CompactionResult:
    """The messages to forward, whether they differ from the input, and the report.

    When ``changed`` is false, ``messages`` holds the input's own dicts and the edge should
    forward the original request bytes.
    """

    messages: list[Message]
    changed: bool
    report: CompactionReport
    metrics: Metrics | None = None
    """The input's metrics (calibrated tokens, budget, counts) before any strategy ran: what
    the edge checks its own conditions against (``summarization.prepare``)."""
    archived: Archived | None = None
    """With :attr:`CompactionRequest.recall`: the originals this run removed or rewrote and
    the spans its summaries stand for, to store beside the checkpoint (``None``: recall off,
    or nothing archived; see "Recall marks" in docs/compaction.md)."""


@dataclass(frozen=True)
class CompactionRequest:
    """One chat-completions request to compact, and the settings of the run.

    ``messages``, ``model``, ``tools`` (the request's ``tools`` or legacy ``functions``) and
    ``max_completion_tokens`` / ``max_tokens`` (the output limit, i.e. the output reserve) come
    from the request body.  The rest is the run's: ``pipeline``; ``tokenizer``, a tokenizer or a
    provider that picks one by the model's encoding; ``facts``, the model's facts or a catalog to
    resolve them from ``model`` (default: the built-in catalog); ``reserve_ratio``, the budget's
    safety reserve; ``calibration``; ``mode``; ``summary_marker``, how summary checkpoints are
    recognised (default: the pipeline's, :meth:`Pipeline.marker`); ``window_source``, where the
    window in ``facts`` came from, for the report (the edge knows a learned or discovered one;
    default: the catalog's own answer, or ``given`` for bare facts). ``output_share``: the share
    of the window the request's output limit may reserve, and ``lower_output``: whether the
    result's :attr:`~.report.CompactionReport.output_limit` may lower that limit so the prompt
    and the output fit the window (the model's facts win when they say; :mod:`.budget`). The
    core's defaults (1.0, off) are the rule before the bound existed; the configuration's are
    :data:`~.budget.DEFAULT_RESERVE_SHARE` and on. ``edits``, the request's own strategies, run
    before the pipeline (see the module docstring). ``recall`` (``compaction.recall.enabled``):
    archive what the run removes or rewrites and mark what stands for it
    (:attr:`CompactionResult.archived`; "Recall marks" in docs/compaction.md), naming each with
    the archive namespace's keyed ids (:class:`~.archive.RecallIds`: the edge derives the key;
    None: recall off).
    """

    messages: Sequence[Message]
    model: str
    pipeline: Pipeline
    tokenizer: Tokenizer | TokenizerProvider
    facts: ModelFacts | ModelCatalog | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    reserve_ratio: float = 0.05
    calibration: Calibration | None = None
    mode: Mode = Mode.NORMAL
    summary_marker: SummaryMarker | None = None
    window_source: str | None = None
    output_share: float = 1.0
    lower_output: bool = False
    edits: tuple[Strategy, ...] = ()
    recall: RecallIds | None = None


def request_budget(request: CompactionRequest, facts: ModelFacts) -> Budget:
    """The budget of ``request`` for the model ``facts`` (one rule, see :mod:`.budget`)."""
    source = request.window_source
    if source is None:
        catalog = request.facts
        source = (
            (catalog or ModelCatalog()).window_source(request.model)
            if not isinstance(catalog, ModelFacts)
            else "given"
        )
    return compute_budget(
        facts,
        max_completion_tokens=request.max_completion_tokens,
        max_tokens=request.max_tokens,
        reserve_ratio=request.reserve_ratio,
        window_source=source,
        output_share=request.output_share,
        lower_output=request.lower_output,
    )


def compact(request: CompactionRequest) -> CompactionResult:
    """Compact one chat-completions request, synchronously and without a summarizer.

    The same run as :func:`compact_async` with ``summarizer=None``: a summarization strategy
    skips with the note "summarizer not available" and the later strategies take over.
    """
    return run_to_completion(compact_async(request, summarizer=None))


async def compact_async(
    request: CompactionRequest, *, summarizer: Summarizer | None = None
) -> CompactionResult:
    """Compact one chat-completions request (pure apart from ``summarizer``; see the module
    docstring).

    ``summarizer``: used by the summarization strategy; at most one call per summarization
    strategy in the pipeline.
    """
    run = _start(request, summarizer)
    await _run_pipeline(run)
    await _release_pins(run)
    return _result(run)


@dataclass(slots=True)
class _Run:
    """One :func:`compact_async` run, from the request's view to its result."""

    request: CompactionRequest
    tokenizer: Tokenizer
    budget: Budget
    calibration: Calibration
    draft: Draft
    ctx: StrategyContext
    messages_before: int
    tokens_before: int
    metrics_before: Metrics
    reports: list[StrategyReport] = field(default_factory=list)
    fallback: StrategyReport | None = None
    last_resort: StrategyReport | None = None
    unforwarded: list[StrategyFailure] = field(default_factory=list)
    ledger: DraftLedger | None = None


def _start(request: CompactionRequest, summarizer: Summarizer | None) -> _Run:
    """The model's facts, tokenizer and budget, the view and a draft with the run's pins."""
    model, pipeline, facts = request.model, request.pipeline, request.facts
    if isinstance(facts, ModelFacts):
        model_facts = facts
    else:
        model_facts = (facts or ModelCatalog()).facts_for(model)
    tokenizer = request.tokenizer
    if isinstance(tokenizer, TokenizerProvider):
        tokenizer = tokenizer.get(model_facts.encoding)
    calibration = request.calibration or Calibration()
    marker = request.summary_marker if request.summary_marker is not None else pipeline.marker()
    if request.edits and request.summary_marker is None and pipeline.summary_marker is None:
        marker = summary_marker_for((*request.edits, *pipeline.strategies))
    budget = request_budget(request, model_facts)
    view = build_view(request.messages, tokenizer, summary_marker=marker)
    draft = Draft(
        view,
        tokenizer=tokenizer,
        budget=budget,
        tools_tokens=tokenizer.count_tools(request.tools),
        calibration=calibration,
        summary_marker=marker,
        recall=request.recall,
    )
    run = _Run(
        request=request,
        tokenizer=tokenizer,
        budget=budget,
        calibration=calibration,
        draft=draft,
        ctx=StrategyContext(
            force=request.mode is Mode.FORCE,
            summarizer=summarizer,
            model=model,
            min_saving=math.ceil(pipeline.min_saving * budget.limit),
        ),
        messages_before=len(view.messages),
        tokens_before=draft.prompt_tokens,
        metrics_before=draft.metrics(),
    )
    pin_summaries(draft)
    carry_user_messages(draft, pipeline.carry_user_share)
    if pipeline.ledger_share is not None:
        start_ledger(draft, pipeline.ledger_share, ledger_role(pipeline.strategies))
    return run


async def _run_pipeline(run: _Run) -> None:
    """Steps 1-3 of the module docstring: the request's own strategies, the pipeline's, the
    fallback, then the settle."""
    pipeline, draft, ctx = run.request.pipeline, run.draft, run.ctx
    if run.request.edits:
        # Each by its own trigger (a plain sequence), and kept whatever it saves.
        run.reports = await run_sequence_async(
            run.request.edits,
            draft,
            replace(ctx, min_saving=0),
            stop_when=OverBudget(),
            early_stop=False,
        )
    run.reports += await run_sequence_async(
        pipeline.strategies,
        draft,
        ctx,
        stop_when=pipeline.stop_when or OverBudget(),
        early_stop=pipeline.early_stop,
        hysteresis=pipeline.hysteresis,
    )
    if pipeline.fallback and draft.over_budget():
        run.fallback = await run_strategy_async(FallbackTruncation(), draft, StrategyContext())
    # Settle: a strategy that ages messages by their position saw the array before later
    # strategies dropped groups from it; where its trigger still fires on the final array,
    # run it once more there, so the output is a fixpoint (compacting it again changes nothing).
    # Nothing changed: it already saw the final array.
    for strategy in _position_aged(pipeline.strategies) if draft.changed else ():
        if strategy.should_run(draft, ctx):
            settled = await run_strategy_async(strategy, draft, ctx)
            if settled.changed:
                run.reports.append(settled)


async def _release_pins(run: _Run) -> None:
    """Step 4 (:mod:`.release`), then the ledger placed in the output (:mod:`.ledger_run`)."""
    released = await release_pins(run.draft, run.request.pipeline.fallback, run.fallback)
    run.fallback, run.last_resort = released.fallback, released.last_resort
    run.unforwarded = released.unforwarded
    run.ledger = place_ledger(run.draft)


def _warnings(run: _Run) -> list[str]:
    """Every strategy's warnings, the failures, the summaries not forwarded, and why a
    request still over budget goes out."""
    draft, limit = run.draft, run.budget.limit
    warnings: list[str] = []
    ran = tuple(r for r in (*run.reports, run.fallback, run.last_resort) if r is not None)
    steps = [r for top in ran for r in top.walk()]  # a nested strategy's warnings count too
    for strategy_report in steps:
        warnings.extend(strategy_report.warnings)
    warnings.extend(failure_warnings(steps))
    warnings.extend(f"{f.strategy}: {f.message}" for f in run.unforwarded)
    warnings.extend(ledger_warnings(run.ledger, run.request.pipeline.ledger_share or 0.0))
    if run.request.mode is Mode.FORCE:
        warnings.extend(forced_without_summary(steps, draft))
    if draft.over_budget():
        tokens_now = run.calibration.apply(draft.prompt_tokens)
        if any(True for _ in draft.removable()):
            warnings.append(
                f"over budget: {tokens_now} tokens > {limit}; fallback truncation is disabled"
            )
        else:
            warnings.append(
                f"over budget: {tokens_now} tokens > {limit}; the system "
                "messages, the newest user message and the newest step alone exceed it, "
                "so the smallest valid request is forwarded"
            )
    return warnings


def _result(run: _Run) -> CompactionResult:
    draft = run.draft
    out = draft.project()
    changed = draft.changed
    report = _report(
        run.request,
        run.tokenizer.name,
        run.budget,
        run.calibration,
        tokens_before=run.tokens_before,
        tokens_after=draft.prompt_tokens,
        messages_before=run.messages_before,
        messages_after=len(out),
        strategies=tuple(run.reports),
        fallback=run.fallback,
        warnings=tuple(_warnings(run)),
        last_resort=run.last_resort,
        unforwarded=tuple(run.unforwarded),
    )
    return CompactionResult(
        messages=out if changed else list(run.request.messages),
        changed=changed,
        report=report,
        metrics=run.metrics_before,
        archived=draft.archived() if changed else None,
    )


def unchanged_result(
    request: CompactionRequest,
    tokenizer: str,
    budget: Budget,
    calibration: Calibration,
    tokens: int,
) -> CompactionResult:
    """What :func:`compact_async` returns for ``request`` when no trigger fires (every
    strategy skipped by its trigger, the counts unchanged, the input's own dicts), built
    without the view by a caller that knows the exact count ``tokens`` (the edge's quiet path,
    compaction_proxy/engine/_quiet.py); ``metrics`` is left out: the view's groups and turns are
    unknown."""
    strategies = (*request.edits, *request.pipeline.strategies)
    skipped = tuple(skipped_report(s.name, tokens, "trigger") for s in strategies)
    report = _report(
        request,
        tokenizer,
        budget,
        calibration,
        tokens_before=tokens,
        tokens_after=tokens,
        messages_before=len(request.messages),
        messages_after=len(request.messages),
        strategies=skipped,
    )
    return CompactionResult(messages=list(request.messages), changed=False, report=report)


def _report(
    request: CompactionRequest,
    tokenizer: str,
    budget: Budget,
    calibration: Calibration,
    **figures: Any,
) -> CompactionReport:
    """A report's fixed part (model, mode, tokenizer, budget, calibration) plus ``figures``,
    and the output limit to forward with the prompt it leaves (:meth:`Budget.output_limit`)."""
    prompt = calibration.apply(figures["tokens_after"])
    limit = budget.output_limit(prompt)
    warnings = tuple(figures.pop("warnings", ()))
    note = output_note(limit, budget, prompt)
    return CompactionReport(
        model=request.model,
        mode=str(request.mode),
        tokenizer=tokenizer,
        context_window=budget.context_window,
        output_reserve=budget.output_reserve,
        safety_reserve=budget.safety_reserve,
        budget=budget.limit,
        budget_sources=budget.sources(),
        calibration=calibration.effective,
        output_limit=limit,
        warnings=warnings if note is None else (*warnings, note),
        **figures,
    )


def output_note(limit: OutputLimit | None, budget: Budget, prompt: int) -> str | None:
    """The warning that says what was done to the output limit, or that it does not fit."""
    if limit is None or (limit.fits and not limit.lowered):
        return None
    window = (
        f"the {budget.context_window}-token window less its {budget.safety_reserve}-token "
        "safety reserve"
    )
    if limit.lowered:
        fits = (
            "" if limit.fits else " (the floor: it still does not fit, the prompt is over budget)"
        )
        return (
            f"output limit lowered from {limit.asked} to {limit.forwarded} tokens{fits}: the "
            f"prompt ({prompt} tokens) and {limit.asked} would exceed {window}"
        )
    return (
        f"the prompt ({prompt} tokens) and the output limit ({limit.asked}) exceed {window}; "
        "an upstream that counts both may refuse it (lower_output_limit is off)"
    )


def firing_point(pipeline: Pipeline, metrics: Metrics) -> int | None:
    """The calibrated token count at which some strategy of ``pipeline`` (or its fallback)
    starts to fire as the conversation grows, other metrics as in ``metrics``; ``None`` when
    growth alone would not make anything fire (within four budgets).

    A strategy whose trigger already fires on ``metrics`` is left out: it ran and found
    nothing to do, so growth is not what it waits for.  A nested pipeline that is already open
    (its plain form fires ``always``) fires where its first child does.
    """
    ceiling = max(metrics.tokens, metrics.budget) * 4 + 1
    points = [_strategy_point(s, metrics, ceiling) for s in pipeline.strategies]
    if pipeline.fallback:
        points.append(firing_tokens(OverBudget(), metrics, ceiling))
    found = [p for p in points if p is not None]
    return min(found) if found else None


def _strategy_point(strategy: Strategy, metrics: Metrics, ceiling: int) -> int | None:
    if isinstance(strategy, PipelineStrategy) and strategy.trigger.fires(metrics):
        # The entry is open (its plain form's ``always``): its children decide.
        inner = (_strategy_point(s, metrics, ceiling) for s in strategy.strategies)
        return min((p for p in inner if p is not None), default=None)
    return firing_tokens(strategy.trigger, metrics, ceiling)


def _position_aged(strategies: Sequence[Strategy]) -> list[Strategy]:
    """The position-aged strategies of a pipeline, nested pipelines' included, in run order."""
    found: list[Strategy] = []
    for strategy in strategies:
        if isinstance(strategy, PipelineStrategy):
            found.extend(_position_aged(strategy.strategies))
        elif strategy.position_aged:
            found.append(strategy)
    return found
