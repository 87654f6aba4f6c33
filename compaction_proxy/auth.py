"""Inbound proxy keys: one check for the API routes and the dashboard alike."""

from __future__ import annotations

import hmac
from collections.abc import Sequence


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
