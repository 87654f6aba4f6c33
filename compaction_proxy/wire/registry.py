"""The wire formats the proxy compacts, listed once.

Dispatch (``app.py``), the metric labels (``observability/labels.py``), the preview, the CLI's
``compact`` and the summarizer all read this list; adding a format is one entry here (or one
:func:`register` call at start-up) and the format's own folder (docs/architecture.md, "Adding a
wire format").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .chat import CHAT
from .format import WireFormat
from .responses import RESPONSES

__all__ = [
    "DEFAULT",
    "FORMATS",
    "api_names",
    "for_api",
    "for_body",
    "for_path",
    "register",
    "unregister",
]

FORMATS: list[WireFormat] = [CHAT, RESPONSES]
"""Every format, in the order :func:`for_body` asks them; the first is the default."""

DEFAULT: WireFormat = CHAT
"""What a body no format claims is read as (the preview's and ``compact``'s default, and the
summarizer's call form)."""


def register(wire: WireFormat) -> None:
    """Add ``wire`` (its name and paths must be new)."""
    taken = {p for f in FORMATS for p in f.paths}
    if any(f.name == wire.name for f in FORMATS) or taken.intersection(wire.paths):
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


def for_body(body: Mapping[str, Any]) -> WireFormat:
    """The format a body sent to the preview or ``compact`` is written in."""
    return next((f for f in FORMATS if f.claims(body)), DEFAULT)


def for_api(api: str) -> WireFormat | None:
    """The format whose ``api`` label is ``api`` (an upstream's ``api`` setting names the API
    it speaks by this label: the summarizer calls it in that format's form); None: unknown."""
    return next((f for f in FORMATS if f.api == api), None)


def api_names() -> tuple[str, ...]:
    """Every ``api`` label, in registry order (what ``upstreams[].api`` may say)."""
    return tuple(dict.fromkeys(f.api for f in FORMATS))
