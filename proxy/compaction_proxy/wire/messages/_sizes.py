"""What Anthropic's Messages API says on the wire about sizes: how a reply states the prompt's
size, and which request header changes a model's window.

Pure helpers for the Messages format's :class:`~compaction_proxy.wire.format.WireFormat`
(``usage_tokens``, ``window_option``); nothing else reads them directly.

* **Usage.** The prompt is ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``: with prompt caching, ``input_tokens`` counts only what came
  after the last cache breakpoint. A JSON reply carries ``usage`` at the top; a stream carries
  it in its first event (``message_start``: ``message.usage``) and, cumulatively, in
  ``message_delta`` at the end (some servers put only ``output_tokens`` there, llama.cpp's
  among them).
* **The 1M-context beta.** ``anthropic-beta: context-1m-2025-08-07`` lets a request to Claude
  Sonnet 4 or 4.5 use a 1,000,000-token window instead of 200,000. Opus 4.6, Sonnet 4.6 and
  every later model have the 1M window without it (docs/compaction.md, "The budget"); the header
  is honoured there too and changes nothing but the name a refused window is learned under.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..format import Headers, WindowOption

BINDING_BETA = "thinking-binding-controls-2026-08-01"
"""The beta under which Anthropic's API accepts ``thinking.block_binding`` (preserved thinking:
compaction_proxy/wire/messages/_binding.py)."""

__all__ = [
    "BETA_HEADER",
    "CONTEXT_1M_BETA",
    "CONTEXT_1M_WINDOW",
    "anthropic_usage_tokens",
    "anthropic_window_option",
    "betas",
    "supports_1m_beta",
]

BETA_HEADER = b"anthropic-beta"
CONTEXT_1M_BETA = "context-1m-2025-08-07"
CONTEXT_1M_WINDOW = 1_000_000

_PROMPT_PARTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")

# `claude-sonnet-4-5`, `claude-sonnet-4-5-20250929`, `claude-opus-4-6`, `claude-sonnet-4.5`
# (OpenRouter), `claude-sonnet-4-5@20250929` (Vertex), `anthropic.claude-opus-4-6-v1:0`
# (Bedrock). The minor version is one or two digits, so a date (`claude-sonnet-4-20250514`)
# is never read as one.
_MODEL = re.compile(
    r"(?:^|[./])claude-(?P<family>[a-z]+)-(?P<major>\d{1,2})(?:[-.](?P<minor>\d{1,2}))?(?!\d)"
)


def anthropic_usage_tokens(payload: Any) -> int | None:
    """The prompt's tokens a Messages reply (or one SSE event's data) states, or None.

    ``usage`` at the top (a JSON reply, ``message_delta``) or inside ``message``
    (``message_start``); the three input counts are added, a missing or null cache count
    counting 0. None without ``input_tokens`` (a ``message_delta`` with only
    ``output_tokens``) or when the sum is 0 (a server that states it only at the end).
    """
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        if not isinstance(usage, dict):
            return None
    total = 0
    stated = False
    for name in _PROMPT_PARTS:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total += value
            stated = stated or name == "input_tokens"
    return total if stated and total > 0 else None


def betas(headers: Headers) -> Iterator[str]:
    """Every beta the request's ``anthropic-beta`` headers name (comma-separated, repeated
    headers joined), as written."""
    for name, value in headers:
        if name.lower() == BETA_HEADER:
            for item in value.decode("latin-1").split(","):
                item = item.strip()
                if item:
                    yield item


def supports_1m_beta(model: str) -> bool:
    """Whether ``model`` takes the 1M-context beta: Claude Sonnet 4 and later, Opus 4.6 and
    later, and every model of generation 5 on (which have the window without it)."""
    found = _MODEL.search(model.lower())
    if found is None:
        return False
    family = found.group("family")
    version = (int(found.group("major")), int(found.group("minor") or 0))
    if version >= (5, 0):
        return True
    if family == "sonnet":
        return version >= (4, 0)
    if family == "opus":
        return version >= (4, 6)
    return False


def anthropic_window_option(model: str, headers: Headers) -> WindowOption | None:
    """The 1M window a request opts into with ``anthropic-beta: context-1m-2025-08-07``, when
    its model takes that beta; None for any other request."""
    if not any(beta == CONTEXT_1M_BETA for beta in betas(headers)):
        return None
    if not supports_1m_beta(model):
        return None
    return WindowOption(CONTEXT_1M_WINDOW, CONTEXT_1M_BETA)
