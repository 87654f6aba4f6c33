"""Degraded paths: a dependency the proxy works around (the store refusing writes, the
summarizer failing or backed off, the recall archive unreadable), made visible once.

A request that meets a degraded path still succeeds, so the failure is easy to miss: a
response header says it (each path's own code writes that), but a log that says it per request
is noise, and one that says it only the first time hides how long it lasted. So each path is
one small state machine per process (:class:`DegradedPath`):

* the first failure while it is healthy logs ONE warning: what failed and why;
* every request (or background job) that meets it while degraded is counted, not logged;
* the first success after that logs ONE warning: recovered, how many requests it affected and
  for how long;
* the metrics read its state at scrape time (``compaction_proxy_degraded``,
  ``compaction_proxy_degraded_requests_total``, ``compaction_proxy_degraded_episodes_total``,
  docs/observability.md).

:class:`DegradedPaths` holds the edge's paths, one per kind, built once with the flow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from compaction_proxy.compaction import CompactionReport

log = logging.getLogger("compaction_proxy.degraded")

STORE_WRITES = "store_writes"
STORE_READS = "store_reads"
SUMMARIZER = "summarizer"
RECALL = "recall"


@dataclass(slots=True)
class DegradedPath:
    """One path's state: healthy, or degraded since a failure (see the module docstring).

    ``what`` names the path in the log lines; ``reason`` is the failure that started the
    current episode (never a key, a path or content: the callers pass what a header may say).
    """

    kind: str
    what: str
    clock: Callable[[], float] = time.monotonic
    degraded: bool = False
    since: float = 0.0
    reason: str = ""
    affected: int = 0
    """Requests (or background jobs) that met the path in the current episode."""
    total: int = 0
    """Requests (or background jobs) that met the path, over the process's life."""
    episodes: int = 0
    """Times the path became degraded."""

    def failed(self, reason: str, *, starts: bool = True) -> None:
        """A request met this path failing. ``starts``: False for a failure that only echoes
        one already reported (the summarizer backed off after a failure): counted while
        degraded, but it does not start an episode of its own."""
        self.total += 1
        if self.degraded:
            self.affected += 1
            return
        if not starts:
            return
        self.degraded = True
        self.since = self.clock()
        self.reason = reason
        self.affected = 1
        self.episodes += 1
        log.warning(
            "degraded: %s: %s; requests are served without it and counted until it recovers",
            self.what,
            reason,
        )

    def recovered(self) -> None:
        """A request found this path working again."""
        if not self.degraded:
            return
        self.degraded = False
        log.warning(
            "recovered: %s works again after %d affected request(s) over %.0f s "
            "(degraded since: %s)",
            self.what,
            self.affected,
            max(0.0, self.clock() - self.since),
            self.reason,
        )


@dataclass(slots=True)
class DegradedPaths:
    """The edge's degraded paths, one per kind (one edge per process)."""

    clock: Callable[[], float] = time.monotonic
    store_writes: DegradedPath = field(init=False)
    store_reads: DegradedPath = field(init=False)
    summarizer: DegradedPath = field(init=False)
    recall: DegradedPath = field(init=False)

    def __post_init__(self) -> None:
        self.store_writes = DegradedPath(STORE_WRITES, "checkpoint store writes", self.clock)
        self.store_reads = DegradedPath(STORE_READS, "checkpoint store reads", self.clock)
        self.summarizer = DegradedPath(SUMMARIZER, "summarizer", self.clock)
        self.recall = DegradedPath(RECALL, "recall archive", self.clock)

    def __iter__(self) -> Iterator[DegradedPath]:
        return iter((self.store_writes, self.store_reads, self.summarizer, self.recall))

    def note_lookup(self, store_error: str | None, asked: bool) -> None:
        """A checkpoint lookup: the store's reads failed (``store_error``), or answered
        (``asked``: a request that cannot have a checkpoint never asks)."""
        if store_error:
            self.store_reads.failed(store_error)
        elif asked:
            self.store_reads.recovered()

    def note_summaries(self, report: CompactionReport) -> None:
        """A run's summaries: one that failed, or was not asked for because the summarizer
        backed off after a failure (which starts no episode of its own), or one that was made.
        A summary the pipeline refused as not shorter is neither: the summarizer answered."""
        failures = [f for f in report.failures if f.reason != "not_shorter"]
        if failures:
            failure = failures[0]
            self.summarizer.failed(
                f"{failure.strategy} failed ({failure.reason}): {failure.message}",
                starts=failure.reason != "backoff",
            )
        elif any(
            step.name == "summarization" and step.changed and not step.failed
            for step in report.walk()
        ):
            self.summarizer.recovered()
