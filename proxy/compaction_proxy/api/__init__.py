"""The routes: what each path answers, on the edge built by compaction_proxy/app.py.

The hot path is plain ASGI (docs/architecture.md, "The request path"); the side pages are
FastAPI routers the app includes:

* ``_compacted``: the compacted routes, one per wire format (compaction_proxy/wire/registry.py),
  on one path, ``_attempts`` (compact, forward, hold a refusal and compact again after an
  overflow);
* ``_count_tokens``: a format's token-counting route, answered for the compacted request;
* ``_preview``: the same compaction, nothing forwarded or stored;
* ``_archive``: ``GET /v1/compaction/archive/{id}``, an archived original, for people;
* ``_passthrough``: every other ``/v1/*`` path, relayed as sent and routed by its model;
* ``_forward``: the relay of an upstream's reply (``_stream_events``: a stream cut only at
  event boundaries; ``_usage``: the prompt tokens the reply reports);
* ``_requests``: what the routes share (the upstream, the headers, the window, who is asking,
  the report headers); ``_limits``: the body limits a route reads with;
* ``_context``: :class:`AppState`, what every request shares, and :class:`RequestContext`,
  one request's, which feeds the access log;
* ``_outcome``: :class:`RouteOutcome`, what a route returns (frozen), and :class:`Finished`,
  the one value a finished request is recorded from;
* ``_health``, ``_metrics``, ``_dashboard``: ``/healthz`` and ``/readyz``, ``/metrics``,
  ``/dashboard`` (its page is ``static/dashboard.html``).
"""

from ._archive import ARCHIVE_PATH, archive_entry
from ._compacted import compacted
from ._context import AppState, RequestContext
from ._count_tokens import count_tokens
from ._dashboard import router as dashboard_router
from ._dashboard import send_unauthorized_page
from ._health import router as health_router
from ._metrics import router as metrics_router
from ._outcome import Finished, RouteOutcome, finished
from ._passthrough import passthrough
from ._preview import preview
from ._requests import caller_key, credential

__all__ = [
    "ARCHIVE_PATH",
    "AppState",
    "Finished",
    "RequestContext",
    "RouteOutcome",
    "archive_entry",
    "caller_key",
    "compacted",
    "count_tokens",
    "credential",
    "dashboard_router",
    "finished",
    "health_router",
    "metrics_router",
    "passthrough",
    "preview",
    "send_unauthorized_page",
]
