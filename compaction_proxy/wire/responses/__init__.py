"""The Responses API on the compaction core: ``input`` items shown to the core as chat
messages, and the core's result mapped back to items.

:func:`lift` turns a Responses body into a :class:`Lifted` (chat-shaped messages for the core,
plus what maps them back), :func:`lower` turns the pipeline's messages into input items,
:func:`validate_request` checks what compaction reads, and :func:`server_state` says when a
request continues a conversation the proxy cannot see. Pure: no I/O, nothing of the edge.
See docs/responses.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._lift import Lifted, input_items, lift
from ._lower import Lowered, LowerError, lower
from ._validation import validate_request

__all__ = [
    "Lifted",
    "LowerError",
    "Lowered",
    "input_items",
    "is_responses_body",
    "lift",
    "lower",
    "server_state",
    "validate_request",
]

SERVER_STATE_FIELDS = ("previous_response_id", "conversation")


def server_state(body: Mapping[str, Any]) -> str | None:
    """The field through which the request continues server-side history, if any.

    The upstream prepends that history to ``input``; the proxy sees only the new items, so it
    can neither count nor compact the conversation, and forwards the request unchanged.
    """
    return next((name for name in SERVER_STATE_FIELDS if body.get(name) is not None), None)


def is_responses_body(body: Mapping[str, Any]) -> bool:
    """A Responses body (``input``) rather than a chat-completions one (``messages``)."""
    return "input" in body and "messages" not in body
