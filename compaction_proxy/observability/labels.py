"""Label values: the route of a request, and a bound on labels a client controls.

A Prometheus label with unbounded values is a memory leak in every scraper, so every label
value comes from here: the route has five values whatever the path, the API of a compacted
request two, and a client-controlled value (the model name) is kept for its first
``MAX_MODELS`` distinct values, then ``other``.
"""

from __future__ import annotations

__all__ = [
    "COMPACTED_ROUTES",
    "MAX_MODELS",
    "ROUTE_CHAT",
    "ROUTE_OTHER",
    "ROUTE_PASSTHROUGH",
    "ROUTE_PREVIEW",
    "ROUTE_RESPONSES",
    "LabelCap",
    "route_of",
]

ROUTE_CHAT = "chat_completions"
ROUTE_RESPONSES = "responses"
ROUTE_PREVIEW = "preview"
ROUTE_PASSTHROUGH = "passthrough"
ROUTE_OTHER = "other"

COMPACTED_ROUTES: dict[str, str] = {ROUTE_CHAT: "chat", ROUTE_RESPONSES: "responses"}
"""The routes whose requests are compacted, and the ``api`` label value of each."""

MAX_MODELS = 100
"""Distinct model label values kept per metric family; later ones are counted as ``other``."""


def route_of(method: str | None, path: str) -> str:
    """The ``route`` label of a request: five values, whatever the path."""
    if path.startswith("/v1/"):
        if path == "/v1/chat/completions" and method == "POST":
            return ROUTE_CHAT
        if path == "/v1/responses" and method == "POST":
            return ROUTE_RESPONSES
        if path == "/v1/compaction/preview":
            return ROUTE_PREVIEW
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
