"""The HTTP plumbing under every route: raw ASGI, errors in OpenAI's shape, keys, shutdown.

What the routes and the app use is named here:

* ``_asgi``: the plain-ASGI helpers of the hot path (read a bounded body, send bytes);
* ``_errors``: :class:`ProxyError` and :func:`error_body`, the one place OpenAI's error body
  (``{"error": {"message", "type", "param", "code"}}``) is built;
* ``_paths``: the request path made safe before it is routed or forwarded;
* ``_auth``: the inbound key check of every path;
* ``_admission``: who may make the proxy spend an operator's upstream key;
* ``_drain``: the requests still running at shutdown, answered instead of cut;
* ``_logs``: the process's logs as JSON lines, the access line of every request, and the
  ``COMPACTION_DEBUG`` switch of the per-request decision log.

Two modules are named from outside by module, by the CLI that starts uvicorn, and this face
does not import them, so importing the app does not load uvicorn: :mod:`.protocol` (uvicorn
loads ``compaction_proxy.http.protocol:BoundedHttpToolsProtocol`` in every worker) and
:mod:`.client_limits` (the slow-client and connection limits it reads from the environment).
"""

from ._admission import (
    ALLOWED,
    KNOWN_TTL_SECONDS,
    PREVIEW_UNAUTHENTICATED,
    UNKNOWN_CALLER,
    KnownCallers,
    Spending,
)
from ._asgi import (
    ClientGone,
    Message,
    Receive,
    Scope,
    Send,
    content_length,
    header,
    read_body,
    send_bytes,
    send_error,
    too_large,
)
from ._auth import (
    CREDENTIAL_HEADERS,
    Access,
    Presented,
    first_match,
    key_matches,
    presented_keys,
    side_access,
)
from ._drain import (
    DEFAULT_GRACE_SECONDS,
    ArrivedAfterCut,
    Drain,
    InFlight,
    in_flight,
    retry_after_header,
    shutdown_error,
)
from ._errors import ProxyError, bad_request, error_body
from ._logs import (
    ACCESS,
    DECISIONS,
    JsonFormatter,
    access_line,
    configure_logging,
    debug_enabled,
    logging_config,
)
from ._paths import API_PREFIX, SafePath, UnsafePath, needs_normalizing, normalize

__all__ = [
    "ACCESS",
    "ALLOWED",
    "API_PREFIX",
    "CREDENTIAL_HEADERS",
    "DECISIONS",
    "DEFAULT_GRACE_SECONDS",
    "KNOWN_TTL_SECONDS",
    "PREVIEW_UNAUTHENTICATED",
    "UNKNOWN_CALLER",
    "Access",
    "ArrivedAfterCut",
    "ClientGone",
    "Drain",
    "InFlight",
    "JsonFormatter",
    "KnownCallers",
    "Message",
    "Presented",
    "ProxyError",
    "Receive",
    "SafePath",
    "Scope",
    "Send",
    "Spending",
    "UnsafePath",
    "access_line",
    "bad_request",
    "configure_logging",
    "content_length",
    "debug_enabled",
    "error_body",
    "first_match",
    "header",
    "in_flight",
    "key_matches",
    "logging_config",
    "needs_normalizing",
    "normalize",
    "presented_keys",
    "read_body",
    "retry_after_header",
    "send_bytes",
    "send_error",
    "shutdown_error",
    "side_access",
    "too_large",
]
