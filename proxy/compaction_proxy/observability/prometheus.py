"""The Prometheus side: the metric families of one app, and the collectors read at scrape time.

Each app gets a registry of its own (:class:`PrometheusMetrics`), so several apps in one
process (the tests) never share counters. Figures another object already keeps (tokenizer
fallbacks, learned windows, the store breaker) are not copied into counters as they change:
a collector reads them when ``/metrics`` is scraped, so the request path pays nothing for them.

What never goes into a label: a key, a header value, a query string, conversation content.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from compaction_proxy import __version__

if TYPE_CHECKING:
    from compaction_proxy.checkpoints import StoreBreaker
    from compaction_proxy.compaction.tokenizer_provider import TokenizerProvider
    from compaction_proxy.engine import DegradedPaths, PreparedStats
    from compaction_proxy.upstream import WindowBook

__all__ = [
    "CONTENT_TYPE",
    "ContextWindows",
    "DegradedHealth",
    "PreparedSummaries",
    "PrometheusMetrics",
    "StoreHealth",
    "TokenizerFallback",
    "WithheldSummaries",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of :meth:`PrometheusMetrics.exposition` (the text format)."""

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


class PrometheusMetrics:
    """The metric families, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self._request_families(r)
        self._compaction_families(r)
        self._summarizer_families(r)
        self._recall_families(r)
        Info("compaction_proxy_build", "The running version", registry=r).info(
            {"version": __version__}
        )

    def _request_families(self, r: CollectorRegistry) -> None:
        """What every request and its upstream call are counted as."""
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

    def _compaction_families(self, r: CollectorRegistry) -> None:
        """What compaction did to the chat requests: time, tokens, strategies, checkpoints."""
        self.compaction_seconds = Histogram(
            "compaction_proxy_compaction_seconds",
            "Time spent compacting a chat request, checkpoint lookup and summaries included",
            buckets=COMPACTION_BUCKETS,
            registry=r,
        )
        self.tokens_before = Histogram(
            "compaction_proxy_prompt_tokens_before",
            "Prompt tokens of a chat request as the client sent it, on a checkpoint hit too "
            "(the proxy's count)",
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
            "Prompt tokens removed by compaction (before minus after), checkpoint hits "
            "included, dry runs not",
            registry=r,
        )
        self.api_prompt_tokens = Counter(
            "compaction_proxy_api_prompt_tokens",
            "Prompt tokens of compacted requests per API (api=chat: chat completions, "
            "api=responses: the Responses API, api=messages: Anthropic's Messages API), "
            "stage=before as the client sent them, "
            "stage=after as forwarded (the proxy's count; the other token families sum both)",
            ["api", "stage"],
            registry=r,
        )
        self.strategy_runs = Counter(
            "compaction_proxy_strategy_runs",
            "Strategies that changed a forwarded request (checkpoint: a checkpoint hit)",
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

    def _summarizer_families(self, r: CollectorRegistry) -> None:
        """The summarizer's calls, their outcomes and the summaries prepared ahead."""
        self.summarizer_calls = Counter(
            "compaction_proxy_summarizer_calls",
            "Summaries asked of the summarizer model, by outcome (ok, timeout, error, empty, "
            "oversized, not_shorter; cut: kept as its complete lines after running past its "
            "limit; overflow: refused as too long for its window; backoff: "
            "refused without a call)",
            ["outcome"],
            registry=r,
        )
        self.summarizer_failures = Counter(
            "compaction_proxy_summarizer_failures",
            "Summarizer calls whose outcome was not ok",
            registry=r,
        )
        self.summarizer_cached_tokens = Counter(
            "compaction_proxy_summarizer_cached_tokens",
            "Prompt tokens of summarizer calls the upstream served from its prompt cache "
            "(usage.prompt_tokens_details.cached_tokens)",
            registry=r,
        )
        self.prepared_age = Histogram(
            "compaction_proxy_prepared_summary_age_seconds",
            "How long a summary prepared ahead of its trigger waited before a compaction "
            "used it (summarization.prepare)",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.summary_strings = Counter(
            "compaction_proxy_summary_strings",
            "The folded spans' exact strings and rules each stored summary was checked "
            "against, by section (files, commands, errors, urls, identifiers, numbers, open, "
            "statements, rules; other) and outcome: kept (in the summary on its own) or missing",
            ["section", "outcome"],
            registry=r,
        )
        self.summary_contradictions = Counter(
            "compaction_proxy_summary_contradictions",
            "Rules (a never, do not, must not, no) a stored summary may contradict: their key "
            "words in one of its sentences without a negation",
            registry=r,
        )
        self.summarizer_latency = Histogram(
            "compaction_proxy_summarizer_latency_seconds",
            "Duration of one summarizer HTTP call",
            buckets=SUMMARIZER_BUCKETS,
            registry=r,
        )

    def _recall_families(self, r: CollectorRegistry) -> None:
        """The recall tool the proxy answers itself, per compacted API (``api``: one value per
        wire format), and what compaction archived for it (compaction_proxy/observability/recall.py
        says what each outcome means)."""
        self.recall_requests = Counter(
            "compaction_proxy_recall_requests",
            "Requests offered the recall tool, by outcome: answered (hidden rounds answered "
            "recall calls), limit (the rounds or time budget ran out: a closing round went "
            "without tools), deferred (recall called only beside client tools, left to the next "
            "request), unavailable (the archive store failed while answering), unused",
            ["api", "outcome"],
            registry=r,
        )
        self.recall_rounds = Counter(
            "compaction_proxy_recall_rounds",
            "Hidden recall rounds, each one upstream call more than the client's request (a "
            "closing round counts)",
            ["api"],
            registry=r,
        )
        self.recall_calls = Counter(
            "compaction_proxy_recall_calls",
            "Recall tool calls the proxy answered from the archive",
            ["api"],
            registry=r,
        )
        self.recall_tokens = Counter(
            "compaction_proxy_recall_tokens",
            "Tokens of the recall answers sent back to the model",
            ["api"],
            registry=r,
        )
        self.recall_seconds = Histogram(
            "compaction_proxy_recall_seconds",
            "Time one request spent in hidden recall rounds (requests with at least one)",
            ["api"],
            buckets=UPSTREAM_BUCKETS,
            registry=r,
        )
        self.archived_messages = Counter(
            "compaction_proxy_archived_messages",
            "Original messages a request's compaction archived for recall (removed or "
            "rewritten in what it forwarded); one a later request archives again counts again",
            ["api"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """The Prometheus text format of everything in the registry."""
        return generate_latest(self.registry)


class TokenizerFallback:
    """``compaction_proxy_tokenizer_fallback_total`` and ``compaction_proxy_tokenizer_estimated``
    (1 per encoding counted by the estimator, 0 per exact one), read from the provider at
    scrape time: the gauge says which encoding to fix, the counter how many counts it cost."""

    def __init__(self, tokenizers: TokenizerProvider) -> None:
        self._tokenizers = tokenizers

    def describe(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        return [self._family(0), self._estimated()]

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield self._family(self._tokenizers.fallback_uses)
        estimated = self._estimated()
        for encoding, is_estimated in sorted(self._tokenizers.states().items()):
            estimated.add_metric([encoding], 1 if is_estimated else 0)
        yield estimated

    @staticmethod
    def _estimated() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "compaction_proxy_tokenizer_estimated",
            "1 when an encoding in use is counted with the 4-characters-a-token estimator "
            "(no verified file for it), 0 when counts are exact",
            labels=["encoding"],
        )

    @staticmethod
    def _family(value: int) -> CounterMetricFamily:
        return CounterMetricFamily(
            "compaction_proxy_tokenizer_fallback",
            "Token counts made with the 4-characters-a-token estimator because a tiktoken "
            "encoding was unavailable",
            value=value,
        )


class PreparedSummaries:
    """``compaction_proxy_prepared_summaries_total`` by outcome (made, used, wasted: expired
    unused, failed, dropped: cancelled for a newer job) and the jobs in flight, read from the
    :class:`~compaction_proxy.engine._prepare.PreparedStats` at scrape time."""

    OUTCOMES = ("made", "used", "wasted", "failed", "dropped")  # prepare.Outcome

    def __init__(self, stats: PreparedStats) -> None:
        self._stats = stats

    def describe(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        return [self._counter(), self._gauge(0)]

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counter = self._counter()
        for outcome in self.OUTCOMES:
            counter.add_metric([outcome], getattr(self._stats, outcome))
        yield counter
        yield self._gauge(self._stats.in_flight)

    @staticmethod
    def _counter() -> CounterMetricFamily:
        return CounterMetricFamily(
            "compaction_proxy_prepared_summaries",
            "Summaries prepared in the background ahead of their trigger, by outcome: made, "
            "used (a compaction continued from one), wasted (expired unused), failed, dropped "
            "(cancelled for a newer job)",
            labels=["outcome"],
        )

    @staticmethod
    def _gauge(value: int) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "compaction_proxy_prepared_summaries_in_flight",
            "Background summaries being made now in this process",
            value=value,
        )


class WithheldSummaries:
    """``compaction_proxy_summaries_withheld_total`` by reason, read from the flow's counts at
    scrape time (compaction_proxy/http/_admission.py)."""

    REASONS = ("unknown_caller", "preview_unauthenticated")

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._counts = counts

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [self._counter()]

    def collect(self) -> Iterator[CounterMetricFamily]:
        counter = self._counter()
        for reason in self.REASONS:
            counter.add_metric([reason], self._counts.get(reason, 0))
        yield counter

    @staticmethod
    def _counter() -> CounterMetricFamily:
        return CounterMetricFamily(
            "compaction_proxy_summaries_withheld",
            "Requests whose summary was not made because it would have spent an upstream "
            "api_key of the operator's for a caller not let in, by reason: unknown_caller (no "
            "key of server.api_keys, no key an upstream accepted recently), "
            "preview_unauthenticated (a preview without a key of server.api_keys)",
            labels=["reason"],
        )


class DegradedHealth:
    """The degraded paths (compaction_proxy/engine/_degraded.py), read at scrape time: whether
    each is degraded now, the requests that met it, and how often it started."""

    def __init__(self, paths: DegradedPaths) -> None:
        self._paths = paths

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return list(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        degraded, requests, episodes = self._families()
        for path in self._paths:
            degraded.add_metric([path.kind], 1 if path.degraded else 0)
            requests.add_metric([path.kind], path.total)
            episodes.add_metric([path.kind], path.episodes)
        yield from (degraded, requests, episodes)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "compaction_proxy_degraded",
                "1 while a path the proxy works around is failing (path: store_writes, "
                "store_reads, summarizer, recall), 0 once it works again",
                labels=["path"],
            ),
            CounterMetricFamily(
                "compaction_proxy_degraded_requests",
                "Requests (and background summaries) that met a failing path: a checkpoint not "
                "stored or not read, a summary failed or backed off, a recall the archive could "
                "not answer",
                labels=["path"],
            ),
            CounterMetricFamily(
                "compaction_proxy_degraded_episodes",
                "Times a path started failing (each logged once as it starts, once as it recovers)",
                labels=["path"],
            ),
        )


class ContextWindows:
    """``compaction_proxy_context_window_tokens``: learned and discovered windows in use, read
    from the :class:`~compaction_proxy.upstream._windows.WindowBook` at scrape time (bounded by its
    table)."""

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


class StoreHealth:
    """The checkpoint store's breaker, read at scrape time: whether each side of the store
    (``operation``: read, write) is up, how often it was marked down, calls skipped while
    down, and foreign values found (and deleted)."""

    def __init__(self, store: StoreBreaker) -> None:
        self._store = store

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return list(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        store = self._store
        up, opened, skipped, foreign = self._families()
        for operation, side in (("read", store.reads), ("write", store.writes)):
            label = [store.name, operation]
            up.add_metric(label, 1 if side.readiness().up else 0)
            opened.add_metric(label, side.opened)
            skipped.add_metric(label, side.skipped)
        foreign.add_metric([store.name], store.foreign_values)
        yield from (up, opened, skipped, foreign)

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "compaction_proxy_store_up",
                "1 while the checkpoint store answers this operation (read, write), 0 while "
                "its breaker holds it down",
                labels=["backend", "operation"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_breaker_opened",
                "Times reads or writes of the checkpoint store were marked down after a "
                "timeout, connection or disk error",
                labels=["backend", "operation"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_calls_skipped",
                "Store calls skipped at once because that operation was marked down",
                labels=["backend", "operation"],
            ),
            CounterMetricFamily(
                "compaction_proxy_store_foreign_values",
                "Stored values that were not checkpoints of this proxy: read as a miss, deleted",
                labels=["backend"],
            ),
        )
