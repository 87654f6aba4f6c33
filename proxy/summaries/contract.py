"""The summarizer contract shared with the compaction core.

The core owns these names in ``proxy.compaction.summarizer``; until that module is merged this
file defines identical stand-ins so the summaries package can be built and tested on its own.
Everything in ``proxy.summaries`` imports the names from here, so switching to the core's
definitions is a one-place change (delete the fallback half below).
"""

from __future__ import annotations

try:  # pragma: no cover - which branch runs depends on the merge state
    from proxy.compaction.summarizer import (  # type: ignore[import-not-found,unused-ignore]
        Summarizer,
        SummaryError,
        SummaryRequest,
    )
except ImportError:  # pragma: no cover - fallback until the core's module exists
    from dataclasses import dataclass
    from typing import Any, Protocol

    @dataclass(frozen=True, slots=True)
    class SummaryRequest:  # type: ignore[no-redef]
        """One stretch of conversation to fold into a checkpoint summary."""

        messages: tuple[dict[str, Any], ...]
        previous_summary: str | None
        model: str

    class SummaryError(Exception):  # type: ignore[no-redef]
        """A summary could not be produced; ``reason`` is a short machine-readable word:
        ``timeout``, ``error``, ``empty``, ``oversized``, ``not_shorter`` or ``backoff``."""

        def __init__(self, reason: str, message: str) -> None:
            super().__init__(message)
            self.reason = reason
            self.message = message

    class Summarizer(Protocol):  # type: ignore[no-redef]
        """Produces the summary text for a request, or raises :class:`SummaryError`."""

        async def summarize(self, request: SummaryRequest) -> str: ...


__all__ = ["Summarizer", "SummaryError", "SummaryRequest"]
