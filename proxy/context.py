"""Per-process state and per-request context, passed explicitly instead of globals."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.transport import HttpxUpstream

if TYPE_CHECKING:
    import httpx

    from proxy.compaction import CompactionReport
    from proxy.compactor import Compactor
    from proxy.config import Settings
    from proxy.flow import CompactionFlow
    from proxy.observability.telemetry import Telemetry
    from proxy.summaries.stores.base import CheckpointStore
    from proxy.summaries.summarizer import SummaryCalls
    from proxy.transport import UpstreamTransport
    from proxy.upstream import Router
    from proxy.windows import WindowBook


@dataclass(slots=True)
class AppState:
    """What every request shares: settings, the router and the one upstream client."""

    settings: Settings
    router: Router
    compactor: Compactor
    store: CheckpointStore | None = None
    # httpx client for the proxy's own calls (the summarizer); cookie-less, no default headers.
    client: httpx.AsyncClient | None = None
    # What forwarding uses; built in the lifespan (tests may hand in `client` alone).
    transport: UpstreamTransport | None = None
    shutting_down: bool = False
    # Prometheus metrics and the dashboard's data; ProxyApp makes one per app.
    telemetry: Telemetry | None = None
    # Learned and discovered context windows (proxy/windows.py); None: the catalog's only.
    windows: WindowBook | None = None
    _flow: CompactionFlow | None = None

    @property
    def flow(self) -> CompactionFlow:
        """Built on first use: the summarizer needs the httpx client of the lifespan."""
        if self._flow is None:
            from proxy.flow import build_flow

            if self.client is None:
                raise RuntimeError("the upstream client is not started (lifespan not run)")
            self._flow = build_flow(
                self.settings, self.compactor, self.store, self.client, self.windows
            )
            if self.telemetry is not None and self._flow.summarizer is not None:
                self.telemetry.watch_summarizer(self._flow.summarizer.stats)
        return self._flow

    @property
    def upstream(self) -> UpstreamTransport:
        if self.transport is None:
            if self.client is None:
                raise RuntimeError("the upstream client is not started (lifespan not run)")
            self.transport = HttpxUpstream(self.client)
        return self.transport

    @property
    def ready(self) -> bool:
        if self.shutting_down or self.client is None or self.client.is_closed:
            return False
        return self.transport is None or not self.transport.closed


@dataclass(slots=True)
class RequestContext:
    """What one request carries from the edge to the access log."""

    state: AppState
    request_id: str
    started: float = field(default_factory=time.perf_counter)
    authenticated: bool = False
    model: str | None = None
    upstream: str | None = None
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    client_gone: bool = False
    upstream_request_id: str | None = None
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    report: CompactionReport | None = None
    checkpoint: str | None = None
    # For metrics and the dashboard (proxy/observability/, which reads these fields through
    # its FinishedRequest protocol rather than importing this class):
    compaction_seconds: float | None = None
    # This request's summarizer HTTP calls; the chat route creates it and hands it to the flow.
    summarizer_calls: SummaryCalls | None = None
    upstream_seconds: float | None = None  # to the upstream's response headers
    upstream_prompt_tokens: int | None = None  # usage.prompt_tokens of the upstream's reply
    content: str | None = None  # last user message, only when dashboard.show_content
    compaction_retries: int = 0  # compacted retries after overflow refusals (X-Compaction-Retry)
    overflow_outcome: str | None = None  # fixed | refused_again | passed_through

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0
