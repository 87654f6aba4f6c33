"""A stand-in for the Messages wire format, for the summarizer's tests of its Messages form.

The real format is compaction_proxy/wire/messages/ (its lift and lower, its registry entry).
What the summarizer relies on is small: a view whose ``chat`` messages follow the lifted-view
contract (a top-level ``system`` as one system message; a user message of ``tool_result``
blocks as one ``tool`` message per result; an assistant message as one message with
``tool_calls`` and its ``thinking`` blocks aside) and whose ``lower`` maps those chat messages
back to the client's own message objects, made-up ones as new text messages. :func:`lift` does
that for the simple bodies these tests send (text, ``tool_use``, ``tool_result``, thinking).

:data:`STAND_IN` is a format with the ``messages`` API label and the Messages summary call,
which :func:`ensure_messages_api` registers when the registry has no ``messages`` format yet, so
an upstream's ``api: messages`` names something. Once the real format is registered it is the
one found, and the stand-in is never added.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.wire import (
    Lowered,
    NativeRequest,
    RefusalText,
    SummaryCall,
    UpstreamAuth,
    registry,
)
from compaction_proxy.wire.messages._summary import MESSAGES_SUMMARY, X_API_KEY


@dataclass
class DoubleView:
    """``chat``: the lifted body; ``native``: the Messages body it was lifted from."""

    chat: dict[str, Any]
    native: dict[str, Any]
    system: dict[str, Any] | None
    owner: dict[int, dict[str, Any]] = field(default_factory=dict)

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        items: list[Any] = []
        for message in messages:
            if message is self.system:
                continue  # the top-level system goes as `system`, never in `messages`
            own = self.owner.get(id(message))
            if own is not None:
                if not items or items[-1] is not own:
                    items.append(own)
                continue
            role = "assistant" if message.get("role") == "assistant" else "user"
            text = message.get("content")
            items.append({"role": role, "content": [{"type": "text", "text": str(text)}]})
        return Lowered(items)

    def native_request(self, headers: Mapping[str, str] | None = None) -> NativeRequest:
        return NativeRequest(self.native, self.lower, dict(headers or {}))


def _text_parts(content: Any) -> Any:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": b["text"]}
        for b in content
        if isinstance(b, dict) and b.get("type") == "text"
    ]


def lift(body: dict[str, Any]) -> DoubleView:
    chat_messages: list[dict[str, Any]] = []
    owner: dict[int, dict[str, Any]] = {}
    system = None
    if body.get("system"):
        system = {"role": "system", "content": _text_parts(body["system"])}
        chat_messages.append(system)

    def add(lifted: dict[str, Any], own: dict[str, Any]) -> None:
        chat_messages.append(lifted)
        owner[id(lifted)] = own

    for message in body["messages"]:
        content = message["content"]
        blocks = content if isinstance(content, list) else []
        if message["role"] == "assistant":
            lifted: dict[str, Any] = {
                "role": "assistant",
                "content": _text_parts(content) or None,
            }
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            if calls:
                lifted["tool_calls"] = calls
            thinking = [b for b in blocks if b.get("type") in ("thinking", "redacted_thinking")]
            if thinking:
                lifted["thinking"] = thinking
            add(lifted, message)
            continue
        results = [b for b in blocks if b.get("type") == "tool_result"]
        for result in results:
            text = result.get("content")
            add(
                {
                    "role": "tool",
                    "tool_call_id": result["tool_use_id"],
                    "content": _text_parts(text),
                },
                message,
            )
        rest = [b for b in blocks if b.get("type") != "tool_result"]
        if not results:
            add({"role": "user", "content": _text_parts(content)}, message)
        elif rest:
            add({"role": "user", "content": _text_parts(rest)}, message)
    chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages}
    return DoubleView(chat, body, system, owner)


class StandInMessages:
    """A format with the Messages API label and summary call; it serves no path."""

    name = "messages_stand_in"
    api = "messages"
    paths: tuple[str, ...] = ()
    items = "messages"
    auth: UpstreamAuth = X_API_KEY
    summary: SummaryCall | None = MESSAGES_SUMMARY
    prefix_summaries = False
    refusals: tuple[RefusalText, ...] = ()
    parse: Callable[[bytes], dict[str, Any]] = staticmethod(orjson.loads)

    def claims(self, body: Mapping[str, Any]) -> bool:
        return False

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return None

    def has_items(self, body: Mapping[str, Any]) -> bool:
        return bool(body.get("messages"))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        return None

    def lift(self, body: dict[str, Any], *, check: bool = True) -> DoubleView:
        return lift(body)

    def usage_tokens(self, payload: Any) -> int | None:
        return None

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": type, "message": message}})


STAND_IN = StandInMessages()


def ensure_messages_api() -> Callable[[], None]:
    """Registers :data:`STAND_IN` unless a ``messages`` format is registered; returns the undo."""
    if registry.for_api("messages") is not None:
        return lambda: None
    registry.register(STAND_IN)
    return lambda: registry.unregister(STAND_IN)
