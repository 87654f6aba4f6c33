"""Anthropic's Messages API (``POST /v1/messages``) as a wire format
(:class:`~compaction_proxy.wire.format.WireFormat`).

Claude Code, the Claude Agent SDK and the Anthropic SDKs re-send the whole conversation every
turn, as chat agents do, so their messages are shown to the core as chat messages
(:mod:`._lift`) and the result is mapped back (:mod:`._lower`); only ``messages`` is replaced
in the client's bytes. Keys: Anthropic's upstreams take ``x-api-key``; its clients send their
key as ``x-api-key`` (Claude Code) or ``Authorization: Bearer`` (the Python SDK). Errors the
proxy answers itself on this path are in Anthropic's shape, ``{"type": "error", "error":
{"type", "message"}}``, which its SDKs parse. See docs/messages.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.http import bad_request

from .._bodies import parse_json_object
from ..format import (
    Amendment,
    Headers,
    Lowered,
    RefusalText,
    SummaryCall,
    UpstreamAuth,
    UpstreamTraits,
    WindowOption,
)
from ..recall import RecallWire
from ..sse import Event
from ._binding import thinking_binding
from ._blocks import block_type
from ._cleared_thinking import drop_thinking, restore_thinking
from ._context_management import MessagesEdits, translate
from ._lift import Lifted, lift, request_messages
from ._lower import lower
from ._recall import MESSAGES_RECALL
from ._sizes import anthropic_usage_tokens, anthropic_window_option
from ._summary import MESSAGES_SUMMARY, X_API_KEY
from ._validation import validate_request

ANTHROPIC_ONLY_FIELDS = frozenset(
    {"system", "stop_sequences", "top_k", "thinking", "context_management", "anthropic_version"}
)
"""Top-level fields a chat-completions body never has: a body with one is a Messages body."""
ANTHROPIC_BLOCKS = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "document", "image"}
)

_ERROR_TYPES = {
    "invalid_api_key": "authentication_error",
    "request_too_large": "request_too_large",
    "too_many_messages": "request_too_large",
    "too_many_content_parts": "request_too_large",
    "model_not_found": "not_found_error",
    "not_found": "not_found_error",
    "server_shutting_down": "overloaded_error",
}
"""Our error codes by the Anthropic error type its SDKs map to an exception class."""
_KNOWN_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    }
)


def parse_messages_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says what is wrong with it (a module-level
    function: a large body is parsed in a worker process, which imports it by name)."""
    data = parse_json_object(raw)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(
            f"model: must be a string, not {type(model).__name__}",
            param="model",
            code="invalid_type",
        )
    return data


def is_messages_body(body: Mapping[str, Any]) -> bool:
    """A Messages body rather than a chat-completions one: it has a field only Messages has,
    or a content block only Messages has (a plain-text one reads the same either way)."""
    if "messages" not in body:
        return False
    if ANTHROPIC_ONLY_FIELDS.intersection(body):
        return True
    for message in request_messages(body)[-64:]:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(block_type(b) in ANTHROPIC_BLOCKS for b in content):
            return True
    return False


def anthropic_error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> bytes:
    kind = _ERROR_TYPES.get(code or "") or (type if type in _KNOWN_TYPES else None)
    if kind is None:
        kind = "invalid_request_error" if type == "invalid_request_error" else "api_error"
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


usage_tokens = anthropic_usage_tokens
"""The prompt's tokens an Anthropic reply reports (compaction_proxy/wire/messages/_sizes.py)."""


@dataclass(frozen=True, slots=True)
class MessagesView:
    """A Messages body as the core sees it, and the way back to its messages."""

    lifted: Lifted
    chat: dict[str, Any]
    body: Mapping[str, Any]

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        # An assistant piece whose thinking `clear_thinking_20251015` cleared goes as the
        # client's message without those blocks (compaction_proxy/wire/messages/
        # _context_management.py).
        messages, drop = restore_thinking(self.lifted, messages)
        lowered = lower(self.lifted, messages, self.body)
        items = drop_thinking(lowered.items, drop) if drop else lowered.items
        return Lowered(items, lowered.notes)

    def context_edits(self, *, summarizer: bool) -> MessagesEdits | None:
        """The request's ``context_management``, for an upstream that does not apply it
        (:class:`~compaction_proxy.wire.format.EditedView`)."""
        return translate(self.body, summarizer=summarizer)


class MessagesFormat:
    name = "messages"
    api = "messages"
    paths = ("/v1/messages",)
    count_path: str | None = "/v1/messages/count_tokens"
    output_limits: tuple[str, ...] = ("max_tokens",)
    items = "messages"
    auth: UpstreamAuth = X_API_KEY
    summary: SummaryCall | None = MESSAGES_SUMMARY
    prefix_summaries = False  # the transcript form: the view is not chat completions
    refusals: tuple[RefusalText, ...] = ()  # Anthropic's phrase is among the common ones
    parse = staticmethod(parse_messages_body)
    recall: RecallWire = MESSAGES_RECALL  # the recall tool on this API (._recall)

    def claims(self, body: Mapping[str, Any]) -> bool:
        return is_messages_body(body)

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return None  # the Messages API holds no conversation state server-side

    def has_items(self, body: Mapping[str, Any]) -> bool:
        return bool(request_messages(body))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        return None  # read from the lifted view

    def lift(self, body: dict[str, Any], *, check: bool = True) -> MessagesView:
        """The chat-shaped view of ``body``, or a 400 naming what is wrong with its messages
        (checked whatever ``check`` says: what is wrong cannot be lifted)."""
        issue = validate_request(body)
        if issue is not None:
            raise bad_request(issue.message, param=issue.param, code="invalid_messages")
        lifted = lift(body)
        return MessagesView(lifted, lifted.chat_body(body), body)

    usage_at_start = True  # message_start states it; llama.cpp's message_delta does not

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        """``thinking.block_binding: drop_block`` and its beta for Anthropic's API, when signed
        thinking follows what compaction changed (compaction_proxy/wire/messages/_binding.py)."""
        return thinking_binding(body, items, upstream)

    def usage_tokens(self, payload: Any) -> int | None:
        return anthropic_usage_tokens(payload)

    def ends_stream(self, event: Event) -> bool:
        return event.name == "message_stop" or event.kind == "message_stop"

    def window_option(self, model: str, headers: Headers) -> WindowOption | None:
        return anthropic_window_option(model, headers)

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        return anthropic_error_body(message, type=type, code=code, param=param)

    def stream_error(
        self, message: str, *, type: str, code: str | None, param: str | None, sequence: int
    ) -> bytes:
        """Anthropic's ``error`` event, which its SDKs raise mid-stream."""
        body = anthropic_error_body(message, type=type, code=code, param=param)
        return b"event: error\ndata: " + body + b"\n\n"


MESSAGES = MessagesFormat()
