"""What OpenAI's two APIs (chat completions, Responses) share on the wire: how a reply reports
the prompt's size (at a stream's end), that no request header changes a window, and the summary
call both send (the chat-completions form).

The formats of :mod:`compaction_proxy.wire.chat` and :mod:`compaction_proxy.wire.responses`
name these in their :class:`~compaction_proxy.wire.format.WireFormat` fields; nothing else
reads them directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compaction_proxy.http import error_body

from .format import (
    Amendment,
    Headers,
    SummaryCall,
    SummaryReply,
    UpstreamTraits,
    WindowOption,
)

__all__ = ["CHAT_SUMMARY", "OpenAIReplies", "openai_usage_tokens"]


class OpenAIReplies:
    """How both of OpenAI's APIs read a reply's usage, size a window and shape an error: one
    definition the two formats inherit, so they cannot drift apart."""

    usage_at_start = False  # a stream's usage is in its last chunk (or last event)

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        return None  # nothing an OpenAI upstream binds to the conversation's prefix

    def usage_tokens(self, payload: Any) -> int | None:
        return openai_usage_tokens(payload)

    def window_option(self, model: str, headers: Headers) -> WindowOption | None:
        return None

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        return error_body(message, type=type, code=code, param=param)

    def stream_error(
        self, message: str, *, type: str, code: str | None, param: str | None, sequence: int
    ) -> bytes:
        """Chat completions' (and the SDKs' generic) stream error: ``data: {"error": ...}``,
        which the SDKs raise as an ``APIError``."""
        return b"data: " + error_body(message, type=type, code=code, param=param) + b"\n\n"


def openai_usage_tokens(payload: Any) -> int | None:
    """``usage.prompt_tokens`` (chat completions) or ``usage.input_tokens`` (Responses) of a
    JSON reply or of one SSE event's data; a Responses stream's last event carries the whole
    response, its usage inside."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        response = payload.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None
    tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return None


def _chat_summary_body(
    parameters: Mapping[str, Any],
    model: str,
    messages: list[dict[str, Any]],
    extra: Mapping[str, Any],
    limit_param: str,
    limit: int,
) -> dict[str, Any]:
    body: dict[str, Any] = dict(parameters)
    body.update(model=model, stream=False, messages=messages)
    body.update(extra)
    body[limit_param] = limit
    return body


def _read_chat_summary(payload: Any) -> SummaryReply:
    try:
        choice = payload["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError("not a chat completion") from exc
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return SummaryReply(
        text=_message_text(message.get("content") if isinstance(message, dict) else None),
        cut=isinstance(choice, dict) and choice.get("finish_reason") == "length",
        completion_tokens=_completion_tokens(usage),
        cached_tokens=_cached_tokens(usage),
    )


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "output_text")
        ]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _completion_tokens(usage: object) -> int | None:
    """Visible output tokens: ``completion_tokens`` minus reasoning tokens, which o-series
    models count there too but which are not part of the summary."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("completion_tokens")
    if not isinstance(total, int):
        return None
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return total - reasoning if isinstance(reasoning, int) else total


def _cached_tokens(usage: object) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (0 when absent or malformed)."""
    if not isinstance(usage, dict):
        return 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0 else 0


CHAT_SUMMARY = SummaryCall("/chat/completions", _chat_summary_body, _read_chat_summary)
"""The summary call as a chat completion: what every OpenAI-compatible server answers."""
