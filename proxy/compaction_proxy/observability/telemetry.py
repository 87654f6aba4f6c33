"""The per-request recording: one call per request feeds Prometheus and the dashboard.

:meth:`Telemetry.record_request` runs once per request where the access log is written
(``ProxyApp.__call__``), from what the request left on its context. Two things cannot wait for
the end of the request and have their own hooks: summarizer HTTP calls (a
:class:`~compaction_proxy.summarizer.SummarizerStats` listener, for their latency and for
calls no request keeps) and the figures read at scrape time (:mod:`.prometheus`).

Telemetry reads the request through :class:`FinishedRequest`, a protocol the finished request
(the context's edge facts with the route's frozen outcome, built once where the access log is
written) satisfies: observability imports nothing from the request path, so no import circle
forms.

Label values a client controls (the model name) are capped: after ``MAX_MODELS`` distinct
values every new one is ``other``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from compaction_proxy.compaction.summary_check import SECTIONS
from compaction_proxy.observability.dashboard import Dashboard, RecentRow
from compaction_proxy.observability.labels import ROUTE_OTHER, LabelCap, api_of, route_of
from compaction_proxy.observability.outcomes import final_outcomes
from compaction_proxy.observability.prices import Prices
from compaction_proxy.observability.prometheus import (
    ContextWindows,
    DegradedHealth,
    PreparedSummaries,
    PrometheusMetrics,
    StoreHealth,
    TokenizerFallback,
    WithheldSummaries,
)
from compaction_proxy.observability.recall import RecallFigures, RecallTally

if TYPE_CHECKING:
    from compaction_proxy.checkpoints import StoreBreaker
    from compaction_proxy.compaction import CompactionReport
    from compaction_proxy.compaction.report import StrategyFailure
    from compaction_proxy.compaction.tokenizer_provider import TokenizerProvider
    from compaction_proxy.config import Settings
    from compaction_proxy.engine import DegradedPaths, PreparedStats
    from compaction_proxy.summarizer import SummarizerStats, SummaryCallRecord, SummaryCalls
    from compaction_proxy.upstream import WindowBook

log = logging.getLogger("compaction_proxy.metrics")  # the name operators already filter on

__all__ = ["FinishedRequest", "RecallFigures", "Telemetry"]

_DRY_RUNS = frozenset({"dry-run", "dry-run-local"})
"""Report modes that forwarded the client's original (``X-Compaction: dry-run``)."""


class _Tokens(NamedTuple):
    """One request's token figures for its dashboard row (all zero without a report)."""

    before: int = 0
    after: int = 0
    strategies: tuple[str, ...] = ()
    usd_saved: float | None = None
    usd_before: float | None = None


class FinishedRequest(Protocol):
    """What telemetry reads from a request once it is over.

    ``compaction_proxy.api._outcome.Finished`` provides all of it. Read-only: telemetry never
    changes the request it records.
    """

    @property
    def request_id(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def upstream(self) -> str | None: ...
    @property
    def status(self) -> int: ...  # 0: no response was started
    @property
    def elapsed_ms(self) -> float: ...
    @property
    def report(self) -> CompactionReport | None: ...
    @property
    def checkpoint(self) -> str | None: ...
    @property
    def compaction_seconds(self) -> float | None: ...
    @property
    def summarizer_calls(self) -> SummaryCalls | None: ...
    @property
    def upstream_seconds(self) -> float | None: ...
    @property
    def upstream_prompt_tokens(self) -> int | None: ...
    @property
    def content(self) -> str | None: ...
    @property
    def overflow_outcome(self) -> str | None: ...
    @property
    def recall(self) -> RecallFigures | None: ...  # None: the recall tool was not offered
    @property
    def archived(self) -> int: ...  # originals this request's compaction archived


class Telemetry:
    """Prometheus metrics plus what the dashboard shows, fed once per request.

    Each instance has its own registry, so several apps in one process never share counters.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizers: TokenizerProvider | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = PrometheusMetrics()
        self.registry = self.metrics.registry
        if tokenizers is not None:
            self.registry.register(TokenizerFallback(tokenizers))
        self.show_content = settings.dashboard.show_content
        self.prices = Prices(settings.dashboard.prices)
        self._clock = clock
        self.dashboard = Dashboard(self.prices, show_content=self.show_content, clock=clock)
        self._models = LabelCap()
        # Labelled children looked up once: `labels()` takes a lock and builds a key each time.
        self._upstream_children: dict[str, Any] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    # -------------------------------------------------------------- feeding

    def watch_store(self, store: StoreBreaker) -> None:
        """Expose the checkpoint store's breaker (called once, when the app is built)."""
        self.registry.register(StoreHealth(store))

    def watch_degraded(self, paths: DegradedPaths) -> None:
        """Expose the degraded paths (called once, when the app is built)."""
        self.registry.register(DegradedHealth(paths))

    def watch_windows(self, book: WindowBook) -> None:
        """Expose the learned and discovered windows (called once, when the app is built)."""
        self.dashboard.windows = book
        self.registry.register(ContextWindows(book))

    def watch_preparer(self, stats: PreparedStats) -> None:
        """Expose the background summaries (called once, when the app is built)."""
        self.registry.register(PreparedSummaries(stats))
        stats.listeners.append(self._on_prepared)

    def _on_prepared(self, outcome: str, age: float | None) -> None:
        if outcome == "used" and age is not None:
            self.metrics.prepared_age.observe(max(age, 0.0))

    def watch_withheld(self, counts: Mapping[str, int]) -> None:
        """Expose the summaries withheld from callers not let in (called once, when the app is
        built)."""
        self.registry.register(WithheldSummaries(counts))

    def watch_summarizer(self, stats: SummarizerStats) -> None:
        """Time the summarizer's HTTP calls (called once, when the flow is built)."""
        stats.listeners.append(self._on_summarizer_call)

    def _on_summarizer_call(self, record: SummaryCallRecord) -> None:
        self.metrics.summarizer_latency.observe(record.seconds)
        if record.cached_tokens:
            self.metrics.summarizer_cached_tokens.inc(record.cached_tokens)
        self.dashboard.count_summarizer_call(record.form, record.cached_tokens)
        if not record.per_request:
            # No request keeps this call (its SummaryCalls would): count it now.
            self._count_summaries([record.outcome], ())

    def record_request(self, ctx: FinishedRequest, method: str | None, path: str) -> None:
        """Everything one request contributes; never raises (it runs in a finally)."""
        try:
            self._record(ctx, method, path)
        except Exception:
            log.exception("telemetry failed for one request")

    def _record(self, ctx: FinishedRequest, method: str | None, path: str) -> None:
        route = route_of(method, path)
        status = ctx.status or 500
        self._count_request(route, status)
        if route == ROUTE_OTHER:
            return  # health checks, scrapes and the dashboard itself: counted, not shown
        self._observe_upstream(ctx)
        api = api_of(route)  # chat | responses | ...: a compacted API (its wire format's)
        report = ctx.report if api is not None else None
        overflow = ctx.overflow_outcome
        if overflow is not None:
            self._child(self.metrics.overflow_retries, ctx.upstream or "unknown", overflow).inc()
        model = self._models(ctx.model) if ctx.model else None
        failures: tuple[StrategyFailure, ...] = ()
        failed: list[str] = []
        if api is not None:
            failures, failed = self._observe_compaction(ctx, report)
        tokens = _Tokens()
        recall: RecallTally | None = None
        archived = 0
        if api is not None:
            if report is not None:
                tokens = self._observe_report(ctx, report, api, model)
                self._observe_summary_checks(report)
            recall, archived = self._observe_recall(ctx, api)
        dry_run = report is not None and report.mode in _DRY_RUNS
        row = RecentRow(
            ctx.request_id,
            self._clock(),
            method,
            path,
            route,
            model,
            ctx.upstream,
            status,
            ctx.elapsed_ms,
            ctx.upstream_seconds,
            ctx.compaction_seconds,
            report is not None,
            tokens.before,
            tokens.after,
            tokens.usd_saved,
            tokens.strategies,
            ctx.checkpoint,
            failed,
            ctx.upstream_prompt_tokens,
            ctx.content if self.show_content else None,
            dry_run,
            report.tokens_after if dry_run and report is not None else None,
            api=api,
            recall=recall,
            archived=archived,
        )
        self.dashboard.add(row, usd_before=tokens.usd_before, failures=failures, overflow=overflow)

    def _count_request(self, route: str, status: int) -> None:
        self._child(self.metrics.requests, route, str(status)).inc()

    def _child(self, family: Any, *labels: str) -> Any:
        """``family.labels(*labels)``, kept: prometheus_client validates and locks on every
        ``labels`` call, which a request would pay a dozen times (every label here comes
        from a bounded set: routes, statuses, strategies, APIs, the models the dashboard
        names, upstreams)."""
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def _observe_upstream(self, ctx: FinishedRequest) -> None:
        if ctx.upstream_seconds is None or not ctx.upstream:
            return
        latency = self._upstream_children.get(ctx.upstream)
        if latency is None:
            latency = self._child(self.metrics.upstream_latency, ctx.upstream)
            self._upstream_children[ctx.upstream] = latency
        latency.observe(ctx.upstream_seconds)

    def _observe_compaction(
        self, ctx: FinishedRequest, report: CompactionReport | None
    ) -> tuple[tuple[StrategyFailure, ...], list[str]]:
        """A compacted route's time and summaries: (the report's failures, the summaries'
        outcomes that were not ok)."""
        if ctx.compaction_seconds is not None:
            self.metrics.compaction_seconds.observe(ctx.compaction_seconds)
        failures: tuple[StrategyFailure, ...] = ()
        if report is not None:
            # A summary made and then not forwarded counts as `discarded`, not `ok`.
            failures = (*report.failures, *report.unforwarded)
        calls = ctx.summarizer_calls
        outcomes = self._count_summaries(calls.outcomes if calls is not None else (), failures)
        return failures, [o for o in outcomes if o != "ok"]

    def _observe_report(
        self, ctx: FinishedRequest, report: CompactionReport, api: str, model: str | None
    ) -> _Tokens:
        """The token families, strategies, checkpoint and calibration of one report."""
        m = self.metrics
        before, after, strategies = _forwarded(report)
        m.tokens_before.observe(before)
        m.tokens_after.observe(after)
        saved = before - after
        usd_saved: float | None = None
        if saved > 0:
            m.tokens_saved.inc(saved)
            usd_saved = self.prices.usd(ctx.model, saved)
        for name in strategies:
            self._child(m.strategy_runs, name).inc()
        self._child(m.checkpoint_lookups, ctx.checkpoint or "none").inc()
        self._child(m.api_prompt_tokens, api, "before").inc(before)
        self._child(m.api_prompt_tokens, api, "after").inc(after)
        if ctx.upstream_prompt_tokens and after > 0:
            ratio = ctx.upstream_prompt_tokens / after
            self._child(m.calibration, model or "unknown").observe(ratio)
        return _Tokens(before, after, strategies, usd_saved, self.prices.usd(ctx.model, before))

    def _observe_summary_checks(self, report: CompactionReport) -> None:
        """What each summary this request's compaction wrote kept of its span on its own
        (``section`` bounded: the ledger's sections, else ``other``)."""
        m = self.metrics
        for check in report.summary_checks:
            sections = [
                (s.section if s.section in SECTIONS else "other", s.kept, s.total)
                for s in check.sections
            ]
            for section, kept, total in sections:
                if kept:
                    self._child(m.summary_strings, section, "kept").inc(kept)
                if total > kept:
                    self._child(m.summary_strings, section, "missing").inc(total - kept)
            if check.contradictions:
                m.summary_contradictions.inc(len(check.contradictions))
            self.dashboard.count_summary_check(sections, len(check.contradictions))

    def _observe_recall(self, ctx: FinishedRequest, api: str) -> tuple[RecallTally | None, int]:
        """The recall families of one compacted request: (its figures frozen for the
        dashboard, None when it was not offered the tool; the originals it archived)."""
        m = self.metrics
        archived = ctx.archived
        if archived > 0:
            self._child(m.archived_messages, api).inc(archived)
        figures = ctx.recall
        if figures is None:
            return None, archived
        tally = RecallTally.of(figures)
        self._child(m.recall_requests, api, tally.outcome).inc()
        if tally.rounds > 0:
            self._child(m.recall_rounds, api).inc(tally.rounds)
            self._child(m.recall_seconds, api).observe(max(tally.seconds, 0.0))
        if tally.calls > 0:
            self._child(m.recall_calls, api).inc(tally.calls)
        if tally.tokens > 0:
            self._child(m.recall_tokens, api).inc(tally.tokens)
        return tally, archived

    def _count_summaries(
        self, calls: Sequence[str], failures: Iterable[StrategyFailure]
    ) -> list[str]:
        """Counts a request's summaries by final outcome (:mod:`.outcomes`) and returns them."""
        outcomes = final_outcomes(calls, failures)
        m = self.metrics
        for outcome in outcomes:
            self._child(m.summarizer_calls, outcome).inc()
            if outcome != "ok":
                m.summarizer_failures.inc()
        self.dashboard.count_summaries(outcomes)
        return outcomes

    # -------------------------------------------------------------- reading

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return self.metrics.exposition()

    def requests_last_minute(self, now: float | None = None) -> int:
        """Requests in the last 60 s (the dashboard's headline rate)."""
        return self.dashboard.requests_last_minute(now)

    def snapshot(self) -> dict[str, Any]:
        """The dashboard's data: totals, series, breakdowns and the recent requests."""
        return self.dashboard.snapshot()


def _forwarded(report: CompactionReport) -> tuple[int, int, tuple[str, ...]]:
    """Tokens before, tokens forwarded and the strategies that changed what was forwarded.

    ``tokens_before`` is what the client sent, on a checkpoint hit too: the report names the
    hit as its first step, ``checkpoint`` (compaction_proxy/engine/_hit_report.py), so a hit counts
    as a compaction, its saving in ``tokens_saved_total`` and on the dashboard. A dry run forwards
    the original: nothing was saved and no strategy changed anything.
    """
    if report.mode in _DRY_RUNS:
        return report.tokens_before, report.tokens_before, ()
    return report.tokens_before, report.tokens_after, report.changed_by
