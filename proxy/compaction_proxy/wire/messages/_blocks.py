"""What each Messages content block is to compaction, and how its content is shown to the core.

The Messages API sends a turn as a list of typed blocks. Compaction needs only a few facts per
block: is it text the model reads, a client tool's call (``tool_use``) or its answer
(``tool_result``), the model's signed thinking, or something the proxy carries without reading
(server tools and their results, documents, block types added to the API later). Everything
else about a block stays the client's business and goes upstream as it came.

The vocabulary here (block types, ``cache_control``) is the format's and its summary call's
(``_summary.py``) alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CACHE_CONTROL",
    "MAX_BREAKPOINTS",
    "ROLES",
    "THINKING_TYPES",
    "block_type",
    "blocks_of",
    "breakpoints",
    "image_part",
    "lift_part",
    "lift_parts",
    "marked",
    "marked_blocks",
    "nested_blocks",
]

ROLES = frozenset({"user", "assistant", "system"})
"""``system`` inside ``messages`` is Claude Code's mid-conversation note (a beta)."""

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
"""Signed blocks: never edited, dropped only with their whole turn."""

CACHE_CONTROL = "cache_control"
"""A prompt-cache breakpoint on a block; the API allows at most :data:`MAX_BREAKPOINTS`."""

MAX_BREAKPOINTS = 4


def block_type(block: object) -> str | None:
    if isinstance(block, Mapping):
        kind = block.get("type")
        return kind if isinstance(kind, str) else None
    return None


def blocks_of(content: object) -> list[Any]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def lift_part(block: Any) -> Any:
    """One block as a chat content part: text as ``text`` parts (without ``cache_control``,
    which moves from turn to turn and must not change what the core hashes), images as chat
    ``image_url`` parts (counted by their tiles), anything else as it is (counted as JSON)."""
    kind = block_type(block)
    if kind == "text":
        text = block.get("text")
        return {"type": "text", "text": text if isinstance(text, str) else ""}
    if kind == "image":
        return image_part(block)
    if isinstance(block, Mapping) and CACHE_CONTROL in block:
        return {k: v for k, v in block.items() if k != CACHE_CONTROL}
    return block


def lift_parts(content: object) -> Any:
    """A content value as chat content: a string stays a string."""
    if isinstance(content, str) or content is None:
        return content
    if not isinstance(content, list):
        return content
    return [lift_part(block) for block in content]


def image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A chat ``image_url`` part for an ``image`` block (base64 as a ``data:`` URL)."""
    source = block.get("source")
    url: str | None = None
    if isinstance(source, Mapping):
        if source.get("type") == "base64":
            media = source.get("media_type")
            data = source.get("data")
            if isinstance(data, str):
                url = f"data:{media if isinstance(media, str) else 'image/png'};base64,{data}"
        elif isinstance(source.get("url"), str):
            url = source["url"]
    return {"type": "image_url", "image_url": {"url": url}}


def nested_blocks(element: Mapping[str, Any]) -> list[Any] | None:
    """The blocks inside a message or a ``tool_result`` block, where breakpoints may sit too."""
    content = element.get("content")
    if isinstance(content, list) and ("role" in element or element.get("type") == "tool_result"):
        return content
    return None


def breakpoints(value: object) -> int:
    """How many ``cache_control`` breakpoints a list of blocks, tools or messages holds: every
    element whose ``cache_control`` is set to anything (a message's own included), and those
    inside messages and ``tool_result`` blocks at any depth. The count the lowering keeps under
    the API's :data:`MAX_BREAKPOINTS` before it adds one of its own (``_lower.py``), so it counts
    whatever the API might."""
    count = 0
    if isinstance(value, list):
        for element in value:
            if isinstance(element, Mapping):
                if element.get(CACHE_CONTROL) is not None:
                    count += 1
                inner = nested_blocks(element)
                if inner is not None:
                    count += breakpoints(inner)
    return count


def marked(block: Any) -> bool:
    """Whether ``block`` carries a ``cache_control`` object: one the summary call may move."""
    return isinstance(block, Mapping) and isinstance(block.get(CACHE_CONTROL), Mapping)


def marked_blocks(system: Any, tools: Any, messages: Sequence[Mapping[str, Any]]) -> int:
    """The :func:`marked` blocks of a request: its tools, its system blocks, its messages'
    content blocks and the blocks one level inside those (of any type). Unlike
    :func:`breakpoints`, a ``cache_control`` that is not an object, or sits on a message
    itself, is not counted: the count the summary call (``_summary.py``,
    ``with_end_breakpoint``) weighs its own end breakpoint against, in the terms of the marks
    it moves."""
    found = sum(1 for tool in blocks_of(tools) if marked(tool))
    found += sum(1 for block in blocks_of(system) if marked(block))
    for message in messages:
        for block in blocks_of(message.get("content")):
            found += marked(block)
            if isinstance(block, Mapping):
                found += sum(1 for inner in blocks_of(block.get("content")) if marked(inner))
    return found
