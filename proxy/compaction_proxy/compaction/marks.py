"""The marks a recall id leaves in the text the model reads (see "Recall marks" in
docs/compaction.md).

Two forms, both at the very end of a message's text:

* a rewritten message (a cleared, trimmed or soft-trimmed tool result): its new text, then
  :data:`ORIGINAL_MARK`, `` [recall id r…]``;
* a message that stands for several (a summary, a collapsed ``[Tool results: ...]``): its text,
  then :data:`SPAN_MARK`, ``\\n\\n[Originals of what this summary covers: recall id s…]``.

Where a mark goes: string content gets it appended; list content gets it appended to its last
text part, or, without one, a text part is added.  Only ``tool``/``function`` results and user
or assistant messages with text can carry one; an assistant message whose content is empty
(only tool calls) cannot, and a ``system``/``developer`` message is never marked (compaction
never touches it).

Putting a mark is idempotent: an existing closing mark on the text is replaced, never doubled, so
a strategy that copies a stub's text (head and tail of a trimmed result) gets one mark, and
marking a stub again with its own id gives the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .archive import mark_of
from .chat_messages import Message, role_of

__all__ = [
    "ORIGINAL_MARK",
    "SPAN_MARK",
    "can_carry_mark",
    "marked",
    "message_mark",
    "original_mark",
    "span_mark",
    "strip_mark",
    "with_mark",
]

ORIGINAL_MARK = " [recall id {}]"
"""What a rewritten message's text ends with (``{}``: the original's id)."""
SPAN_MARK = "\n\n[Originals of what this summary covers: recall id {}]"
"""What a summary's (or a collapsed group's) text ends with (``{}``: the span's id)."""

_CLOSING = re.compile(r"(?:\n\n| )?\[[^\[\]]*?recall id [rs][a-z2-7]{11}\]\s*$")
"""A closing mark with the separator our marks put before it (what :func:`strip_mark` cuts)."""
_RESULT_ROLES = frozenset({"tool", "function"})
_TEXT_ROLES = frozenset({"user", "assistant"})


def original_mark(recall_id: str) -> str:
    """The mark naming an original (``r…``)."""
    return ORIGINAL_MARK.format(recall_id)


def span_mark(recall_id: str) -> str:
    """The mark naming a span (``s…``)."""
    return SPAN_MARK.format(recall_id)


def strip_mark(text: str) -> str:
    """``text`` without its closing mark (and the separator before it), if it has one."""
    if "recall id " not in text:
        return text
    match = _CLOSING.search(text)
    return text if match is None else text[: match.start()]


def with_mark(text: str, mark: str) -> str:
    """``text`` ending with ``mark`` (an existing closing mark replaced); an empty text is the
    mark alone, without its separator."""
    base = strip_mark(text)
    return base + mark if base else mark.lstrip()


def _is_text_part(part: object) -> bool:
    return (
        isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def can_carry_mark(message: Message) -> bool:
    """Whether ``message`` can carry a mark (see the module docstring)."""
    role = role_of(message)
    if role in _RESULT_ROLES:
        return True
    if role not in _TEXT_ROLES:
        return False
    content = message.get("content")
    if isinstance(content, str):
        return bool(content)
    return isinstance(content, list) and any(_is_text_part(p) for p in content)


def message_mark(message: Message) -> str | None:
    """The recall id the closing mark of ``message``'s text names (its last text part for list
    content), or ``None``: the message is no stub."""
    content = message.get("content")
    if isinstance(content, str):
        return mark_of(content)
    if isinstance(content, list):
        for part in reversed(content):
            if _is_text_part(part):
                return mark_of(part["text"])
    return None


def marked(message: Message, mark: str) -> Message:
    """``message`` with ``mark`` closing its text (every other field kept), or ``message``
    itself when it cannot carry one (:func:`can_carry_mark`)."""
    if not can_carry_mark(message):
        return message
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": with_mark(content, mark)}
    if isinstance(content, list):
        last = next((p for p in range(len(content) - 1, -1, -1) if _is_text_part(content[p])), None)
        parts: list[Any] = list(content)
        if last is None:
            parts.append({"type": "text", "text": with_mark("", mark)})
        else:
            part = content[last]
            parts[last] = {**part, "text": with_mark(part["text"], mark)}
        return {**message, "content": parts}
    return {**message, "content": with_mark("", mark)}  # a result without content
