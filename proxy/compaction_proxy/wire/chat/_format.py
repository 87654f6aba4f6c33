"""The chat-completions :class:`~compaction_proxy.wire.format.WireFormat`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_proxy.compaction.chat_messages import last_user_text

from .._bodies import parse_chat_body, validate_chat
from .._openai import CHAT_SUMMARY, OpenAIReplies
from ..format import BEARER, Lowered, RefusalText, SummaryCall, UpstreamAuth
from ..sse import Event
from ._recall import CHAT_RECALL, ChatRecall, stream_done


@dataclass(frozen=True, slots=True)
class ChatView:
    """A chat body is its own view: the core compacts its ``messages`` as they are."""

    chat: dict[str, Any]

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        # A message read back from a checkpoint that equals one the client sent goes as the
        # client's bytes too.
        return Lowered(messages, copies=True)


class ChatFormat(OpenAIReplies):
    name = "chat_completions"
    api = "chat"
    paths = ("/v1/chat/completions",)
    count_path: str | None = None
    items = "messages"
    output_limits = ("max_completion_tokens", "max_tokens")
    auth: UpstreamAuth = BEARER
    summary: SummaryCall | None = CHAT_SUMMARY
    prefix_summaries = True
    refusals: tuple[RefusalText, ...] = ()
    parse: Callable[[bytes], dict[str, Any]] = staticmethod(parse_chat_body)
    recall: ChatRecall = CHAT_RECALL
    """The format's side of the recall loop (``_recall.py``)."""

    def claims(self, body: Mapping[str, Any]) -> bool:
        return "messages" in body

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return None

    def has_items(self, body: Mapping[str, Any]) -> bool:
        # An empty list has nothing to compact; the upstream gives its own verdict on it.
        return bool(body.get("messages"))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        messages = body.get("messages")
        return last_user_text(messages) if isinstance(messages, list) else None

    def ends_stream(self, event: Event) -> bool:
        return stream_done(event)

    def lift(self, body: dict[str, Any], *, check: bool = True) -> ChatView:
        if check:
            validate_chat(body)
        return ChatView(body)


CHAT = ChatFormat()
