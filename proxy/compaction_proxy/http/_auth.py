"""Inbound proxy keys: one check for the API routes and every side route alike.

`/v1/*` needs one of `server.api_keys` when any is set (compaction_proxy/app.py), in any of the
headers a client sends a key in (:data:`CREDENTIAL_HEADERS`): Anthropic's clients send
`x-api-key` and often an `Authorization` of their own beside it, OpenAI's send `Authorization`,
so one credential holding a proxy key lets a request in, whatever the other holds. The side
routes follow the same keys (:func:`side_access`), with two exceptions so that nothing needs a
secret that should not: the probes (`/healthz`, `/readyz`) answer without a key, with their
status only (orchestrators read the status code; the checks name stores and encodings), and
`/metrics` also takes a key of `server.metrics_keys`, which opens nothing else (a scraper's key
must not be able to spend anything).
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PROBES = frozenset({"/healthz", "/readyz"})
METRICS_PATH = "/metrics"


CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")
"""The headers a client presents a proxy key in, in the order a match is looked for."""
_BEARER = b"bearer "


@dataclass(frozen=True, slots=True)
class Presented:
    """One key a request presents: the header's value as sent (``Bearer pk-...`` or
    ``pk-...``) and the bare key in it."""

    value: bytes
    key: bytes


def presented_keys(headers: Iterable[tuple[bytes, bytes]]) -> list[Presented]:
    """Every key a request presents, Authorization headers first: each ``Authorization:
    Bearer <key>`` (another scheme presents nothing) and each ``X-Api-Key``. One rule for
    every route: a request is let in when any of them holds a proxy key (:func:`first_match`),
    whatever the others hold, in whatever order the headers came."""
    found: dict[bytes, list[Presented]] = {name: [] for name in CREDENTIAL_HEADERS}
    for raw_name, raw_value in headers:
        name = bytes(raw_name).lower()
        if name not in found:
            continue
        value = bytes(raw_value)
        if name == b"authorization":
            if value[: len(_BEARER)].lower() != _BEARER:
                continue
            key = value[len(_BEARER) :].strip()
        else:
            key = value.strip()
        if key:
            found[name].append(Presented(value, key))
    return [item for name in CREDENTIAL_HEADERS for item in found[name]]


def key_matches(presented: bytes, keys: Sequence[bytes]) -> bool:
    """Compared against every key, always, so timing reveals neither which key nor how much
    of one matched; an empty presented key never matches."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched and bool(presented)


def first_match(presented: Sequence[Presented], keys: Sequence[bytes]) -> Presented | None:
    """The first presented key that is one of ``keys`` (each compared with every key), or
    None."""
    found: Presented | None = None
    for item in presented:
        if key_matches(item.key, keys) and found is None:
            found = item
    return found


class Access(enum.Enum):
    """What a side route shows a request: everything (no keys configured, or a matching key
    came with it), the status only (a probe without a key), or a 401."""

    FULL = "full"
    STATUS_ONLY = "status_only"
    DENIED = "denied"


def side_access(
    path: str,
    presented: Sequence[Presented],
    api_keys: Sequence[bytes],
    metrics_keys: Sequence[bytes],
) -> Access:
    """The access a request for side route `path` (any path outside `/v1/`, unknown ones
    included) gets with the keys it `presented` (:func:`presented_keys`; the dashboard page
    also reads `?key=`)."""
    monitoring = path in PROBES or path == METRICS_PATH
    keys = [*api_keys, *metrics_keys] if monitoring else list(api_keys)
    if not keys or first_match(presented, keys) is not None:
        return Access.FULL
    return Access.STATUS_ONLY if path in PROBES else Access.DENIED
