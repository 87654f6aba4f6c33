"""What the recall sides of OpenAI's two APIs share (:mod:`compaction_proxy.wire.chat._recall`,
:mod:`compaction_proxy.wire.responses._recall`): JSON read leniently, from a reply and from
the request's tool lists.

A held SSE body is read as events by :mod:`compaction_proxy.wire.sse`, so what the proxy reads
is what the client would have read: both sides read only whole events (trailing bytes without
their blank line, which no SDK dispatches, are kept as they came and never read), and a reply
they strip is the upstream's very bytes but for the events that change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["integer", "loads", "named_list"]


def integer(value: object) -> int | None:
    """``value`` when it is a JSON integer (an index, a sequence number), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def loads(raw: bytes) -> Any:
    """``raw`` parsed, or None when it is not JSON (a reply the loop cannot read is relayed
    as it came)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def named_list(body: Mapping[str, Any], key: str) -> list[Any]:
    """``body[key]`` when it is a list, else ``[]`` (a malformed member is the upstream's to
    refuse, never the proxy's to trip on)."""
    value = body.get(key)
    return value if isinstance(value, list) else []
