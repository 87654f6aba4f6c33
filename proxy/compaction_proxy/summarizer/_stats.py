"""What the summarizer's calls are counted as: one record per HTTP call, the outcomes of one
request's calls (reconciled with its report when it ends), and the process's totals, which
the edge exports as metrics (compaction_proxy/observability/)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SummaryCallRecord:
    """One summarizer HTTP call, for metrics: ``outcome`` is ``ok`` or a failure reason.

    ``per_request``: the outcome also went to the :class:`SummaryCalls` of the request the call
    was made for, and that request counts it when it ends (reconciled with its report); a
    listener must then not count it a second time. False: no request keeps the call, so it is
    counted as it happens.
    """

    upstream: str
    model: str
    outcome: str
    seconds: float
    per_request: bool = False
    cached_tokens: int = 0
    """``usage.prompt_tokens_details.cached_tokens`` of the reply (0: none or not reported)."""
    form: str = "transcript"
    """``prefix`` (the request's own prefix plus an instruction) or ``transcript``."""


@dataclass(slots=True)
class SummaryCalls:
    """The outcomes of the summarizer HTTP calls made for one request, in order.

    The edge creates one per request and hands it to the flow, which binds it to that request's
    summarizer (:meth:`HttpSummarizer.bind`). Telemetry reads it when the request ends, because
    only then can the calls be reconciled with the report's failures: a back-off never reaches
    the HTTP summarizer, and an ``ok`` call whose summary the pipeline then rejects
    (``not_shorter``) must count once, under that reason. Explicit rather than a context
    variable, so what a request made is visible where it is created and where it is read.
    """

    outcomes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SummarizerStats:
    """Counts and total latency per (upstream, model, outcome); the edge exports them.

    ``listeners`` are called with every record as it happens (e.g. a Prometheus histogram).
    ``cached_tokens``: prompt tokens the upstream served from its cache, per (upstream, model);
    ``forms``: calls per form (``prefix``, ``transcript``).
    """

    calls: dict[tuple[str, str, str], int] = field(default_factory=dict)
    seconds: dict[tuple[str, str, str], float] = field(default_factory=dict)
    cached_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    forms: dict[str, int] = field(default_factory=dict)
    listeners: list[Callable[[SummaryCallRecord], None]] = field(default_factory=list)

    def record(self, record: SummaryCallRecord) -> None:
        key = (record.upstream, record.model, record.outcome)
        self.calls[key] = self.calls.get(key, 0) + 1
        self.seconds[key] = self.seconds.get(key, 0.0) + record.seconds
        if record.cached_tokens:
            where = (record.upstream, record.model)
            self.cached_tokens[where] = self.cached_tokens.get(where, 0) + record.cached_tokens
        self.forms[record.form] = self.forms.get(record.form, 0) + 1
        for listener in self.listeners:
            listener(record)

    def count(self, outcome: str) -> int:
        """Calls with ``outcome`` over every upstream and model."""
        return sum(n for (_, _, o), n in self.calls.items() if o == outcome)

    def total_cached_tokens(self) -> int:
        """Cached prompt tokens over every upstream and model."""
        return sum(self.cached_tokens.values())
