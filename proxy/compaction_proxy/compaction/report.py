"""The compaction report: what ran, what it did, what it cost.

The edge turns it into response headers (tokens before/after, strategies that acted,
warnings), the preview endpoint returns it as JSON (:meth:`CompactionReport.to_dict`), and
metrics count from it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .budget import OutputLimit
from .summary_check import SummaryCheck, merge_checks


class StrategyFailure(NamedTuple):
    """One strategy that could not do its work (``CompactionReport.failures``)."""

    strategy: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class StrategyReport:
    """One strategy's run.

    ``skipped`` says why a strategy did not run: ``"trigger"`` (its trigger did not fire) or
    ``"early_stop"`` (an earlier strategy already met the pipeline's stop condition).
    ``failed``: the reason a strategy that fired could not do its work (a summarizer failure:
    ``timeout``, ``error``, ``empty``, ``oversized``, ``not_shorter``, ``backoff``,
    ``overflow``), with
    ``failure_message``; it then changed nothing.
    """

    name: str
    fired: bool
    changed: bool
    tokens_before: int
    tokens_after: int
    groups_affected: int = 0
    messages_affected: int = 0
    skipped: str | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    children: tuple[StrategyReport, ...] = field(default=())
    failed: str | None = None
    failure_message: str | None = None
    summary_checks: tuple[SummaryCheck, ...] = ()
    """One check per summary this strategy wrote (:mod:`.summary_check`, recorded with
    :func:`~.strategies._support.summary_record.with_summary_check`)."""

    def walk(self) -> Iterator[StrategyReport]:
        """This report and its nested children's, in execution order (depth first)."""
        yield self
        for child in self.children:
            yield from child.walk()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {
            "name": self.name,
            "fired": self.fired,
            "changed": self.changed,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "groups_affected": self.groups_affected,
            "messages_affected": self.messages_affected,
        }
        if self.skipped:
            out["skipped"] = self.skipped
        if self.notes:
            out["notes"] = list(self.notes)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.failed:
            out["failed"] = self.failed
            out["failure_message"] = self.failure_message or ""
        if self.summary_checks:
            out["summary_checks"] = [check.to_dict() for check in self.summary_checks]
        if self.children:
            out["children"] = [child.to_dict() for child in self.children]
        return out


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """Everything one :func:`~compaction_proxy.compaction.pipeline.compact` call decided.

    Token counts are raw (our tokenizer's); triggers compared them after ``calibration``.
    """

    model: str
    mode: str
    tokenizer: str
    context_window: int
    output_reserve: int
    safety_reserve: int
    budget: int
    calibration: float
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    strategies: tuple[StrategyReport, ...]
    fallback: StrategyReport | None = None
    warnings: tuple[str, ...] = ()
    last_resort: StrategyReport | None = None
    """The oversized-result trim, when it ran (nothing else was left and it still did not fit)."""
    unforwarded: tuple[StrategyFailure, ...] = ()
    """Work the proxy paid for that did not reach the model (a summary the budget left no room
    for; reason ``discarded``).  The strategy is then not named in :attr:`changed_by`, the
    warnings say it, and the summarizer outcome is counted as ``discarded``."""
    budget_sources: Mapping[str, Any] = field(default_factory=dict)
    """Where the budget's parts came from: ``window_source``, ``output_source``,
    ``reserve_ratio`` (see :class:`~.budget.Budget`)."""
    output_limit: OutputLimit | None = None
    """The output limit the request asked for and the one to forward with the compacted prompt
    (lowered when ``lower_output_limit`` is on and both would not fit the window;
    :meth:`~.budget.Budget.output_limit`); None when the request asked for none."""

    @property
    def changed_by(self) -> tuple[str, ...]:
        """Names of the strategies that changed something, in order (a header value).

        Nested pipelines are looked into: the header names what acted, not its container.  A
        strategy whose paid work did not reach the model (:attr:`unforwarded`) is not named.
        """
        lost = {f.strategy for f in self.unforwarded}
        return tuple(
            r.name for r in self.walk() if r.changed and not r.children and r.name not in lost
        )

    @property
    def summary_checks(self) -> tuple[SummaryCheck, ...]:
        """One check per summary this run wrote, in run order, nested strategies' included
        (what each summary kept of its folded span on its own; :mod:`.summary_check`).

        Read from the strategy reports, so a report restated for a checkpoint hit (which wrote
        no summary) has none, and a summary is counted on the request that wrote it."""
        return tuple(check for r in self.walk() for check in r.summary_checks)

    @property
    def summary_kept(self) -> SummaryCheck | None:
        """:attr:`summary_checks` merged into one (the header's and the metric's figures);
        ``None`` when this run wrote no checked summary."""
        checks = self.summary_checks
        return merge_checks(checks) if checks else None

    def walk(self) -> Iterator[StrategyReport]:
        """Every strategy report, nested ones included, then the fallback's and the last
        resort's, in run order."""
        for strategy_report in self.strategies:
            yield from strategy_report.walk()
        if self.fallback is not None:
            yield from self.fallback.walk()
        if self.last_resort is not None:
            yield from self.last_resort.walk()

    @property
    def failures(self) -> tuple[StrategyFailure, ...]:
        """Strategies that fired but failed (a summarizer failure), nested ones included.

        The edge stores no checkpoint when this is non-empty, sets a warning header and counts
        the failures.
        """
        return tuple(
            StrategyFailure(r.name, r.failed, r.failure_message or "")
            for r in self.walk()
            if r.failed
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the preview endpoint and logs)."""
        return {
            "model": self.model,
            "mode": self.mode,
            "tokenizer": self.tokenizer,
            "budget": {
                "context_window": self.context_window,
                "output_reserve": self.output_reserve,
                "safety_reserve": self.safety_reserve,
                "limit": self.budget,
                **self.budget_sources,
            },
            "calibration": self.calibration,
            "output_limit": None if self.output_limit is None else self.output_limit.to_dict(),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "messages_before": self.messages_before,
            "messages_after": self.messages_after,
            "strategies": [s.to_dict() for s in self.strategies],
            "fallback": self.fallback.to_dict() if self.fallback else None,
            "last_resort": self.last_resort.to_dict() if self.last_resort else None,
            "warnings": list(self.warnings),
            "failures": [f._asdict() for f in self.failures],
            "unforwarded": [f._asdict() for f in self.unforwarded],
            "summary_checks": [check.to_dict() for check in self.summary_checks],
        }
