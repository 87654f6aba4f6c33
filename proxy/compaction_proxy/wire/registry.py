"""The wire formats the proxy compacts, listed once.

Dispatch (``app.py``), the metric labels (``observability/labels.py``), the preview, the CLI's
``compact`` and the summarizer all read this list; adding a format is one entry here (or one
:func:`register` call at start-up) and the format's own folder (compaction_proxy/wire/README.md,
"Adding a
wire format").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .chat import CHAT
from .format import WireFormat
from .messages import MESSAGES
from .responses import RESPONSES
from .sse import Event

__all__ = [
    "DEFAULT",
    "FORMATS",
    "api_names",
    "ends_stream",
    "for_api",
    "for_body",
    "for_count_path",
    "for_path",
    "owner_of",
    "register",
    "under",
    "unregister",
]

FORMATS: list[WireFormat] = [CHAT, RESPONSES, MESSAGES]
"""Every format, in the order the dashboard and docs list them."""

DEFAULT: WireFormat = CHAT
"""What a body no format claims is read as (the preview's and ``compact``'s default, and the
summarizer's call form)."""


def register(wire: WireFormat) -> None:
    """Add ``wire`` (its name and paths must be new)."""
    taken = {p for f in FORMATS for p in _served(f)}
    if any(f.name == wire.name for f in FORMATS) or taken.intersection(_served(wire)):
        raise ValueError(f"wire format {wire.name!r}: its name or a path is already served")
    FORMATS.append(wire)


def unregister(wire: WireFormat) -> None:
    """Remove ``wire`` (a test's throwaway format)."""
    FORMATS.remove(wire)


def for_path(method: str | None, path: str) -> WireFormat | None:
    """The format that serves ``method path``; None: not a compacted route."""
    if method != "POST":
        return None
    return next((f for f in FORMATS if path in f.paths), None)


def for_count_path(method: str | None, path: str) -> WireFormat | None:
    """The format whose token-counting route is ``method path``; None: not one."""
    if method != "POST":
        return None
    return next((f for f in FORMATS if f.count_path == path), None)


def under(path: str) -> WireFormat | None:
    """The format whose API ``path`` belongs to: one of its paths, or a path below one
    (``/v1/messages/batches`` is Anthropic's): how a passthrough request to it is keyed."""
    return next(
        (f for f in FORMATS for p in _served(f) if path == p or path.startswith(p + "/")), None
    )


def owner_of(method: str | None, path: str) -> WireFormat | None:
    """The format serving ``method path`` on either of its routes: its errors' shape."""
    return for_path(method, path) or for_count_path(method, path)


def _served(wire: WireFormat) -> tuple[str, ...]:
    return (*wire.paths, *((wire.count_path,) if wire.count_path else ()))


def for_body(body: Mapping[str, Any]) -> WireFormat:
    """The format a body sent to the preview or ``compact`` is written in: the first that
    claims it, asking the default last (a chat body and a plain-text Messages body look
    alike, and read alike)."""
    others = (f for f in FORMATS if f is not DEFAULT and f.claims(body))
    return next(others, DEFAULT)


def for_api(api: str) -> WireFormat | None:
    """The format whose ``api`` label is ``api`` (an upstream's ``api`` setting names the API
    it speaks by this label: the summarizer calls it in that format's form); None: unknown."""
    return next((f for f in FORMATS if f.api == api), None)


def api_names() -> tuple[str, ...]:
    """Every ``api`` label, in registry order (what ``upstreams[].api`` may say)."""
    return tuple(dict.fromkeys(f.api for f in FORMATS))


def ends_stream(event: Event) -> bool:
    """Whether ``event`` ends a stream of any format (``WireFormat.ends_stream``). The relay
    asks them all, not only the route's: a passthrough stream has no format, and an upstream
    may end a stream the way another API does."""
    return any(f.ends_stream(event) for f in FORMATS)
