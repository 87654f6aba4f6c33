"""A message's content as plain text: what the summarizer's transcript and a recall answer show.

Both turn a chat message (a client's, or one a format's adapter lifted) into text a model
reads: text parts as they are, tool calls as ``name(arguments)``, the parts that are not text
named (``[image]``, ``[audio]``, ``[file: report.pdf]``), ``data:`` URLs and long base64 runs
replaced by a placeholder (binary the model could not read anyway), and the text parts a format
carries beside the content (Anthropic's blocks after a step's tool results, Responses items of
unknown types, in a ``blocks`` or ``items`` field). The two callers differ only in what they
bound: the transcript elides long text to fit a summarizer's window, a recall answer is paged
instead and shows everything. So the pieces live here, in the core, once, and each caller
composes its own block (``compaction_proxy/summarizer/_transcript.py``,
:mod:`.recall_text`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .canonical import json_text

__all__ = [
    "REASONING_PART_TYPES",
    "RIDING_FIELDS",
    "TEXT_PART_TYPES",
    "call_names",
    "call_text",
    "content_text",
    "elide",
    "part_text",
    "riding_parts",
    "scrub_text",
    "tool_calls",
]

REASONING_PART_TYPES = frozenset({"thinking", "reasoning", "redacted_thinking"})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
RIDING_FIELDS = ("blocks", "items")
"""Fields in which a format's adapter carries content the core has no field for (Anthropic's
blocks after a step's tool results, such as a user's note queued while tools ran; Responses
items of unknown types): their text parts are part of what the model read."""

_DATA_URL = re.compile(
    r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w.+-]+=[\w.+-]+)*)(;base64)?,([A-Za-z0-9+/=_%-]*)"
)
# A run of the base64 alphabet this long is not prose (200 chars is ~150 bytes of binary);
# it must also mix many symbols, so a ruler of dashes or a long word survives.
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{200,}={0,2}")
_BASE64_MIN_DISTINCT = 12
MAX_URL_CHARS = 200
"""An image URL longer than this is shown as ``[image]`` (a signed URL is noise to a model)."""


def _binary_placeholder(media_type: str | None, payload_chars: int) -> str:
    if media_type and media_type.startswith("image/"):
        return "[image]"
    return f"[binary data, {payload_chars * 3 // 4} bytes]"


def scrub_text(text: str) -> str:
    """``text`` with ``data:`` URLs and long base64 runs replaced by placeholders."""

    def data_url(match: re.Match[str]) -> str:
        return _binary_placeholder(match.group(1), len(match.group(4)))

    def base64_run(match: re.Match[str]) -> str:
        run = match.group(0)
        if len(set(run)) < _BASE64_MIN_DISTINCT:
            return run
        return f"[binary data, {len(run) * 3 // 4} bytes]"

    if "data:" in text:
        text = _DATA_URL.sub(data_url, text)
    return _BASE64_RUN.sub(base64_run, text)


def elide(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars``: its head and tail around an elision marker.

    Head and tail both survive because a long tool result or log usually states what it is at
    the top and how it ended at the bottom.
    """
    if len(text) <= max_chars:
        return text
    keep = max(max_chars, 2)
    head = keep * 3 // 5
    tail = keep - head
    removed = len(text) - head - tail
    return f"{text[:head]}\n… [{removed} characters elided] …\n{text[len(text) - tail :]}"


def part_text(
    part: object, *, max_url_chars: int = MAX_URL_CHARS, reasoning: str | None = None
) -> str | None:
    """One content part as text. A reasoning part is ``reasoning`` (None: dropped, what the
    transcript does, since reasoning blocks make summarizers refuse)."""
    if isinstance(part, str):
        return scrub_text(part)
    if not isinstance(part, Mapping):
        return scrub_text(json_text(part))
    kind = part.get("type")
    if kind in REASONING_PART_TYPES:
        return reasoning
    if kind in TEXT_PART_TYPES:
        text = part.get("text")
        return scrub_text(text) if isinstance(text, str) else ""
    if kind == "refusal":
        refusal = part.get("refusal")
        return f"[refusal] {scrub_text(refusal)}" if isinstance(refusal, str) else "[refusal]"
    if kind in ("image_url", "input_image", "image"):
        return _image_placeholder(part, max_url_chars)
    if kind in ("input_audio", "audio"):
        return "[audio]"
    if kind in ("file", "input_file"):
        file = part.get("file")
        name = file.get("filename") if isinstance(file, Mapping) else part.get("filename")
        return f"[file: {name}]" if isinstance(name, str) and name else "[file]"
    return f"[{kind} content]" if isinstance(kind, str) else "[content]"


def _image_placeholder(part: Mapping[str, Any], max_url_chars: int) -> str:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if (
        isinstance(url, str)
        and url.startswith(("http://", "https://"))
        and len(url) <= max_url_chars
    ):
        return f"[image: {url}]"
    return "[image]"


def content_text(
    content: object, *, max_url_chars: int = MAX_URL_CHARS, reasoning: str | None = None
) -> str:
    """A message's ``content`` (a string, a list of parts, or null) as text, parts on lines:
    every part shown (non-text ones named), ``data:`` URLs and base64 runs scrubbed. (The
    text parts alone, as written, are :func:`.messages.text_only`.)"""
    if content is None:
        return ""
    if isinstance(content, str):
        return scrub_text(content)
    if isinstance(content, list):
        texts = (part_text(p, max_url_chars=max_url_chars, reasoning=reasoning) for p in content)
        return "\n".join(t for t in texts if t)
    return scrub_text(json_text(content))


def tool_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The functions a message calls (``tool_calls[].function`` or ``.custom``, the legacy
    ``function_call``), in order."""
    found: list[Mapping[str, Any]] = []
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            function = call.get("function") or call.get("custom")
            if isinstance(function, Mapping):
                found.append(function)
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        found.append(legacy)
    return found


def call_text(function: Mapping[str, Any], max_arguments_chars: int | None = None) -> str:
    """One call as ``name(arguments)``; ``max_arguments_chars`` elides long arguments."""
    name = function.get("name")
    arguments = function.get("arguments", function.get("input", ""))
    if not isinstance(arguments, str):
        arguments = json_text(arguments)
    arguments = scrub_text(arguments)
    if max_arguments_chars is not None:
        arguments = elide(arguments, max_arguments_chars)
    return f"{name if isinstance(name, str) else '?'}({arguments})"


def call_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Tool call id -> function name over ``messages``, so results can say what they answer."""
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            function = call.get("function") or call.get("custom")
            call_id = call.get("id")
            if isinstance(call_id, str) and isinstance(function, Mapping):
                name = function.get("name")
                if isinstance(name, str):
                    names[call_id] = name
    return names


def riding_parts(message: Mapping[str, Any]) -> list[object]:
    """The parts riding in the message's :data:`RIDING_FIELDS`, in order."""
    parts: list[object] = []
    for field_name in RIDING_FIELDS:
        riding = message.get(field_name)
        if isinstance(riding, list):
            parts.extend(riding)
    return parts
