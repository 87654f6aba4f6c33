"""Observability: Prometheus metrics and the in-process telemetry behind the dashboard.

Everything is fed from one place: :meth:`Telemetry.record_request`, called once per request
where the access log is written (``ProxyApp.__call__``), from what the request left on its
:class:`~proxy.context.RequestContext`. Two things cannot wait for the end of the request and
have their own hooks: summarizer HTTP calls (a :class:`SummarizerStats` listener) and the
tokenizer fallback counter (read at scrape time).

What never goes into a label, the dashboard data or the recent-requests buffer: a key, a
header value, a query string, conversation content (unless ``dashboard.show_content``).
Label values a client controls (the model name) are capped: after ``MAX_MODELS`` distinct
values every new one is ``other``.

Each :class:`Telemetry` has its own :class:`CollectorRegistry`, so several apps in one process
(the tests) never share counters.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy import __version__

if TYPE_CHECKING:
    from proxy.compaction import CompactionReport
    from proxy.compaction.tokenizer_provider import TokenizerProvider
    from proxy.config import Settings
    from proxy.context import RequestContext
    from proxy.summaries.stores import StoreBreaker
    from proxy.summaries.summarizer import SummarizerStats, SummaryCallRecord
    from proxy.windows import WindowBook

log = logging.getLogger("compaction_proxy.metrics")

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PRICES",
    "LabelCap",
    "Prices",
    "Telemetry",
    "UsageProbe",
    "last_user_text",
    "route_of",
    "summarizer_calls",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

ROUTE_CHAT = "chat_completions"
ROUTE_PREVIEW = "preview"
ROUTE_PASSTHROUGH = "passthrough"
ROUTE_OTHER = "other"

MAX_MODELS = 100
"""Distinct model label values kept per metric family; later ones are counted as ``other``."""
RECENT_REQUESTS = 200
"""Rows of the dashboard's recent-requests table (a ring buffer)."""
CONTENT_CHARS = 500
"""How much of the last user message a row keeps when ``dashboard.show_content`` is on."""
MINUTES = 60
"""Per-minute buckets of the dashboard's time series."""

# Buckets. Latency to response headers: a streaming reply starts in well under a second, a
# non-streaming one of a reasoning model can take minutes.
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COMPACTION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
TOKEN_BUCKETS = (
    250,
    500,
    1_000,
    2_000,
    4_000,
    8_000,
    16_000,
    32_000,
    64_000,
    128_000,
    256_000,
    512_000,
    1_000_000,
    2_000_000,
)
SUMMARIZER_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
RATIO_BUCKETS = (0.5, 0.75, 0.85, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.15, 1.25, 1.5, 2.0)

# USD per 1M input tokens (OpenAI's standard, non-cached list prices). `dashboard.prices`
# entries come first; among each set the exact name, then the longest glob wins.
DEFAULT_PRICES: dict[str, float] = {
    "gpt-5": 1.25,
    "gpt-5-*": 1.25,
    "gpt-5-mini*": 0.25,
    "gpt-5-nano*": 0.05,
    "gpt-4.1": 2.00,
    "gpt-4.1-*": 2.00,
    "gpt-4.1-mini*": 0.40,
    "gpt-4.1-nano*": 0.10,
    "gpt-4o": 2.50,
    "gpt-4o-*": 2.50,
    "gpt-4o-mini*": 0.15,
    "gpt-4-turbo*": 10.00,
    "gpt-3.5-turbo*": 0.50,
    "o1": 15.00,
    "o1-*": 15.00,
    "o1-mini*": 1.10,
    "o3": 2.00,
    "o3-*": 2.00,
    "o3-mini*": 1.10,
    "o4-mini*": 1.10,
}

# Summarizer outcomes the strategy may report after an HTTP call that itself succeeded.
_AFTER_OK_CALL = frozenset({"not_shorter", "empty", "error"})

summarizer_calls: ContextVar[list[str] | None] = ContextVar("summarizer_calls", default=None)
"""The current request's summarizer HTTP call outcomes (set around the compaction flow).

The listener appends to it instead of counting at once, so the end of the request can
reconcile the calls with the report's failures: a backoff never reaches the HTTP summarizer,
and an ``ok`` call whose summary the pipeline then rejects (``not_shorter``) counts once,
under that reason.
"""


def route_of(method: str | None, path: str) -> str:
    """The ``route`` label of a request: four values, whatever the path."""
    if path.startswith("/v1/"):
        if path == "/v1/chat/completions" and method == "POST":
            return ROUTE_CHAT
        if path == "/v1/compaction/preview":
            return ROUTE_PREVIEW
        return ROUTE_PASSTHROUGH
    return ROUTE_OTHER


class LabelCap:
    """Bounds a client-controlled label: the first ``limit`` distinct values, then ``other``."""

    def __init__(self, limit: int = MAX_MODELS, overflow: str = "other") -> None:
        self.limit = limit
        self.overflow = overflow
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return "unknown"
        if value in self._seen:
            return value
        if len(self._seen) < self.limit and len(value) <= 128 and value.isprintable():
            self._seen.add(value)
            return value
        return self.overflow


class Prices:
    """USD per 1M input tokens by model name or glob (``dashboard.prices`` over the defaults)."""

    def __init__(self, configured: Mapping[str, float] | None = None, *, defaults: bool = True):
        order: list[tuple[str, float]] = []
        for table in (configured or {}, DEFAULT_PRICES if defaults else {}):
            exact = [(p, v) for p, v in table.items() if not _is_glob(p)]
            globs = sorted(
                ((p, v) for p, v in table.items() if _is_glob(p)), key=lambda item: -len(item[0])
            )
            order.extend(exact + globs)
        self._order = order
        self._cache: dict[str, float | None] = {}

    def per_million(self, model: str | None) -> float | None:
        if not model:
            return None
        if model in self._cache:
            return self._cache[model]
        price = None
        # A provider prefix ("openai/gpt-4o") is tried as given, then without it.
        candidates = [model, model.rsplit("/", 1)[-1]] if "/" in model else [model]
        for candidate in candidates:
            for pattern, value in self._order:
                if candidate == pattern or fnmatch.fnmatchcase(candidate, pattern):
                    price = value
                    break
            if price is not None:
                break
        if len(self._cache) < 4096:
            self._cache[model] = price
        return price

    def usd(self, model: str | None, tokens: int) -> float | None:
        price = self.per_million(model)
        return None if price is None else tokens * price / 1_000_000


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def last_user_text(messages: Sequence[Any], limit: int = CONTENT_CHARS) -> str | None:
    """The last user message's text, truncated (only kept when ``dashboard.show_content``)."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        if not isinstance(content, str):
            return None
        return content if len(content) <= limit else content[: limit - 1] + "\u2026"
    return None


# ------------------------------------------------------------------ the usage probe

_JSON_LIMIT = 1 << 20
_SSE_TAIL = 4096
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


class UsageProbe:
    """Reads ``usage.prompt_tokens`` from an upstream reply as it is relayed.

    It sees each chunk after it was sent to the client and never changes or holds one back:
    a JSON body (uncompressed, at most 1 MiB) is kept until the end and parsed once; an SSE
    stream keeps only its last 4 KiB, where the usage chunk is.
    """

    __slots__ = ("_parts", "_size", "_sse", "_tail")

    def __init__(self, sse: bool) -> None:
        self._sse = sse
        self._parts: list[bytes] | None = None if sse else []
        self._size = 0
        self._tail = b""

    @classmethod
    def start(
        cls, content_type: str, content_encoding: str | None, content_length: str | None
    ) -> UsageProbe | None:
        if content_encoding and content_encoding.strip().lower() != "identity":
            return None
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            return cls(sse=True)
        if media == "application/json":
            if content_length is not None:
                try:
                    if int(content_length) > _JSON_LIMIT:
                        return None
                except ValueError:
                    return None
            return cls(sse=False)
        return None

    def feed(self, chunk: bytes) -> None:
        if self._sse:
            if len(chunk) >= _SSE_TAIL:
                self._tail = chunk[-_SSE_TAIL:]
            else:
                self._tail = (self._tail + chunk)[-_SSE_TAIL:]
            return
        parts = self._parts
        if parts is None:
            return
        self._size += len(chunk)
        if self._size > _JSON_LIMIT:
            self._parts = None
        else:
            parts.append(chunk)

    def prompt_tokens(self) -> int | None:
        try:
            if self._sse:
                return _sse_prompt_tokens(self._tail)
            if self._parts is None:
                return None
            return _usage_prompt_tokens(orjson.loads(b"".join(self._parts)))
        except (orjson.JSONDecodeError, ValueError):
            return None


def _usage_prompt_tokens(payload: Any) -> int | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    tokens = usage.get("prompt_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return None


def _sse_prompt_tokens(tail: bytes) -> int | None:
    """The prompt tokens of the last SSE event in ``tail`` whose ``usage`` is an object."""
    end = len(tail)
    while True:
        at = tail.rfind(b'"usage"', 0, end)
        if at < 0:
            return None
        line_start = tail.rfind(b"\n", 0, at) + 1
        line_end = tail.find(b"\n", at)
        if line_end < 0:
            line_end = len(tail)
        line = tail[line_start:line_end].strip()
        tokens = None
        if line.startswith(b"data:"):
            try:
                tokens = _usage_prompt_tokens(orjson.loads(line[5:]))
            except orjson.JSONDecodeError:
                tokens = None
        if tokens is None:
            # The event began before the tail: its usage object may still be whole.
            usage = tail[at:line_end]
            if not usage[7:].lstrip(b" :").startswith(b"null"):
                found = _PROMPT_TOKENS.search(usage)
                tokens = int(found.group(1)) if found else None
        if tokens:
            return tokens
        end = at


# ------------------------------------------------------------------ Prometheus


class _TokenizerFallback:
    """``compaction_proxy_tokenizer_fallback_total``, read from the provider at scrape time."""

    def __init__(self, tokenizers: TokenizerProvider) -> None:
        self._tokenizers = tokenizers

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [self._family(0)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield self._family(self._tokenizers.fallback_uses)

    @staticmethod
    def _family(value: int) -> CounterMetricFamily:
        return CounterMetricFamily(
            "compaction_proxy_tokenizer_fallback",
            "Token counts made with the 4-characters-a-token estimator because a tiktoken "
            "encoding was unavailable",
            value=value,
        )


class _ContextWindows:
    """``compaction_proxy_context_window_tokens``: learned and discovered windows in use, read
    from the :class:`~proxy.windows.WindowBook` at scrape time (bounded by its table)."""

    def __init__(self, book: WindowBook) -> None:
        self._book = book

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for row in self._book.table():
            family.add_metric([row["upstream"], row["model"], row["source"]], row["window"])
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "compaction_proxy_context_window_tokens",
            "Context windows the proxy learned from upstream refusals (source=learned) or read "
            "from an upstream's model listing (source=discovered), per upstream and model",
            labels=["upstream", "model", "source"],
        )


class _StoreHealth:
    """The checkpoint store's breaker, read at scrape time: whether the store is up, how often
    it was marked down, calls skipped while down, and foreign values found (and deleted)."""

    def __init__(self, store: StoreBreaker) -> None:
        self._store = store

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return list(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        store = self._store
        up, opened, skipped, foreign = self._families()
        label = [store.name]
        up.add_metric(label, 1 if store.readiness().up else 0)
        opened.add_metric(label, store.opened)
        skipped.add_metric(label, store.skipped)
        foreign.add_metric(label, store.foreign_values)
        yield from (up, opened, skipped, foreign)

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "compaction_proxy_store_up",
                "1 while the checkpoint store answers, 0 while its breaker holds it down",
                labels=["backend"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_breaker_opened",
                "Times the checkpoint store was marked down after a timeout or connection error",
                labels=["backend"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_calls_skipped",
                "Store calls skipped at once because the store was marked down",
                labels=["backend"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_foreign_values",
                "Stored values that were not checkpoints of this proxy: read as a miss, deleted",
                labels=["backend"],
            ),
        )


class PrometheusMetrics:
    """The metric families, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "compaction_proxy_requests",
            "Requests handled, by route and response status (499: the client went away)",
            ["route", "status"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "compaction_proxy_upstream_latency_seconds",
            "Time from sending a request upstream to its response headers",
            ["upstream"],
            buckets=UPSTREAM_BUCKETS,
            registry=r,
        )
        self.compaction_seconds = Histogram(
            "compaction_proxy_compaction_seconds",
            "Time spent compacting a chat request, checkpoint lookup and summaries included",
            buckets=COMPACTION_BUCKETS,
            registry=r,
        )
        self.tokens_before = Histogram(
            "compaction_proxy_prompt_tokens_before",
            "Prompt tokens of a chat request before compaction (the proxy's count)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_after = Histogram(
            "compaction_proxy_prompt_tokens_after",
            "Prompt tokens of the chat request as forwarded (the proxy's count)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_saved = Counter(
            "compaction_proxy_tokens_saved",
            "Prompt tokens removed by compaction (before minus after)",
            registry=r,
        )
        self.strategy_runs = Counter(
            "compaction_proxy_strategy_runs",
            "Strategies that changed a forwarded request",
            ["strategy"],
            registry=r,
        )
        self.checkpoint_lookups = Counter(
            "compaction_proxy_checkpoint_lookups",
            "Checkpoint outcomes of compacted chat requests: hit (a stored checkpoint was "
            "used), new (one was stored), none",
            ["result"],
            registry=r,
        )
        self.summarizer_calls = Counter(
            "compaction_proxy_summarizer_calls",
            "Summaries asked of the summarizer model, by outcome (ok, timeout, error, empty, "
            "oversized, not_shorter; backoff: refused without a call)",
            ["outcome"],
            registry=r,
        )
        self.summarizer_failures = Counter(
            "compaction_proxy_summarizer_failures",
            "Summarizer calls whose outcome was not ok",
            registry=r,
        )
        self.summarizer_latency = Histogram(
            "compaction_proxy_summarizer_latency_seconds",
            "Duration of one summarizer HTTP call",
            buckets=SUMMARIZER_BUCKETS,
            registry=r,
        )
        self.calibration = Histogram(
            "compaction_proxy_token_count_calibration_ratio",
            "The upstream's usage.prompt_tokens divided by the proxy's own count of the same "
            "forwarded request",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.overflow_retries = Counter(
            "compaction_proxy_overflow_retries",
            "Chat requests an upstream refused as too long for its context window, by outcome: "
            "fixed (compacted, retried and accepted), refused_again (retried, still refused), "
            "passed_through (nothing smaller to offer: the refusal went to the client)",
            ["upstream", "outcome"],
            registry=r,
        )
        Info("compaction_proxy_build", "The running version", registry=r).info(
            {"version": __version__}
        )


# ------------------------------------------------------------------ telemetry


@dataclass(slots=True)
class _ModelTotals:
    requests: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    usd_saved: float = 0.0
    ratio_sum: float = 0.0
    ratio_n: int = 0


@dataclass(slots=True)
class _Minute:
    t: int
    requests: int = 0
    errors: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    chat_requests: int = 0
    errors: int = 0
    compacted: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    usd_saved: float = 0.0
    usd_before: float = 0.0
    unpriced_tokens_saved: int = 0
    strategies: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=lambda: {"hit": 0, "new": 0, "none": 0})
    summarizer: dict[str, int] = field(default_factory=dict)
    summarizer_failures: int = 0


class Telemetry:
    """Prometheus metrics plus what the dashboard shows, fed once per request."""

    def __init__(
        self,
        settings: Settings,
        *,
        tokenizers: TokenizerProvider | None = None,
        clock: Any = time.time,
    ) -> None:
        self.registry = CollectorRegistry()
        self.metrics = PrometheusMetrics(self.registry)
        if tokenizers is not None:
            self.registry.register(_TokenizerFallback(tokenizers))
        self.show_content = settings.dashboard.show_content
        self.prices = Prices(settings.dashboard.prices)
        self._clock = clock
        self.started_at = clock()
        self._models = LabelCap()
        self._totals = _Totals()
        self._by_model: dict[str, _ModelTotals] = {}
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=RECENT_REQUESTS)
        self._upstream_children: dict[str, Any] = {}
        self._minutes: deque[_Minute] = deque(maxlen=MINUTES)
        self._seconds = [0] * 60
        self._second_stamps = [0] * 60
        self._failures: deque[dict[str, Any]] = deque(maxlen=20)
        self._request_children: dict[tuple[str, int], Any] = {}
        self._windows: WindowBook | None = None
        self._overflows: dict[str, int] = {}

    # -------------------------------------------------------------- feeding

    def watch_store(self, store: StoreBreaker) -> None:
        """Expose the checkpoint store's breaker (called once, when the app is built)."""
        self.registry.register(_StoreHealth(store))

    def watch_windows(self, book: WindowBook) -> None:
        """Expose the learned and discovered windows (called once, when the app is built)."""
        self._windows = book
        self.registry.register(_ContextWindows(book))

    def watch_summarizer(self, stats: SummarizerStats) -> None:
        """Count the summarizer's HTTP calls (called once, when the flow is built)."""
        stats.listeners.append(self._on_summarizer_call)

    def _on_summarizer_call(self, record: SummaryCallRecord) -> None:
        self.metrics.summarizer_latency.observe(record.seconds)
        pending = summarizer_calls.get()
        if pending is not None:
            pending.append(record.outcome)  # counted at the end of the request
        else:
            self._count_summaries([record.outcome], None)

    def record_request(self, ctx: RequestContext, method: str | None, path: str) -> None:
        """Everything one request contributes; never raises (it runs in a finally)."""
        try:
            self._record(ctx, method, path)
        except Exception:
            log.exception("telemetry failed for one request")

    def _record(self, ctx: RequestContext, method: str | None, path: str) -> None:
        route = route_of(method, path)
        status = ctx.status or 500
        child = self._request_children.get((route, status))
        if child is None:
            child = self.metrics.requests.labels(route, str(status))
            self._request_children[(route, status)] = child
        child.inc()
        if route == ROUTE_OTHER:
            return  # health checks, scrapes and the dashboard itself: counted, not shown
        m = self.metrics
        if ctx.upstream_seconds is not None and ctx.upstream:
            latency = self._upstream_children.get(ctx.upstream)
            if latency is None:
                latency = self._upstream_children[ctx.upstream] = m.upstream_latency.labels(
                    ctx.upstream
                )
            latency.observe(ctx.upstream_seconds)
        report = ctx.report if route == ROUTE_CHAT else None
        if ctx.overflow_outcome is not None:
            m.overflow_retries.labels(ctx.upstream or "unknown", ctx.overflow_outcome).inc()
            self._overflows[ctx.overflow_outcome] = self._overflows.get(ctx.overflow_outcome, 0) + 1
        error = status >= 400
        before = after = 0
        usd_saved: float | None = None
        strategies: tuple[str, ...] = ()
        failed: list[str] = []
        totals = self._totals
        model = self._models(ctx.model) if ctx.model else None
        ratio = None
        if route == ROUTE_CHAT:
            totals.chat_requests += 1
            if ctx.compaction_seconds is not None:
                m.compaction_seconds.observe(ctx.compaction_seconds)
            outcomes = self._count_summaries(ctx.summarizer_calls or [], report)
            failed = [o for o in outcomes if o != "ok"]
        if report is not None:
            before, after, strategies = _forwarded(report)
            m.tokens_before.observe(before)
            m.tokens_after.observe(after)
            saved = before - after
            if saved > 0:
                m.tokens_saved.inc(saved)
                usd_saved = self.prices.usd(ctx.model, saved)
                if usd_saved is None:
                    totals.unpriced_tokens_saved += saved
                else:
                    totals.usd_saved += usd_saved
            usd_before = self.prices.usd(ctx.model, before)
            if usd_before is not None:
                totals.usd_before += usd_before
            for name in strategies:
                m.strategy_runs.labels(name).inc()
                totals.strategies[name] = totals.strategies.get(name, 0) + 1
            if strategies:
                totals.compacted += 1
            checkpoint = ctx.checkpoint or "none"
            m.checkpoint_lookups.labels(checkpoint).inc()
            totals.checkpoints[checkpoint] = totals.checkpoints.get(checkpoint, 0) + 1
            totals.tokens_before += before
            totals.tokens_after += after
            if ctx.upstream_prompt_tokens and after > 0:
                ratio = ctx.upstream_prompt_tokens / after
                m.calibration.labels(model or "unknown").observe(ratio)
        totals.requests += 1
        totals.errors += error
        now = self._clock()
        self._count_second(now)
        minute = self._minute(now)
        minute.requests += 1
        minute.errors += error
        minute.tokens_before += before
        minute.tokens_after += after
        if model is not None:
            per = self._by_model.get(model)
            if per is None:
                per = self._by_model[model] = _ModelTotals()
            per.requests += 1
            per.tokens_before += before
            per.tokens_after += after
            per.usd_saved += usd_saved or 0.0
            if ratio is not None:
                per.ratio_sum += ratio
                per.ratio_n += 1
        # A tuple now, a dict when the dashboard asks (_row): the hot path pays for little.
        self._recent.append(
            (
                ctx.request_id,
                now,
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
                before,
                after,
                usd_saved,
                strategies,
                ctx.checkpoint,
                failed,
                ctx.upstream_prompt_tokens,
                ctx.content if self.show_content else None,
            )
        )
        if report is not None:
            for failure in report.failures:
                self._failures.append(
                    {
                        "t": now,
                        "model": model,
                        "strategy": failure.strategy,
                        "reason": failure.reason,
                        "message": failure.message[:300],
                    }
                )

    def _count_summaries(self, calls: list[str], report: CompactionReport | None) -> list[str]:
        """Final outcomes of a request's summaries: its HTTP calls, reconciled with the
        report's failures (see :data:`summarizer_calls`)."""
        outcomes = list(calls)
        matched = [False] * len(outcomes)
        for failure in report.failures if report is not None else ():
            reason = failure.reason
            index = next(
                (i for i, o in enumerate(outcomes) if not matched[i] and o == reason), None
            )
            if index is None and reason in _AFTER_OK_CALL:
                index = next(
                    (
                        i
                        for i in range(len(outcomes) - 1, -1, -1)
                        if not matched[i] and outcomes[i] == "ok"
                    ),
                    None,
                )
                if index is not None:
                    outcomes[index] = reason
            if index is None:
                outcomes.append(reason)
                matched.append(True)
            else:
                matched[index] = True
        totals = self._totals
        for outcome in outcomes:
            self.metrics.summarizer_calls.labels(outcome).inc()
            totals.summarizer[outcome] = totals.summarizer.get(outcome, 0) + 1
            if outcome != "ok":
                self.metrics.summarizer_failures.inc()
                totals.summarizer_failures += 1
        return outcomes

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

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)

    def requests_last_minute(self, now: float | None = None) -> int:
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
        models = [
            {
                "model": name,
                "requests": per.requests,
                "tokens_before": per.tokens_before,
                "tokens_after": per.tokens_after,
                "tokens_saved": per.tokens_before - per.tokens_after,
                "usd_saved": round(per.usd_saved, 6),
                "usd_per_million": self.prices.per_million(name),
                "calibration": round(per.ratio_sum / per.ratio_n, 4) if per.ratio_n else None,
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
                "chat_requests": totals.chat_requests,
                "errors": totals.errors,
                "compacted": totals.compacted,
                "tokens_before": totals.tokens_before,
                "tokens_after": totals.tokens_after,
                "tokens_saved": totals.tokens_before - totals.tokens_after,
                "usd_saved": round(totals.usd_saved, 6),
                "usd_before": round(totals.usd_before, 6),
                "unpriced_tokens_saved": totals.unpriced_tokens_saved,
            },
            "requests_last_minute": self.requests_last_minute(now),
            "minutes": minutes,
            "strategies": dict(sorted(totals.strategies.items(), key=lambda kv: -kv[1])),
            "checkpoints": dict(totals.checkpoints),
            "summarizer": {
                "outcomes": dict(totals.summarizer),
                "failures": totals.summarizer_failures,
                "recent_failures": list(reversed(self._failures)),
            },
            "models": models,
            "windows": self._windows.table() if self._windows is not None else [],
            "overflows": dict(self._overflows),
            "recent": [_row(item) for item in reversed(self._recent)],
        }


def _forwarded(report: CompactionReport) -> tuple[int, int, tuple[str, ...]]:
    """Tokens before, tokens forwarded and the strategies that changed what was forwarded.

    A dry run forwards the original: nothing was saved and no strategy changed anything.
    """
    if report.mode == "dry-run":
        return report.tokens_before, report.tokens_before, ()
    return report.tokens_before, report.tokens_after, report.changed_by


def _row(item: tuple[Any, ...]) -> dict[str, Any]:
    """One recent request as the dashboard shows it."""
    (
        request_id,
        t,
        method,
        path,
        route,
        model,
        upstream,
        status,
        elapsed_ms,
        upstream_seconds,
        compaction_seconds,
        reported,
        before,
        after,
        usd_saved,
        strategies,
        checkpoint,
        failed,
        upstream_prompt_tokens,
        content,
    ) = item
    row: dict[str, Any] = {
        "id": request_id,
        "t": t,
        "method": method,
        "path": path,
        "route": route,
        "model": model,
        "upstream": upstream,
        "status": status,
        "latency_ms": round(elapsed_ms, 1),
        "upstream_ms": None if upstream_seconds is None else round(upstream_seconds * 1000, 1),
        "compaction_ms": None
        if compaction_seconds is None
        else round(compaction_seconds * 1000, 2),
        "tokens_before": before if reported else None,
        "tokens_after": after if reported else None,
        "usd_saved": usd_saved,
        "strategies": list(strategies),
        "checkpoint": checkpoint if reported else None,
        "summarizer_failures": failed,
        "upstream_prompt_tokens": upstream_prompt_tokens,
    }
    if content is not None:
        row["content"] = content
    return row
