"""Per-process state and per-request context, passed explicitly instead of globals."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compaction_proxy.http import DEFAULT_GRACE_SECONDS, Drain, KnownCallers, Receive, Scope, Send

if TYPE_CHECKING:
    from compaction_proxy.checkpoints import Archive, CheckpointStore
    from compaction_proxy.config import Settings
    from compaction_proxy.engine import CompactionFlow, Compactor, RecallDesk
    from compaction_proxy.observability.telemetry import Telemetry
    from compaction_proxy.summarizer import SummaryCalls
    from compaction_proxy.upstream import Router, UpstreamTransport, WindowBook

    from ._recall_stats import RecallStats


@dataclass(slots=True)
class AppState:
    """What every request shares; a plain holder of what `compaction_proxy.app.build_edge` built."""

    settings: Settings
    router: Router
    compactor: Compactor
    store: CheckpointStore
    # Every call to an upstream: forwarding and the proxy's own calls (the summarizer,
    # published windows) (compaction_proxy/upstream/_transport.py).
    transport: UpstreamTransport
    # Learned and discovered context windows (compaction_proxy/upstream/_windows.py).
    windows: WindowBook
    # Checkpoint, pipeline, checkpoint again: one request's compaction
    # (compaction_proxy/engine/_flow.py).
    flow: CompactionFlow
    # Prometheus metrics and the dashboard's data; one per app.
    telemetry: Telemetry
    # What compaction removed, kept in the same store under recall ids, and the answers to the
    # model's recall calls (compaction_proxy/checkpoints/_archive.py,
    # compaction_proxy/engine/_recall_desk.py); None when no compaction block enables recall.
    archive: Archive | None = None
    recall_desk: RecallDesk | None = None
    shutting_down: bool = False
    # The keys of `server.api_keys`, which no header sent upstream may carry
    # (compaction_proxy/upstream/_headers.py).
    proxy_keys: tuple[str, ...] = ()
    # Callers whose own key an upstream accepted recently (compaction_proxy/http/_admission.py).
    known_callers: KnownCallers = field(default_factory=KnownCallers)
    # The requests in flight, answered properly when a shutdown cuts them
    # (compaction_proxy/http/_drain.py).
    drain: Drain = field(default_factory=lambda: Drain(DEFAULT_GRACE_SECONDS))

    @property
    def ready(self) -> bool:
        return not (self.shutting_down or self.drain.begun or self.transport.closed)


@dataclass(slots=True)
class RequestContext:
    """What one request carries from the edge to the access log besides its route's frozen
    outcome (compaction_proxy/api/_outcome.py): id, timings, bytes in, and the facts that must
    outlive a route that ends in an error (the model and upstream it was routed by, the
    compaction's time and summarizer calls so far, the edge's own status for an error)."""

    state: AppState
    request_id: str
    # The request's ASGI exchange: every route, and the relay, read and answer through it.
    scope: Scope
    receive: Receive
    send: Send
    started: float = field(default_factory=time.perf_counter)
    authenticated: bool = False
    # The credential header's value that held a key of `server.api_keys` (app.py); it names the
    # caller's checkpoints and archive in place of whatever other key the request carries.
    credential: str | None = None
    model: str | None = None
    upstream: str | None = None
    status: int = 0
    bytes_in: int = 0
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # For metrics and the dashboard, through ``Finished`` (compaction_proxy/api/_outcome.py):
    compaction_seconds: float | None = None
    # This request's summarizer HTTP calls; the chat route creates it and hands it to the flow.
    summarizer_calls: SummaryCalls | None = None
    content: str | None = None  # last user message, only when dashboard.show_content
    cut_by_shutdown: bool = False  # answered 503 / ended with an error event (drain.py)
    recall: RecallStats | None = None  # the recall loop's figures (api/_recall.py)
    archived: int = 0  # originals the compaction archived (docs/recall.md)

    @property
    def transport(self) -> UpstreamTransport:
        """The transport its upstream calls go through (what ``post_upstream`` needs)."""
        return self.state.transport

    @property
    def proxy_keys(self) -> tuple[str, ...]:
        """The proxy's own keys, never sent upstream (what ``post_upstream`` needs)."""
        return self.state.proxy_keys

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0
