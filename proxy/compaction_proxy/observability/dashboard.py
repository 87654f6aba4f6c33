"""What the dashboard shows: running totals, a per-minute series, per-model figures and a ring
of recent requests, kept in memory and turned into JSON only when ``/dashboard/data`` is read.

Recording happens on every request and reading every 2 s per open page, so the work is put
on the reading side: a request adds to counters and appends one :class:`RecentRow` (a slots
object, no dict); :meth:`Dashboard.snapshot` builds the JSON.

What never goes in here: a key, a header value, a query string, conversation content (unless
``dashboard.show_content``, and then only the last user message, truncated).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compaction_proxy import __version__
from compaction_proxy.observability.labels import api_of
from compaction_proxy.observability.recall import OUTCOMES as RECALL_OUTCOMES
from compaction_proxy.wire.registry import FORMATS

if TYPE_CHECKING:
    from compaction_proxy.compaction.report import StrategyFailure
    from compaction_proxy.observability.prices import Prices
    from compaction_proxy.observability.recall import RecallTally
    from compaction_proxy.upstream import WindowBook

__all__ = ["MINUTES", "RECENT_FAILURES", "RECENT_REQUESTS", "Dashboard", "RecentRow"]

RECENT_REQUESTS = 200
"""Rows of the dashboard's recent-requests table (a ring buffer)."""
RECENT_FAILURES = 20
"""Summarizer failures the dashboard lists (a ring buffer)."""
MINUTES = 60
"""Per-minute buckets of the dashboard's time series."""
_FAILURE_MESSAGE_CHARS = 300


@dataclass(slots=True)
class RecentRow:
    """One request as the recent-requests table keeps it, named field by field.

    ``model`` is the capped label value; ``tokens_before``/``tokens_after`` are 0 and
    ``checkpoint`` is not shown unless ``reported`` (the request had a compaction report);
    ``content`` is None unless ``dashboard.show_content``. ``tokens_before`` is what the
    client sent (on a checkpoint hit too), ``tokens_after`` what went upstream: on a dry run
    that is the original again (it saved nothing), and ``dry_run_after`` is what compaction
    would have forwarded. ``recall`` is None unless the request was offered the recall tool
    (counts only); ``archived``: the originals its compaction archived.
    """

    request_id: str
    t: float
    method: str | None
    path: str
    route: str
    model: str | None
    upstream: str | None
    status: int
    elapsed_ms: float
    upstream_seconds: float | None
    compaction_seconds: float | None
    reported: bool
    tokens_before: int
    tokens_after: int
    usd_saved: float | None
    strategies: tuple[str, ...]
    checkpoint: str | None
    summarizer_failures: list[str]
    upstream_prompt_tokens: int | None
    content: str | None
    dry_run: bool = False
    dry_run_after: int | None = None
    api: str | None = None  # chat | responses for a compacted API's request
    recall: RecallTally | None = None
    archived: int = 0

    def to_json(self) -> dict[str, Any]:
        """The row as the dashboard's script reads it."""
        reported = self.reported
        upstream_seconds = self.upstream_seconds
        compaction_seconds = self.compaction_seconds
        row: dict[str, Any] = {
            "id": self.request_id,
            "t": self.t,
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "model": self.model,
            "upstream": self.upstream,
            "status": self.status,
            "latency_ms": round(self.elapsed_ms, 1),
            "upstream_ms": None if upstream_seconds is None else round(upstream_seconds * 1000, 1),
            "compaction_ms": None
            if compaction_seconds is None
            else round(compaction_seconds * 1000, 2),
            "tokens_before": self.tokens_before if reported else None,
            "tokens_after": self.tokens_after if reported else None,
            "usd_saved": self.usd_saved,
            "strategies": list(self.strategies),
            "checkpoint": self.checkpoint if reported else None,
            "summarizer_failures": self.summarizer_failures,
            "upstream_prompt_tokens": self.upstream_prompt_tokens,
            "dry_run": self.dry_run,
        }
        if self.dry_run and reported:
            row["dry_run_after"] = self.dry_run_after
        if self.api is not None:
            row["api"] = self.api
        if self.recall is not None:
            row["recall"] = self.recall.to_json()  # counts only, never an id or a text
        if self.archived:
            row["archived"] = self.archived
        if self.content is not None:
            row["content"] = self.content
        return row


@dataclass(slots=True)
class _ModelTotals:
    requests: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    usd_saved: float = 0.0
    # The calibration column: Σ usage.prompt_tokens over Σ our count of the same forwarded
    # requests, so a large request weighs more than a "hi"
    # (compaction_proxy/engine/_calibration.py).
    usage_tokens: int = 0
    counted_tokens: int = 0


@dataclass(slots=True)
class _Minute:
    t: int
    requests: int = 0
    errors: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


@dataclass(slots=True)
class _RecallTotals:
    """The recall panel: requests offered the tool by outcome, and what the loop did."""

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RECALL_OUTCOMES, 0))
    recalled: int = 0  # requests with at least one hidden round
    rounds: int = 0
    calls: int = 0
    ids: int = 0
    tokens: int = 0
    deferred: int = 0  # recall calls dropped from mixed turns
    seconds: float = 0.0
    archived: int = 0

    def add(self, recall: RecallTally | None, archived: int) -> None:
        self.archived += archived
        if recall is None:
            return
        self.outcomes[recall.outcome] = self.outcomes.get(recall.outcome, 0) + 1
        if recall.rounds > 0:
            self.recalled += 1
        self.rounds += recall.rounds
        self.calls += recall.calls
        self.ids += recall.ids
        self.tokens += recall.tokens
        self.deferred += recall.deferred
        self.seconds += recall.seconds

    def to_json(self) -> dict[str, Any]:
        outcomes = self.outcomes
        return {
            "offered": sum(outcomes.values()),
            "recalled": self.recalled,
            "outcomes": dict(outcomes),
            "rounds": self.rounds,
            "calls": self.calls,
            "ids": self.ids,
            "tokens": self.tokens,
            "deferred": self.deferred,
            "unavailable": outcomes.get("unavailable", 0),
            "seconds": round(self.seconds, 3),
            "archived": self.archived,
        }


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    by_api: dict[str, int] = field(default_factory=dict)  # a compacted API's requests, by label
    errors: int = 0
    compacted: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    usd_saved: float = 0.0
    usd_before: float = 0.0
    unpriced_tokens_saved: int = 0
    dry_runs: int = 0
    dry_run_would_save: int = 0  # shown apart: a dry run forwarded the original
    strategies: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=lambda: {"hit": 0, "new": 0, "none": 0})
    summarizer: dict[str, int] = field(default_factory=dict)
    summarizer_failures: int = 0
    summarizer_cached_tokens: int = 0
    summarizer_prefix_calls: int = 0
    summarizer_http_calls: int = 0
    summaries_checked: int = 0
    summary_sections: dict[str, list[int]] = field(default_factory=dict)  # section: [kept, total]
    summary_contradictions: int = 0
    recall: _RecallTotals = field(default_factory=_RecallTotals)


class Dashboard:
    """The dashboard's in-memory figures, fed once per request by the telemetry."""

    def __init__(self, prices: Prices, *, show_content: bool, clock: Callable[[], float]) -> None:
        self.prices = prices
        self.show_content = show_content
        self._clock = clock
        self.started_at = clock()
        self.windows: WindowBook | None = None
        self._totals = _Totals()
        self._by_model: dict[str, _ModelTotals] = {}
        self._recent: deque[RecentRow] = deque(maxlen=RECENT_REQUESTS)
        self._minutes: deque[_Minute] = deque(maxlen=MINUTES)
        self._seconds = [0] * 60
        self._second_stamps = [0] * 60
        self._failures: deque[dict[str, Any]] = deque(maxlen=RECENT_FAILURES)
        self._overflows: dict[str, int] = {}

    # -------------------------------------------------------------- feeding

    def add(
        self,
        row: RecentRow,
        *,
        usd_before: float | None,
        failures: Iterable[StrategyFailure],
        overflow: str | None,
    ) -> None:
        """One request (not a health check, scrape or dashboard read: those are not shown).

        ``usd_before``: what the prompt would have cost uncompacted; ``failures``: the
        report's strategy failures; ``overflow``: the outcome of an overflow refusal, if there
        was one. A checkpoint hit counts as a compaction (``row.strategies`` names it); a dry
        run saved nothing (its row forwards what it got) and is tallied apart.
        """
        totals = self._totals
        before = row.tokens_before
        after = row.tokens_after
        error = row.status >= 400
        api = api_of(row.route)
        if api is not None:
            totals.by_api[api] = totals.by_api.get(api, 0) + 1
        if overflow is not None:
            self._overflows[overflow] = self._overflows.get(overflow, 0) + 1
        if row.reported:
            saved = before - after
            if saved > 0:
                if row.usd_saved is None:
                    totals.unpriced_tokens_saved += saved
                else:
                    totals.usd_saved += row.usd_saved
            if usd_before is not None:
                totals.usd_before += usd_before
            for name in row.strategies:
                totals.strategies[name] = totals.strategies.get(name, 0) + 1
            if row.strategies:
                totals.compacted += 1
            if row.dry_run:
                totals.dry_runs += 1
                if row.dry_run_after is not None and row.dry_run_after < before:
                    totals.dry_run_would_save += before - row.dry_run_after
            checkpoint = row.checkpoint or "none"
            totals.checkpoints[checkpoint] = totals.checkpoints.get(checkpoint, 0) + 1
            totals.tokens_before += before
            totals.tokens_after += after
        totals.recall.add(row.recall, row.archived)
        totals.requests += 1
        totals.errors += error
        now = row.t
        self._count_second(now)
        minute = self._minute(now)
        minute.requests += 1
        minute.errors += error
        minute.tokens_before += before
        minute.tokens_after += after
        model = row.model
        if model is not None:
            per = self._by_model.get(model)
            if per is None:
                per = self._by_model[model] = _ModelTotals()
            per.requests += 1
            per.tokens_before += before
            per.tokens_after += after
            per.usd_saved += row.usd_saved or 0.0
            if row.upstream_prompt_tokens and row.reported and after > 0:
                per.usage_tokens += row.upstream_prompt_tokens
                per.counted_tokens += after
        self._recent.append(row)
        for failure in failures:
            self._failures.append(
                {
                    "t": now,
                    "model": model,
                    "strategy": failure.strategy,
                    "reason": failure.reason,
                    "message": failure.message[:_FAILURE_MESSAGE_CHARS],
                }
            )

    def count_summaries(self, outcomes: Iterable[str]) -> None:
        """Summaries by final outcome (see :mod:`compaction_proxy.observability.outcomes`)."""
        totals = self._totals
        for outcome in outcomes:
            totals.summarizer[outcome] = totals.summarizer.get(outcome, 0) + 1
            if outcome != "ok":
                totals.summarizer_failures += 1

    def count_summary_check(
        self, sections: Iterable[tuple[str, int, int]], contradictions: int
    ) -> None:
        """One stored summary's check: (section, kept, total) of what it kept of its span on
        its own, and the rules it may contradict."""
        totals = self._totals
        totals.summaries_checked += 1
        totals.summary_contradictions += contradictions
        for section, kept, total in sections:
            kept_total = totals.summary_sections.setdefault(section, [0, 0])
            kept_total[0] += kept
            kept_total[1] += total

    def count_summarizer_call(self, form: str, cached_tokens: int) -> None:
        """One summarizer HTTP call: its form (``prefix`` or ``transcript``) and the prompt
        tokens the upstream served from its cache."""
        totals = self._totals
        totals.summarizer_http_calls += 1
        totals.summarizer_cached_tokens += cached_tokens
        if form == "prefix":
            totals.summarizer_prefix_calls += 1

    def _count_second(self, now: float) -> None:
        second = int(now)
        slot = second % 60
        if self._second_stamps[slot] != second:
            self._second_stamps[slot] = second
            self._seconds[slot] = 0
        self._seconds[slot] += 1

    def _minute(self, now: float) -> _Minute:
        t = int(now // 60) * 60
        minutes = self._minutes
        if not minutes or minutes[-1].t != t:
            minutes.append(_Minute(t))
        return minutes[-1]

    # -------------------------------------------------------------- reading

    def requests_last_minute(self, now: float | None = None) -> int:
        """Requests in the 60 whole seconds up to ``now`` (a per-second ring)."""
        now = self._clock() if now is None else now
        floor = int(now) - 59
        return sum(
            count
            for count, stamp in zip(self._seconds, self._second_stamps, strict=True)
            if stamp >= floor
        )

    def snapshot(self) -> dict[str, Any]:
        """The dashboard's data: totals, series, breakdowns and the recent requests."""
        now = self._clock()
        totals = self._totals
        by_minute = {m.t: m for m in self._minutes}
        this_minute = int(now // 60) * 60
        minutes = []
        for t in range(this_minute - (MINUTES - 1) * 60, this_minute + 60, 60):
            m = by_minute.get(t)
            minutes.append(
                {
                    "t": t,
                    "requests": m.requests if m else 0,
                    "errors": m.errors if m else 0,
                    "tokens_before": m.tokens_before if m else 0,
                    "tokens_after": m.tokens_after if m else 0,
                }
            )
        models: list[dict[str, Any]] = [
            {
                "model": name,
                "requests": per.requests,
                "tokens_before": per.tokens_before,
                "tokens_after": per.tokens_after,
                "tokens_saved": per.tokens_before - per.tokens_after,
                "usd_saved": round(per.usd_saved, 6),
                "usd_per_million": self.prices.per_million(name),
                "calibration": round(per.usage_tokens / per.counted_tokens, 4)
                if per.counted_tokens
                else None,
            }
            for name, per in self._by_model.items()
        ]
        models.sort(key=lambda item: (-item["tokens_saved"], -item["requests"]))
        return {
            "version": __version__,
            "now": now,
            "started_at": self.started_at,
            "show_content": self.show_content,
            "totals": {
                "requests": totals.requests,
                "api_requests": {wire.api: totals.by_api.get(wire.api, 0) for wire in FORMATS},
                "chat_requests": totals.by_api.get("chat", 0),
                "responses_requests": totals.by_api.get("responses", 0),
                "errors": totals.errors,
                "compacted": totals.compacted,
                "tokens_before": totals.tokens_before,
                "tokens_after": totals.tokens_after,
                "tokens_saved": totals.tokens_before - totals.tokens_after,
                "usd_saved": round(totals.usd_saved, 6),
                "usd_before": round(totals.usd_before, 6),
                "unpriced_tokens_saved": totals.unpriced_tokens_saved,
                "dry_runs": totals.dry_runs,
                "dry_run_would_save": totals.dry_run_would_save,
            },
            "requests_last_minute": self.requests_last_minute(now),
            "minutes": minutes,
            "strategies": dict(sorted(totals.strategies.items(), key=lambda kv: -kv[1])),
            "checkpoints": dict(totals.checkpoints),
            "summarizer": {
                "outcomes": dict(totals.summarizer),
                "failures": totals.summarizer_failures,
                "calls": totals.summarizer_http_calls,
                "prefix_calls": totals.summarizer_prefix_calls,
                "cached_tokens": totals.summarizer_cached_tokens,
                "recent_failures": list(reversed(self._failures)),
                "kept": _kept_json(totals),
            },
            "recall": totals.recall.to_json(),
            "models": models,
            "windows": self.windows.table() if self.windows is not None else [],
            "overflows": dict(self._overflows),
            "recent": [row.to_json() for row in reversed(self._recent)],
        }


def _kept_json(totals: _Totals) -> dict[str, Any]:
    """The summaries checked and what they kept on their own ("summaries kept")."""
    sections = totals.summary_sections
    return {
        "summaries": totals.summaries_checked,
        "kept": sum(kept for kept, _ in sections.values()),
        "total": sum(total for _, total in sections.values()),
        "sections": {name: {"kept": k, "total": t} for name, (k, t) in sections.items()},
        "contradictions": totals.summary_contradictions,
    }
