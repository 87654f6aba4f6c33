"""The Responses API on the compaction core: ``input`` items shown to the core as chat
messages, and the core's result mapped back to items.

:func:`lift` turns a Responses body into a :class:`Lifted` (chat-shaped messages for the core,
plus what maps them back), :func:`lower` turns the pipeline's messages into input items,
:func:`validate_request` checks what compaction reads, and :func:`server_state` says when a
request continues a conversation the proxy cannot see. Pure: no I/O, nothing of the edge;
except :data:`RESPONSES`, the API's :class:`~compaction_proxy.wire.format.WireFormat`
(``_format.py``, which answers its 400s). See docs/responses.md.
"""

from __future__ import annotations

from ..format import Lowered, LowerError
from ._format import (
    RESPONSES,
    ResponsesFormat,
    ResponsesView,
    is_responses_body,
    parse_responses_body,
    server_state,
)
from ._lift import Lifted, input_items, lift
from ._lower import lower
from ._validation import validate_request

__all__ = [
    "RESPONSES",
    "Lifted",
    "LowerError",
    "Lowered",
    "ResponsesFormat",
    "ResponsesView",
    "input_items",
    "is_responses_body",
    "lift",
    "lower",
    "parse_responses_body",
    "server_state",
    "validate_request",
]
