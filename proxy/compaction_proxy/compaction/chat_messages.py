"""Read-only helpers over OpenAI chat message dicts.

Messages stay the client's dicts end to end (unknown fields must reach upstream untouched), so
instead of converting them into a model we read the few fields compaction needs through these
helpers.  None of them mutate their input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

Message: TypeAlias = Mapping[str, Any]
"""A chat message as the client sent it (a parsed JSON object)."""

SYSTEM_ROLES = frozenset({"system", "developer"})
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def role_of(message: Message) -> str:
    """The message's role, or ``""`` when absent or not a string (validation is the edge's)."""
    role = message.get("role")
    return role if type(role) is str or isinstance(role, str) else ""


def tool_call_ids(message: Message) -> Iterator[str]:
    """Ids of the ``tool_calls`` entries of an assistant message, in order."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return
    for call in calls:
        if type(call) is dict or isinstance(call, Mapping):
            call_id = call.get("id")
            if isinstance(call_id, str):
                yield call_id


def has_tool_calls(message: Message) -> bool:
    """True for an assistant message that opens a tool-call group.

    An empty ``tool_calls`` list does not count: such a message has nothing to answer.
    """
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        return True
    call = message.get("function_call")
    return type(call) is dict or isinstance(call, Mapping)


def legacy_function_name(message: Message) -> str | None:
    """The name of a legacy ``function_call``, if the message carries one."""
    call = message.get("function_call")
    if call is not None and (type(call) is dict or isinstance(call, Mapping)):
        name = call.get("name")
        if isinstance(name, str):
            return name
    return None


def tool_call_names(message: Message) -> dict[str, str]:
    """Map tool call id to function name for an assistant message (used for labels)."""
    names: dict[str, str] = {}
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return names
    for call in calls:
        if type(call) is not dict and not isinstance(call, Mapping):
            continue
        call_id = call.get("id")
        function = call.get("function")
        if type(function) is not dict and not isinstance(function, Mapping):
            function = call.get("custom")
        name = (
            function.get("name")
            if type(function) is dict or isinstance(function, Mapping)
            else None
        )
        if isinstance(call_id, str) and isinstance(name, str):
            names[call_id] = name
    return names


def text_only(message: Message) -> str:
    """The textual content of a message: the string, or its text parts joined by newlines.

    Only the text, as written: non-text parts (images, audio, files) contribute nothing and
    nothing is scrubbed; callers that need them look at the raw ``content``. (A message's whole
    content rendered as text, every part named and ``data:`` URLs scrubbed, is
    :func:`.message_text.content_text`.)
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if type(part) is dict or isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return "\n".join(texts)
    return ""


def last_user_text(messages: Sequence[object], limit: int = 500) -> str | None:
    """The last user message's text, cut to ``limit`` characters with an ellipsis.

    What the dashboard may show of a request (only when ``dashboard.show_content`` is on);
    ``None`` when there is no user message or its content is not text.
    """
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if not isinstance(content, str | list):
            return None
        text = (
            content
            if isinstance(content, str)
            else " ".join(
                part["text"]
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
        )
        return text if len(text) <= limit else text[: limit - 1] + "\u2026"
    return None
