"""Anthropic's Messages API on the compaction core: content blocks shown to the core as chat
messages, and the core's result mapped back.

:func:`lift` turns a Messages body into a :class:`Lifted` (chat-shaped messages for the core,
plus what maps them back), :func:`lower` turns the pipeline's messages into Messages
``messages``, :func:`validate_request` checks what compaction reads. Pure: no I/O, nothing of
the edge; except :data:`MESSAGES`, the API's :class:`~compaction_proxy.wire.format.WireFormat`
(``_format.py``, which answers its 400s). See docs/messages.md.
"""

from __future__ import annotations

from ..format import Lowered, LowerError
from ._binding import offer_binding, thinking_binding, unbound_blocks
from ._format import (
    MESSAGES,
    MessagesFormat,
    MessagesView,
    anthropic_error_body,
    is_messages_body,
    parse_messages_body,
    usage_tokens,
)
from ._lift import Lifted, Owner, Piece, lift
from ._lower import lower
from ._recall import MESSAGES_RECALL, MessagesRecall
from ._sizes import BINDING_BETA
from ._validation import validate_request

__all__ = [
    "BINDING_BETA",
    "MESSAGES",
    "MESSAGES_RECALL",
    "Lifted",
    "LowerError",
    "Lowered",
    "MessagesFormat",
    "MessagesRecall",
    "MessagesView",
    "Owner",
    "Piece",
    "anthropic_error_body",
    "is_messages_body",
    "lift",
    "lower",
    "offer_binding",
    "parse_messages_body",
    "thinking_binding",
    "unbound_blocks",
    "usage_tokens",
    "validate_request",
]
