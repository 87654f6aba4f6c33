"""Label values: the route of a request, and a bound on labels a client controls.

A Prometheus label with unbounded values is a memory leak in every scraper, so every label
value comes from here: the route has one value per wire format
(compaction_proxy/wire/registry.py), one per format's counting route, and four more,
whatever the path; the API of a compacted request one per format; and a client-controlled
value (the model name) is kept for its first ``MAX_MODELS`` distinct values, then ``other``.
"""

from __future__ import annotations

from compaction_proxy.wire import format_for_count_path, format_for_path
from compaction_proxy.wire.registry import FORMATS

__all__ = [
    "MAX_MODELS",
    "ROUTE_ARCHIVE",
    "ROUTE_CHAT",
    "ROUTE_OTHER",
    "ROUTE_PASSTHROUGH",
    "ROUTE_PREVIEW",
    "ROUTE_RESPONSES",
    "LabelCap",
    "api_of",
    "route_of",
]

ROUTE_CHAT = "chat_completions"
ROUTE_RESPONSES = "responses"
ROUTE_PREVIEW = "preview"
ROUTE_ARCHIVE = "archive"
ROUTE_PASSTHROUGH = "passthrough"
ROUTE_OTHER = "other"


MAX_MODELS = 100
"""Distinct model label values kept per metric family; later ones are counted as ``other``."""


def api_of(route: str) -> str | None:
    """The ``api`` label of a compacted route (its format's), None for any other route."""
    return next((wire.api for wire in FORMATS if wire.name == route), None)


def route_of(method: str | None, path: str) -> str:
    """The ``route`` label of a request: a format's name, or one of four, whatever the path."""
    if path.startswith("/v1/"):
        wire = format_for_path(method, path)
        if wire is not None:
            return wire.name
        counted = format_for_count_path(method, path)
        if counted is not None:
            return f"{counted.name}_count_tokens"
        if path == "/v1/compaction/preview":
            return ROUTE_PREVIEW
        if path.startswith("/v1/compaction/archive/"):
            return ROUTE_ARCHIVE
        return ROUTE_PASSTHROUGH
    return ROUTE_OTHER


class LabelCap:
    """Bounds a client-controlled label: the first ``limit`` distinct values, then ``other``.

    A value must also be short and printable: it ends up in the exposition text and on the
    dashboard, where a newline or a megabyte of model name would do harm.
    """

    def __init__(self, limit: int = MAX_MODELS, overflow: str = "other") -> None:
        self.limit = limit
        self.overflow = overflow
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return "unknown"
        if value in self._seen:
            return value
        if len(self._seen) < self.limit and len(value) <= 128 and value.isprintable():
            self._seen.add(value)
            return value
        return self.overflow
