"""The per-request size limits of the compacting routes (``server.max_messages``,
``server.max_content_parts``), and when they apply.

They bound the work compaction does, so they apply to requests the proxy compacts: not with
``X-Compaction: off`` (the body goes upstream as it came), and not for a model whose
compaction is disabled. The check itself is in the core (compaction_proxy/compaction/
validation.py: ``size_issue``); large bodies are checked where they are parsed, off the event
loop (compaction_proxy/engine/_offload.py).
"""

from __future__ import annotations

from collections.abc import Callable

from compaction_proxy.compaction.validation import SizeLimits
from compaction_proxy.http import Scope, header

from ._context import AppState


def size_limits(state: AppState, scope: Scope) -> SizeLimits | None:
    """The limits for this request, or None when it will not be compacted (``off``)."""
    mode = header(scope, b"x-compaction")
    if mode is not None and mode.strip().lower() == b"off":
        return None
    server = state.settings.server
    return SizeLimits(server.max_messages, server.max_content_parts)


def compacted_model(state: AppState) -> Callable[[str | None], bool]:
    """Whether a request for a model will be compacted (its limits then apply)."""

    def applies(model: str | None) -> bool:
        return model is not None and state.compactor.enabled_for(model)

    return applies
