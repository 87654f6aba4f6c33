"""The Messages API's block vocabulary, for the Messages format (compaction_proxy/wire/messages/)
and its summary call (compaction_proxy/wire/_anthropic_summary.py) alike.

It lives outside ``wire/messages`` because the format imports the summary call: the summary
call reading these from the format's package would import it half made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
"""Signed blocks: never edited, dropped only with their whole turn."""

CACHE_CONTROL = "cache_control"
"""A prompt-cache breakpoint on a block; the API allows at most :data:`MAX_BREAKPOINTS`."""

MAX_BREAKPOINTS = 4


def block_type(block: object) -> str | None:
    if isinstance(block, Mapping):
        kind = block.get("type")
        return kind if isinstance(kind, str) else None
    return None


def blocks_of(content: object) -> list[Any]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []
