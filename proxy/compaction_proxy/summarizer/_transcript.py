"""Guards that turn a stretch of chat messages into summarizer input, and the chunked fold.

Summarizer calls fail in well-known ways when fed the raw conversation (peers' bug trackers are
full of them):
inlined images and base64 blobs blow the summary prompt up to millions of tokens, reasoning
blocks make models refuse or return nothing, one pasted log is larger than the summarizer's
whole window. So the summarizer never sees the client's dicts; it sees a plain-text transcript
built here:

* each message becomes a block: a ``[role name]`` header line, then its text; tool calls render
  as ``-> name(arguments)``, tool results are headed with the name of the call they answer;
* image parts, audio, files, ``data:`` URLs and long base64 runs become placeholders such as
  ``[image]`` or ``[binary data, 12345 bytes]``;
* text that rides beside a message's content (a format's ``blocks`` or ``items`` field: e.g.
  what a user wrote while a step's tools ran) is shown after it;
* reasoning/thinking (``reasoning_content``, ``reasoning``, ``thinking`` fields and content
  parts of type thinking/reasoning/redacted_thinking) is dropped whole, never edited;
* a block longer than ``max_message_chars`` keeps its head and tail around
  ``… [N characters elided] …``;
* blocks are packed into chunks that each fit the summarizer's own window, and several chunks
  are folded one after another, each into the summary so far (:func:`fold`).

Everything here is pure except :func:`fold`, which awaits the call it is given.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_proxy.compaction.message_text import (
    REASONING_PART_TYPES,
    RIDING_FIELDS,
    TEXT_PART_TYPES,
    call_names,
    call_text,
    content_text,
    elide,
    riding_parts,
    scrub_text,
    tool_calls,
)
from compaction_proxy.compaction.summarizer_contract import (
    CUT_MARK,
    SummaryError,
    is_cut,
    without_cut_mark,
)

from ._prompts import PromptSet, user_message

__all__ = [
    "REASONING_PART_TYPES",
    "RIDING_FIELDS",
    "TEXT_PART_TYPES",
    "SummarizerWindow",
    "TranscriptOptions",
    "call_names",
    "chunk_blocks",
    "elide",
    "fold",
    "plan_chunks",
    "render_blocks",
    "render_message",
    "scrub_text",
]

ENVELOPE_TOKENS = 16
"""Per-message chat overhead plus the tags around transcript and previous summary."""
MIN_CHUNK_TOKENS = 256
"""Below this a chunk cannot carry a useful stretch: the summarizer's window is too small."""


@dataclass(frozen=True, slots=True)
class TranscriptOptions:
    """Limits of the transcript. ``max_message_chars`` bounds one message's rendered text."""

    max_message_chars: int = 20_000
    max_tool_arguments_chars: int = 2_000
    max_url_chars: int = 200


SummaryCall = Callable[[str, str], Awaitable[str]]
"""One summarizer round trip: (system prompt, user message) -> summary text."""


# ------------------------------------------------------------------ rendering


def _header(message: Mapping[str, Any], names: Mapping[str, str]) -> str:
    role = message.get("role")
    role = role if isinstance(role, str) and role else "unknown"
    if role == "tool":
        call_id = message.get("tool_call_id")
        name = names.get(call_id) if isinstance(call_id, str) else None
        return f"[tool result: {name}]" if name else "[tool result]"
    if role == "function":
        name = message.get("name")
        return f"[tool result: {name}]" if isinstance(name, str) and name else "[tool result]"
    name = message.get("name")
    return f"[{role} {name}]" if isinstance(name, str) and name else f"[{role}]"


def render_message(
    message: Mapping[str, Any],
    names: Mapping[str, str] | None = None,
    options: TranscriptOptions | None = None,
) -> str:
    """One message as a transcript block (header line, then text and tool calls).

    Only role, name, content, tool calls, (for assistants) a refusal or audio marker, and the
    text parts riding in :data:`RIDING_FIELDS` are read, so reasoning fields are dropped by
    construction.
    """
    opts = options or TranscriptOptions()
    body_parts: list[str] = []
    text = content_text(message.get("content"), max_url_chars=opts.max_url_chars)
    if text:
        body_parts.append(text)
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        body_parts.append(f"[refusal] {scrub_text(refusal)}")
    if message.get("audio"):
        body_parts.append("[audio]")
    body_parts.extend(
        f"-> {call_text(f, opts.max_tool_arguments_chars)}" for f in tool_calls(message)
    )
    body_parts.extend(_riding_text(message))
    body = elide("\n".join(body_parts), opts.max_message_chars)
    header = _header(message, names or {})
    return f"{header}\n{body}" if body else header


def _riding_text(message: Mapping[str, Any]) -> list[str]:
    """The text parts riding beside the content (what the model read of them); anything else
    riding there is not shown to the summarizer."""
    lines: list[str] = []
    for part in riding_parts(message):
        if isinstance(part, Mapping) and part.get("type") in TEXT_PART_TYPES:
            text = part.get("text")
            if isinstance(text, str) and text.strip():
                lines.append(scrub_text(text))
    return lines


def render_blocks(
    messages: Sequence[Mapping[str, Any]], options: TranscriptOptions | None = None
) -> list[str]:
    """The stretch as transcript blocks, one per message, in order."""
    names = call_names(messages)
    return [render_message(m, names, options) for m in messages]


# ------------------------------------------------------------------ chunking

BLOCK_SEPARATOR = "\n\n"


def fit_block(block: str, budget_tokens: int, count_text: Callable[[str], int]) -> str:
    """``block`` elided further until it fits ``budget_tokens`` on its own."""
    tokens = count_text(block)
    while tokens > budget_tokens:
        # Shrink by the overshoot ratio with a 10% margin; converges in a few rounds.
        target = int(len(block) * budget_tokens / tokens * 0.9)
        if target < 16:
            return block[: max(budget_tokens, 1)]
        block = elide(block, target)
        tokens = count_text(block)
    return block


def chunk_blocks(
    blocks: Sequence[str], budgets: Callable[[int], int], count_text: Callable[[str], int]
) -> list[str]:
    """Blocks packed greedily, in order, into chunks; chunk ``n`` (from 0) holds at most
    ``budgets(n)`` tokens. A block never splits; one too large alone is elided to fit."""
    chunks: list[str] = []
    current: list[str] = []
    used = 0
    separator = count_text(BLOCK_SEPARATOR)
    for raw in blocks:
        budget = budgets(len(chunks))
        block = fit_block(raw, budget, count_text)
        cost = count_text(block) + (separator if current else 0)
        if current and used + cost > budget:
            chunks.append(BLOCK_SEPARATOR.join(current))
            budget = budgets(len(chunks))
            block = fit_block(raw, budget, count_text)
            current, used = [], 0
            cost = count_text(block)
        current.append(block)
        used += cost
    if current:
        chunks.append(BLOCK_SEPARATOR.join(current))
    return chunks


@dataclass(frozen=True, slots=True)
class SummarizerWindow:
    """What limits one summarizer call: the model's context window and the output limit, in
    the model's own tokens, and ``ratio``, how many of them one of ours is (the calibration
    measured from its ``usage``, compaction_proxy/summarizer/_sizing.py)."""

    context_window: int
    max_output_tokens: int
    safety_ratio: float = 0.05
    """Fraction of the window kept free: our tokenizer may not be the summarizer model's."""
    ratio: float = 1.0

    def input_budget(self, prompt_tokens: int, previous_tokens: int) -> int:
        """Tokens (ours) left for transcript in one call with this prompt and previous summary
        (ours): the window less its safety share and the output limit, in our tokens."""
        reserve = int(self.context_window * self.safety_ratio)
        room = self.context_window - reserve - self.max_output_tokens
        return (
            math.floor(room / max(self.ratio, 1e-9))
            - prompt_tokens
            - previous_tokens
            - ENVELOPE_TOKENS
        )


def plan_chunks(
    blocks: Sequence[str],
    previous_summary: str | None,
    prompts: PromptSet,
    window: SummarizerWindow,
    count_text: Callable[[str], int],
) -> list[str]:
    """Chunks for the fold: the first sized next to the given previous summary (if any), the
    later ones next to the summary so far, which is at most ``max_output_tokens`` long."""
    previous_tokens = count_text(previous_summary) if previous_summary is not None else 0
    first = window.input_budget(
        count_text(prompts.system_prompt(previous_summary)), previous_tokens
    )
    # The summary so far is at most the output limit, in the model's tokens: fewer of ours.
    written = math.ceil(window.max_output_tokens / max(window.ratio, 1e-9))
    later = window.input_budget(count_text(prompts.update), max(previous_tokens, written))

    def budgets(index: int) -> int:
        budget = first if index == 0 else later
        if budget < MIN_CHUNK_TOKENS:
            raise SummaryError(
                "error",
                f"the summarizer's window ({window.context_window} tokens, "
                f"{window.max_output_tokens} reserved for output) leaves {budget} tokens for "
                "the conversation; use a summarizer model with a larger window or lower "
                "maxSummaryTokens",
            )
        return budget

    return chunk_blocks(blocks, budgets, count_text)


async def fold(
    chunks: Sequence[str], previous_summary: str | None, prompts: PromptSet, call: SummaryCall
) -> str:
    """Summarize chunk by chunk: the first with the checkpoint prompt (or the update prompt
    over ``previous_summary``), each later one with the update prompt over the summary so far.
    A failing call raises its :class:`SummaryError`; no partial summary is returned. A chunk's
    summary cut at its limit is folded on without its mark, which the result then ends with."""
    if not chunks:
        raise SummaryError("empty", "nothing to summarize: the stretch has no messages")
    summary = previous_summary
    cut = False
    for chunk in chunks:
        summary = await call(prompts.system_prompt(summary), user_message(chunk, summary))
        cut = cut or is_cut(summary)
        summary = without_cut_mark(summary)
    assert summary is not None
    return f"{summary}\n\n{CUT_MARK}" if cut else summary
