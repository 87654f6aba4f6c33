"""Finished requests with known recall figures, for the metrics, the dashboard and its page.

The values here satisfy telemetry's ``FinishedRequest`` and ``RecallFigures`` protocols the way
the request path's ``Finished`` and ``RecallStats`` do (compaction_proxy/api/_outcome.py), so
telemetry is fed exactly what it reads, and every figure the tests expect is written out below.
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction_proxy.compaction import CompactionReport
from compaction_proxy.observability.recall import RecallFigures
from compaction_proxy.observability.telemetry import Telemetry
from compaction_proxy.summarizer import SummaryCalls

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


@dataclass(frozen=True)
class Figures:
    """One request's recall loop (what ``RecallStats`` holds)."""

    rounds: int = 0
    calls: int = 0
    ids: int = 0
    tokens: int = 0
    deferred: int = 0
    unavailable: bool = False
    limited: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Request:
    """One finished request (what ``Finished`` holds), the route's path beside it."""

    path: str = CHAT
    request_id: str = "req"
    model: str | None = "gpt-4o"
    upstream: str | None = "openai"
    status: int = 200
    elapsed_ms: float = 12.0
    report: CompactionReport | None = None
    checkpoint: str | None = None
    compaction_seconds: float | None = 0.002
    summarizer_calls: SummaryCalls | None = None
    upstream_seconds: float | None = 0.05
    upstream_prompt_tokens: int | None = None
    content: str | None = None
    overflow_outcome: str | None = None
    recall: RecallFigures | None = None
    archived: int = 0


SESSION = (
    Request(request_id="plain"),  # a chat without tools: not offered, nothing archived
    Request(request_id="archived-only", archived=4),  # compacted, not offered the tool
    Request(request_id="unused", recall=Figures(), archived=3),
    Request(
        request_id="answered",
        recall=Figures(rounds=2, calls=3, ids=5, tokens=1_200, seconds=0.8),
    ),
    Request(
        request_id="answered-then-deferred",
        recall=Figures(rounds=1, calls=1, ids=1, tokens=300, deferred=2, seconds=0.2),
    ),
    Request(request_id="deferred", recall=Figures(deferred=1)),
    Request(
        request_id="limit",
        recall=Figures(rounds=4, calls=3, ids=6, tokens=4_000, limited=True, seconds=2.5),
    ),
    Request(
        request_id="unavailable",
        recall=Figures(rounds=1, calls=1, unavailable=True, seconds=0.05),
    ),
    Request(
        path=RESPONSES,
        request_id="responses",
        recall=Figures(rounds=1, calls=2, ids=2, tokens=700, seconds=0.4),
        archived=2,
    ),
    # A route that is no compacted API never counts recall figures, whatever it carries.
    Request(path="/v1/models", request_id="models", recall=Figures(rounds=9, calls=9)),
)
"""Requests offered the tool: 7 (6 chat, 1 responses); recalled (a hidden round): 5."""


def feed(telemetry: Telemetry, requests: tuple[Request, ...] = SESSION) -> None:
    """Records each request as ``ProxyApp.__call__`` does once it is over."""
    for request in requests:
        method = "GET" if request.path == "/v1/models" else "POST"
        telemetry.record_request(request, method, request.path)
