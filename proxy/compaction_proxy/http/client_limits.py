"""What a slow, idle or greedy client may hold of the server, and the log line when it bites.

The HTTP protocol (compaction_proxy/http/protocol.py) enforces these; they are nginx's model:

- ``server.client_header_timeout`` (60 s, nginx's ``client_header_timeout``): a request's
  headers must be complete this long after the connection opened or, on a kept-alive
  connection, after the request's first byte. A connection that never sends a byte is closed
  silently; one with partial headers gets a 408.
- ``server.client_body_timeout`` (60 s, ``client_body_timeout``): the longest gap between two
  reads of a request body (never while the proxy itself has stopped reading because the app
  is not keeping up). Past it the client gets a 408 and the request is dropped before
  anything of it went upstream on the compacting routes.
- ``server.client_keepalive_timeout`` (75 s, ``keepalive_timeout``): how long a connection
  may sit idle between requests.
- ``server.max_client_connections``: open client connections. At the limit a new connection
  closes the least recently active connection that has no request being answered (idle,
  still sending headers, or sending a body); when every connection is busy, the new one gets
  a 503. The default leaves file descriptors for the upstream connections and the store:
  half of what remains of the process's open-file limit (``RLIMIT_NOFILE``) after 64 kept
  for the process itself, so the process never runs out of descriptors with every client
  connection waiting on an upstream one.

uvicorn builds the protocol itself, in every worker process, so the values travel in the
environment variables that are also their config overrides (``serve`` sets them).
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import time
from dataclasses import dataclass

log = logging.getLogger("compaction_proxy.http")

ENV = {
    "header_timeout": "COMPACTION_PROXY_SERVER__CLIENT_HEADER_TIMEOUT",
    "body_timeout": "COMPACTION_PROXY_SERVER__CLIENT_BODY_TIMEOUT",
    "max_connections": "COMPACTION_PROXY_SERVER__MAX_CLIENT_CONNECTIONS",
}
DEFAULT_HEADER_TIMEOUT = 60.0
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_KEEPALIVE_TIMEOUT = 75.0
RESERVED_FDS = 64
MAX_DERIVED_CONNECTIONS = 65_536
LOG_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class ClientLimits:
    header_timeout: float
    body_timeout: float
    max_connections: int


def derived_max_connections(nofile: int | None = None) -> int:
    """The default ``server.max_client_connections`` for an open-file limit of ``nofile``
    (the process's soft ``RLIMIT_NOFILE`` when None); see the module docstring."""
    if nofile is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile = MAX_DERIVED_CONNECTIONS * 2 if soft == resource.RLIM_INFINITY else soft
    return max(8, min(MAX_DERIVED_CONNECTIONS, (nofile - RESERVED_FDS) // 2))


def _number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(ENV[name], ""))
    except ValueError:
        return default
    return value if value > 0 else default


@functools.cache
def client_limits() -> ClientLimits:
    """This process's limits (read once: the environment ``serve`` set before starting)."""
    configured = int(_number("max_connections", 0))
    return ClientLimits(
        header_timeout=_number("header_timeout", DEFAULT_HEADER_TIMEOUT),
        body_timeout=_number("body_timeout", DEFAULT_BODY_TIMEOUT),
        max_connections=configured if configured > 0 else derived_max_connections(),
    )


class RateLimitedLog:
    """One warning per kind of event per :data:`LOG_INTERVAL`, with how many were not logged.

    A slowloris attack closes thousands of connections a minute; the log must say so without
    becoming the attack's amplifier.
    """

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def note(self, kind: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        self._last[kind] = now
        unlogged = self._unlogged.pop(kind, 0)
        more = f" ({unlogged} more since the last such line)" if unlogged else ""
        log.warning("%s%s", message, more, extra={"limit": kind})


bites = RateLimitedLog()
