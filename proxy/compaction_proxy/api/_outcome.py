"""What a route hands back once its answer went out: one frozen value per request.

The routes (compaction_proxy/api/_compacted.py, _passthrough.py, _preview.py) return it; the one
place that records a request (``compaction_proxy.app``: the access log, the metrics, the
dashboard, the triggers' calibration) reads it. Nothing edits it on the way, so what was
recorded is what the route decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compaction_proxy.upstream import Outcome

from ._recall_stats import RecallStats

if TYPE_CHECKING:
    from compaction_proxy.compaction import CompactionReport
    from compaction_proxy.summarizer import SummaryCalls

    from ._context import RequestContext


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """One request's answer: the forwarding's own outcome (None: the proxy answered itself,
    as the preview does), and the compaction reported with it."""

    sent: Outcome | None
    status: int  # as the access log shows it: 499 when the client left first
    report: CompactionReport | None = None
    checkpoint: str | None = None
    retries: int = 0  # compacted retries after overflow refusals (X-Compaction-Retry)
    overflow: str | None = None  # fixed | refused_again | passed_through

    @property
    def bytes_out(self) -> int:
        return 0 if self.sent is None else self.sent.bytes_out


def relayed(
    sent: Outcome,
    report: CompactionReport | None = None,
    checkpoint: str | None = None,
    retries: int = 0,
    overflow: str | None = None,
) -> RouteOutcome:
    """The outcome of a forwarded request."""
    status = 499 if sent.client_gone else sent.status
    return RouteOutcome(sent, status, report, checkpoint, retries, overflow)


@dataclass(frozen=True, slots=True)
class Finished:
    """A request as it is recorded once it is over: what the context measured at the edge
    (id, timings, bytes in, the routing facts) beside what the route's outcome says. The
    access log, :meth:`~compaction_proxy.observability.telemetry.Telemetry.record_request` and
    the calibration all read this one value (its fields are telemetry's ``FinishedRequest``)."""

    request_id: str
    elapsed_ms: float
    status: int
    model: str | None = None
    upstream: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    upstream_request_id: str | None = None
    upstream_seconds: float | None = None
    upstream_prompt_tokens: int | None = None
    cut_by_shutdown: bool = False
    report: CompactionReport | None = None
    checkpoint: str | None = None
    compaction_seconds: float | None = None
    summarizer_calls: SummaryCalls | None = None
    content: str | None = None
    overflow_outcome: str | None = None
    compaction_retries: int = 0
    recall: RecallStats | None = None  # None: the recall tool was not offered
    archived: int = 0  # originals this request's compaction archived


def finished(ctx: RequestContext, outcome: RouteOutcome | None) -> Finished:
    """``ctx`` and the route's ``outcome`` (None: the request ended before a route answered,
    the status and cut then being the edge's own, on the context)."""
    sent = None if outcome is None else outcome.sent
    return Finished(
        request_id=ctx.request_id,
        elapsed_ms=ctx.elapsed_ms,
        status=ctx.status if outcome is None else outcome.status,
        model=ctx.model,
        upstream=ctx.upstream,
        bytes_in=ctx.bytes_in,
        bytes_out=0 if sent is None else sent.bytes_out,
        upstream_request_id=None if sent is None else sent.upstream_request_id,
        upstream_seconds=None if sent is None else sent.upstream_seconds,
        upstream_prompt_tokens=None if sent is None else sent.prompt_tokens,
        cut_by_shutdown=ctx.cut_by_shutdown if sent is None else sent.cut_by_shutdown,
        report=None if outcome is None else outcome.report,
        checkpoint=None if outcome is None else outcome.checkpoint,
        compaction_seconds=ctx.compaction_seconds,
        summarizer_calls=ctx.summarizer_calls,
        content=ctx.content,
        overflow_outcome=None if outcome is None else outcome.overflow,
        compaction_retries=0 if outcome is None else outcome.retries,
        recall=ctx.recall,
        archived=ctx.archived,
    )
