"""The upstream side: where a request goes, how it gets there, and what the upstream says back
about its windows.

* ``_routing``: :class:`Router`, the upstream serving a model, and the ``model`` read from a
  body the proxy does not parse (:func:`json_model`);
* ``_headers``: the upstream URL for a path, the headers that go up and come back;
* ``_transport``: the HTTP client behind one small interface (aiohttp by default, httpx),
  every upstream timeout named when it runs out; plumbing, reading only the configuration;
* ``_relay``: one request sent and its reply relayed as it arrives (``forward``; a reply read
  whole instead, ``send_held``), failures turned into 502/504; ``_posting``: a compacted
  route's POST, its headers as the wire format says (``post_upstream``); ``_stream_events``:
  a stream relayed whole event by whole event; ``_usage``: the reply's ``usage`` read on the
  way through, for calibration;
* ``_calls``: the proxy's own calls (a summary, a model listing) over that same transport,
  the reply read whole and decoded (``_codings``);
* ``_failures``: a failure to reach an upstream as the client reads it (502, 504);
* ``_overflow``: an upstream's refusal of a prompt too long for its window, recognised;
* ``_windows``: :class:`WindowBook`, each model's window (configured, learned from a refusal,
  or published, as ``_published_windows`` reads an upstream's ``GET /models``).
"""

from ._calls import CallReply, ReplyUnreadable, call_upstream
from ._failures import UpstreamFailure, classify_error
from ._headers import HOP_BY_HOP, response_headers, upstream_headers, upstream_url, with_listed
from ._overflow import MAX_ERROR_BODY, Overflow, detect_overflow
from ._posting import REFUSAL_STATUSES, Caller, post_upstream
from ._published_windows import parse_models_listing
from ._relay import RELAYED, HeldReply, Outcome, ReplyHandling, StreamedBody, forward, send_held
from ._routing import CATCH_ALL, ModelRead, Router, json_model, model_not_found
from ._transport import (
    TRANSPORT_ERRORS,
    AiohttpUpstream,
    Body,
    HttpxUpstream,
    UpstreamReply,
    UpstreamRequest,
    UpstreamTimeout,
    UpstreamTransport,
    make_transport,
    plain_httpx_client,
)
from ._usage import UsageFormat, UsageProbe
from ._windows import MIN_LEARNED_WINDOW, SHRINK, Window, WindowBook, window_after_refusal

__all__ = [
    "CATCH_ALL",
    "HOP_BY_HOP",
    "MAX_ERROR_BODY",
    "MIN_LEARNED_WINDOW",
    "REFUSAL_STATUSES",
    "RELAYED",
    "SHRINK",
    "TRANSPORT_ERRORS",
    "AiohttpUpstream",
    "Body",
    "CallReply",
    "Caller",
    "HeldReply",
    "HttpxUpstream",
    "ModelRead",
    "Outcome",
    "Overflow",
    "ReplyHandling",
    "ReplyUnreadable",
    "Router",
    "StreamedBody",
    "UpstreamFailure",
    "UpstreamReply",
    "UpstreamRequest",
    "UpstreamTimeout",
    "UpstreamTransport",
    "UsageFormat",
    "UsageProbe",
    "Window",
    "WindowBook",
    "call_upstream",
    "classify_error",
    "detect_overflow",
    "forward",
    "json_model",
    "make_transport",
    "model_not_found",
    "parse_models_listing",
    "plain_httpx_client",
    "post_upstream",
    "response_headers",
    "send_held",
    "upstream_headers",
    "upstream_url",
    "window_after_refusal",
    "with_listed",
]
