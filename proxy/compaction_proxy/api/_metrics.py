"""GET /metrics: Prometheus text exposition of this app's own registry
(compaction_proxy/observability/prometheus.py).

It carries counts, latencies and (capped) model names, never a key or message content. Behind
`server.api_keys` it needs a key like every route (compaction_proxy/app.py): one of those, or
one of `server.metrics_keys`, which opens nothing else; Prometheus sends it with
`authorization: {credentials: <key>}` in its scrape config.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from compaction_proxy.observability.prometheus import CONTENT_TYPE

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    telemetry = request.app.state.proxy.telemetry
    body = telemetry.exposition() if telemetry is not None else b""
    return Response(body, media_type=CONTENT_TYPE, headers={"cache-control": "no-store"})
