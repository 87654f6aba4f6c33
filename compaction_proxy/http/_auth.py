"""Inbound proxy keys: one check for the API routes and every side route alike.

`/v1/*` needs one of `server.api_keys` when any is set (compaction_proxy/app.py). The side
routes follow the same keys (:func:`side_access`), with two exceptions so that nothing needs a
secret that should not: the probes (`/healthz`, `/readyz`) answer without a key, with their
status only (orchestrators read the status code; the checks name stores and encodings), and
`/metrics` also takes a key of `server.metrics_keys`, which opens nothing else (a scraper's key
must not be able to spend anything).
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Sequence

PROBES = frozenset({"/healthz", "/readyz"})
METRICS_PATH = "/metrics"


def presented_key(authorization: bytes | None, x_api_key: bytes | None) -> bytes:
    """The key a client presented: `Authorization: Bearer <key>`, else `X-Api-Key`."""
    auth = authorization or b""
    if auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    return x_api_key or b""


def key_matches(presented: bytes, keys: Sequence[bytes]) -> bool:
    """Compared against every key, always, so timing reveals neither which key nor how much
    of one matched; an empty presented key never matches."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched and bool(presented)


class Access(enum.Enum):
    """What a side route shows a request: everything (no keys configured, or a matching key
    came with it), the status only (a probe without a key), or a 401."""

    FULL = "full"
    STATUS_ONLY = "status_only"
    DENIED = "denied"


def side_access(
    path: str, presented: bytes, api_keys: Sequence[bytes], metrics_keys: Sequence[bytes]
) -> Access:
    """The access a request for side route `path` (any path outside `/v1/`, unknown ones
    included) gets with `presented` (:func:`presented_key`; the dashboard page also reads
    `?key=`)."""
    monitoring = path in PROBES or path == METRICS_PATH
    keys = [*api_keys, *metrics_keys] if monitoring else list(api_keys)
    if not keys or key_matches(presented, keys):
        return Access.FULL
    return Access.STATUS_ONLY if path in PROBES else Access.DENIED
