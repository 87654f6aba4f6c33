"""Cache-aligned summary calls: the forwarded request's own prefix plus one instruction.

A summary call in the transcript form (:mod:`._transcript`) is a new prompt the upstream has
never seen: every token of the stretch is read at full price. When the summarizer is the
request's own upstream and model, the upstream has just read (and cached) the very messages
being folded, as part of the chat requests that carried them. So the call is built as that
request's prefix -- its messages from the start to the stretch's last message, the same dicts in
the same order, and its ``tools`` -- followed by one user message with our instruction (the
checkpoint or update prompt; when updating, the previous checkpoint goes there too). The
upstream's prompt cache then serves the whole conversation part of the input.

When it applies (``summarization.reusePrefix``):

* ``never``: never; the transcript form, as before.
* ``auto`` (default): the summarizer is the request's own upstream and model (a different model
  or provider has no cache for this prefix, and the transcript is far cheaper there), the
  prefix holds no binary content (image, audio or file parts, ``data:`` URLs, long base64
  runs: the transcript guards turn those into placeholders, whereas the prefix would make the
  summarizer pay for them again, at full price whenever the cache has expired), and the
  prefix fits the summarizer's window.
* ``always``: whenever the prefix fits the summarizer's window, whatever the model and content.

The stretch is placed in the request message by message (the same dict, an equal one, or, for
a message an earlier strategy trimmed, the tool result or tool call with the same ids); the
prefix ends just past the last one found, and stretch messages after it that an earlier
strategy made up (a collapsed ``[Tool results: ...]``) follow in the core's form, after the
cached part. In every mode the transcript form is used when no stretch message is found. Fit
is counted with the summarizer's own tokenizer: prefix, tools, instruction and output limit
within the window less its safety share. The prefix is sent in one call, never chunked.

``tool_choice``: the request's own value is kept when it lets the model answer in text
(absent, ``auto``, ``none``); one that forces a tool call becomes ``none``. The instruction also
says not to call tools; a reply with tool calls and no text is an ``empty`` summary.

A format whose view is not chat completions (the Messages API) places the stretch the same way,
in its view's messages, and its call maps the prefix back to the client's own messages and
sends them with its own ``system`` and ``tools`` (``ForwardedRequest.native``,
compaction_proxy/wire/messages/_summary.py). Binary content there includes ``document``
blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_proxy.compaction.tokens import Tokenizer
from compaction_proxy.wire import NativeRequest

from ._prompts import PromptSet
from ._transcript import SummarizerWindow, scrub_text

PREFIX_MARKER = "[compaction-proxy: checkpoint request]"
"""The first line of the instruction that ends a prefix-form summary call (tests and fakes
recognise the call by it)."""

PREFIX_FRAMING = """\
The messages above are the conversation to record; this message is not part of it. Do not \
answer, continue or act on that conversation and call no tools: write the checkpoint the \
instructions below describe. Where they speak of <conversation>, they mean the messages above."""

BINARY_PART_TYPES = frozenset(
    {"image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "document"}
)


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """What a bound summarizer knows of the request it works for: the chat-shaped messages and
    ``tools`` as the request goes upstream (the effective view), its ``tool_choice``, and the
    name of the upstream it goes to.

    ``native``: the request in its own format's form, for a format whose summary call writes
    the prefix itself (``SummaryCall.prefix``, the Messages API): the stretch is placed in
    ``messages`` (the format's view), and the call maps that prefix back to the client's own
    messages and sends them with the client's ``system`` and ``tools``. None: ``messages`` are
    chat completions (a chat request), sent as they are."""

    messages: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]] | None = None
    tool_choice: Any = None
    upstream: str | None = None
    functions: Sequence[dict[str, Any]] | None = None
    """Legacy ``functions``, sent along as they are when present."""
    native: NativeRequest | None = None

    @classmethod
    def from_body(
        cls,
        body: Mapping[str, Any],
        upstream: str | None = None,
        native: NativeRequest | None = None,
    ) -> ForwardedRequest:
        messages = body.get("messages")
        tools = body.get("tools")
        functions = body.get("functions")
        return cls(
            messages=messages if isinstance(messages, list) else [],
            tools=tools if isinstance(tools, list) and tools else None,
            tool_choice=body.get("tool_choice"),
            upstream=upstream,
            functions=functions if isinstance(functions, list) and functions else None,
            native=native,
        )


def instruction(prompts: PromptSet, previous_summary: str | None) -> str:
    """The final user message of a prefix-form call."""
    parts = [
        PREFIX_MARKER,
        PREFIX_FRAMING,
        f"<instructions>\n{prompts.system_prompt(previous_summary)}\n</instructions>",
    ]
    if previous_summary is not None:
        parts.append(f"<previous-checkpoint>\n{previous_summary}\n</previous-checkpoint>")
    return "\n\n".join(parts)


def _ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    """The tool-call ids a message answers or makes (for matching a trimmed edit)."""
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        return ("result", call_id)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
        if ids and all(isinstance(i, str) for i in ids):
            return ("call", *(str(i) for i in ids))
    return ()


def place_stretch(
    messages: Sequence[dict[str, Any]], stretch: Sequence[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The messages to send before the instruction, or ``None`` when the stretch is not found.

    ``messages[:end]``, where ``end`` is just past the last stretch message found in
    ``messages``, followed by the stretch messages after that one (ones an earlier strategy
    made up, such as a collapsed ``[Tool results: ...]``, in the core's form: the cache still
    serves everything before them).
    """
    end = stretch_end(messages, stretch)
    if end is None:
        return None
    position, placed = end
    return [*messages[:position], *stretch[placed:]]


def stretch_end(
    messages: Sequence[Mapping[str, Any]], stretch: Sequence[Mapping[str, Any]]
) -> tuple[int, int] | None:
    """(index just past the last stretch message found in ``messages``, how many stretch
    messages up to that one), or ``None`` when none is found.

    The stretch is the core's form of the folded messages: mostly the request's own dicts,
    some possibly edited by an earlier strategy. Its messages are matched in order (the same
    object, else an equal dict, else a tool result or call with the same ids), so a repeated
    short message ("ok") is placed after the ones before it.
    """
    cursor = 0
    found: tuple[int, int] | None = None
    for number, wanted in enumerate(stretch, start=1):
        index = _find(messages, wanted, cursor)
        if index is None:
            continue
        cursor = index + 1
        found = (cursor, number)
    return found


def _find(
    messages: Sequence[Mapping[str, Any]], wanted: Mapping[str, Any], start: int
) -> int | None:
    for index in range(start, len(messages)):
        if messages[index] is wanted:
            return index
    for index in range(start, len(messages)):
        if messages[index] == wanted:
            return index
    ids = _ids(wanted)
    if ids:
        role = wanted.get("role")
        for index in range(start, len(messages)):
            candidate = messages[index]
            if candidate.get("role") == role and _ids(candidate) == ids:
                return index
    return None


def has_binary(messages: Sequence[Mapping[str, Any]]) -> bool:
    """True when a message carries what the transcript guards replace: image, audio or file
    parts, ``data:`` URLs or long base64 runs."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            if _binary_text(content):
                return True
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    if _binary_text(part):
                        return True
                    continue
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") in BINARY_PART_TYPES:
                    return True
                text = part.get("text")
                if isinstance(text, str) and _binary_text(text):
                    return True
        if message.get("audio"):
            return True
    return False


def _binary_text(text: str) -> bool:
    # a base64 run is at least 200 characters; scrubbing is the transcript's own test
    return ("data:" in text or len(text) >= 200) and scrub_text(text) != text


def prefix_tokens(
    prefix: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tokenizer: Tokenizer,
) -> int:
    """The prefix's prompt tokens (messages with their envelope, plus the tools schema)."""
    return sum(tokenizer.count_message(m) for m in prefix) + tokenizer.count_tools(tools)


def fits(
    prefix: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    final: str,
    window: SummarizerWindow,
    tokenizer: Tokenizer,
) -> bool:
    """True when prefix, tools and ``final`` leave the output limit and the safety share free."""
    final_tokens = tokenizer.count_message({"role": "user", "content": final})
    budget = window.input_budget(final_tokens, 0)
    return prefix_tokens(prefix, tools, tokenizer) + tokenizer.reply_priming <= budget


def tool_choice_for(value: Any) -> Any:
    """The ``tool_choice`` to send: the request's own when it allows a text answer, else
    ``none`` (``None``: leave the field out)."""
    if value is None or value in ("auto", "none"):
        return value
    return "none"
