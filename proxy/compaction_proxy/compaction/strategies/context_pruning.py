"""Context pruning: soft-trim, then hard-clear, large tool results by their age.

LibreChat (``@librechat/agents`` ``contextPruning.ts``) semantics:

* **Age by position**: ``age = (N - i) / N`` over the message array (system messages
  included); the oldest message has age 1.0, the newest 1/N.
* **Protected**: everything before the first user message (so a leading system prompt), and
  the last ``keepLastAssistants`` assistant steps (an assistant message and the tool results
  after it, counted backwards from the end) together with everything after the oldest of
  them.
* **Candidates**: tool results (``tool``, and legacy ``function``, messages answering a call)
  whose content length is at least ``minPrunableToolChars`` -- per result, not a total.
* **Hard clear** when ``age >= hardClearRatio`` and ``hardClear.enabled``: the message is
  copied with its content replaced by ``hardClear.placeholder``; ``tool_call_id``, ``name`` and
  every other field are kept.
* **Soft trim** when ``age >= softTrimRatio`` and the length exceeds ``softTrim.maxChars``:
  ``head + "\\n\\n… [soft-trimmed: {len} chars → {head+tail} chars, middle removed] …\\n\\n" +
  tail`` with ``headChars`` / ``tailChars`` characters (``maxChars`` is only the threshold).
* Array content: its text parts are measured and trimmed together (joined by ``"\\n"``) and
  replaced by one text part that keeps the extra keys (e.g. ``cache_control``) of the last text
  part.  Content with a non-text part (an image, audio, a file) is never hard-cleared; once it
  is old enough for a soft trim its text parts are trimmed and the other parts kept in place.

``softTrim`` and ``hardClear`` are honoured (LibreChat's config schema silently drops them).

Trigger and target.  LibreChat applies pruning on every model call with no pressure gate.
Position-based aging re-run on every request moves its cut each turn (as the conversation
grows, every old result ages) and so changes the forwarded prefix each turn, which defeats the
upstream prompt cache.  Here pruning is a strategy like any other: it runs only when its
trigger fires (default ``over_budget``; in the default pipeline the pipeline's ``token_ratio:
0.8``), and it walks the candidates oldest first, re-checking its target before each edit
(default: no target, i.e. prune every eligible result once triggered -- LibreChat's shape; the
default pipeline compacts towards ``token_ratio: 0.5``).  The hysteresis between the trigger and
the target, and later the checkpoints (see "Checkpoints" in
compaction_proxy/checkpoints/README.md), keep the
prefix stable between compactions.

Idempotence (one of the invariants in "Groups and invariants",
compaction_proxy/compaction/README.md).  A result that
already carries the placeholder, or the soft-trim marker, is recognised: a cleared result is left
alone; a trimmed one is never trimmed again and can only be hard-cleared (its original length, read
back from the marker, decides whether it is still a candidate).  Ages only depend on positions,
which pruning does not change, so a second run over the output finds nothing left to do.

Deliberate differences from LibreChat:

* pruning runs when its trigger fires, not on every call, and stops at its target;
* it runs alongside (before) summarization, not only when summarization is off;
* ``keepLastAssistants`` counts steps, not runs of assistant/tool messages: in an agent loop
  (one task, then hundreds of tool steps) LibreChat's single run would protect the whole
  loop;
* ``keepLastAssistants: 0`` protects no assistant step (LibreChat still protects the newest
  run, because it marks a message before counting runs); the newest user message and the
  newest step are always protected anyway (see "Groups and invariants" in
  compaction_proxy/compaction/README.md);
* system/developer messages are never edited wherever they are, and orphan results (answering
  no call) are left exactly as sent;
* lengths and slices count Unicode code points (JavaScript counts UTF-16 code units), so a
  character outside the BMP never gets split;
* a soft trim is applied only when it makes the text shorter, and a hard clear only when the
  placeholder is shorter than the text (LibreChat would also apply a trim or clear that grows
  it, e.g. when ``headChars + tailChars`` exceeds the length);
* ``minimum_preserved`` (our floor, default 0) additionally protects the newest N non-system
  groups.
"""

from __future__ import annotations

import re
from typing import Any, Unpack

from pydantic import ConfigDict, Field

from ..chat_messages import Message, role_of
from ..draft import Draft
from ..fields import CamelModel
from ..marks import strip_mark
from ..triggers import Always, Condition, Never
from ..view import GroupKind
from ._support.tool_results import (
    all_text,
    answered_results,
    is_text_part,
    joined_text,
    newest_non_system,
    text_part_like,
)
from .base import Conditions, Strategy, StrategyContext, StrategyOutcome
from .params import BuildContext, StrategyParams

DEFAULT_PLACEHOLDER = "[Old tool result content cleared]"
SOFT_TRIM_MARKER = "\n\n… [soft-trimmed: {original} chars → {kept} chars, middle removed] …\n\n"
_MARKER_RE = re.compile(r"\n\n… \[soft-trimmed: (\d+) chars → (\d+) chars, middle removed\] …\n\n")
_TOOL_GROUPS = frozenset({GroupKind.TOOL_CALL})


class SoftTrimSettings(CamelModel):
    """Soft trim: keep ``headChars`` + marker + ``tailChars`` of results over ``maxChars``."""

    max_chars: int = Field(default=4000, ge=0)
    head_chars: int = Field(default=1500, ge=0)
    tail_chars: int = Field(default=1500, ge=0)


class HardClearSettings(CamelModel):
    """Hard clear: replace old results with ``placeholder`` (``tool_call_id`` kept)."""

    enabled: bool = True
    placeholder: str = DEFAULT_PLACEHOLDER


class ContextPruningSettings(CamelModel):
    """LibreChat's ``contextPruning`` keys, defaults and ranges (``summarization.contextPruning``
    and, with the keys every entry takes, the ``context_pruning`` pipeline entry).

    ``enabled`` defaults to true (LibreChat: false, because there pruning and summarization
    exclude each other; here pruning runs first and makes summaries rarer and cheaper).
    """

    enabled: bool = True
    keep_last_assistants: int = Field(default=3, ge=0, le=10)
    soft_trim_ratio: float = Field(default=0.3, ge=0, le=1)
    hard_clear_ratio: float = Field(default=0.5, ge=0, le=1)
    min_prunable_tool_chars: int = Field(default=50_000, ge=0)
    soft_trim: SoftTrimSettings = SoftTrimSettings()
    hard_clear: HardClearSettings = HardClearSettings()


class ContextPruningParams(ContextPruningSettings, StrategyParams):
    """``strategy: context_pruning``: LibreChat's block as is (snake_case or camelCase keys),
    so the entry and ``summarization.contextPruning`` accept the same keys, defaults and
    ranges; ``enabled: false`` keeps the entry but never fires it.  Like every entry, it is
    written back with snake_case keys."""

    model_config = ConfigDict(serialize_by_alias=False)

    def arguments(self, ctx: BuildContext) -> dict[str, Any]:
        # The strategy takes the two nested blocks flat, and is off by never firing.
        arguments = super().arguments(ctx)
        del arguments["enabled"], arguments["soft_trim"], arguments["hard_clear"]
        if not self.enabled:
            arguments["trigger"] = Never()
        return {
            **arguments,
            "soft_trim_max_chars": self.soft_trim.max_chars,
            "soft_trim_head_chars": self.soft_trim.head_chars,
            "soft_trim_tail_chars": self.soft_trim.tail_chars,
            "hard_clear_enabled": self.hard_clear.enabled,
            "placeholder": self.hard_clear.placeholder,
        }


def soft_trim(text: str, head: int, tail: int) -> str:
    """``text`` cut to ``head`` + marker + ``tail`` characters (no length checks)."""
    length = len(text)
    marker = SOFT_TRIM_MARKER.format(original=length, kept=head + tail)
    return text[:head] + marker + (text[length - tail :] if tail > 0 else "")


def trimmed_original_length(text: str) -> int | None:
    """The original length recorded by a soft-trim marker in ``text``, if any."""
    match = _MARKER_RE.search(text)
    return int(match.group(1)) if match else None


def assistant_protection_start(
    messages: tuple[Message, ...] | list[Message], keep_last_assistants: int
) -> int:
    """Index from which the last ``keep_last_assistants`` assistant steps are protected.

    A step is one assistant message with the tool results that follow it.  LibreChat counts
    maximal runs of assistant/tool messages instead, but in an agent loop the whole turn after
    the task is one run, so ``keepLastAssistants: 3`` would protect every step of it and
    nothing could ever be pruned; counting steps keeps the newest three tool rounds intact and
    lets the older ones age.  With fewer steps than asked, everything is protected (0); with
    0, nothing (``len(messages)``).
    """
    size = len(messages)
    if keep_last_assistants <= 0:
        return size
    steps = 0
    for index in range(size - 1, -1, -1):
        if role_of(messages[index]) == "assistant":
            steps += 1
            if steps >= keep_last_assistants:
                return index
    return 0


class ContextPruningStrategy(Strategy):
    """LibreChat's soft-trim / hard-clear of old tool results (see the module docstring)."""

    name = "context_pruning"
    position_aged = True

    def __init__(
        self,
        *,
        keep_last_assistants: int = 3,
        soft_trim_ratio: float = 0.3,
        hard_clear_ratio: float = 0.5,
        min_prunable_tool_chars: int = 50_000,
        soft_trim_max_chars: int = 4000,
        soft_trim_head_chars: int = 1500,
        soft_trim_tail_chars: int = 1500,
        hard_clear_enabled: bool = True,
        placeholder: str = DEFAULT_PLACEHOLDER,
        **conditions: Unpack[Conditions],
    ) -> None:
        super().__init__(**conditions)
        for label, ratio in (
            ("soft_trim_ratio", soft_trim_ratio),
            ("hard_clear_ratio", hard_clear_ratio),
        ):
            if not 0 <= ratio <= 1:
                raise ValueError(f"{label} must be between 0 and 1")
        for label, count in (
            ("keep_last_assistants", keep_last_assistants),
            ("min_prunable_tool_chars", min_prunable_tool_chars),
            ("soft_trim_max_chars", soft_trim_max_chars),
            ("soft_trim_head_chars", soft_trim_head_chars),
            ("soft_trim_tail_chars", soft_trim_tail_chars),
        ):
            if count < 0:
                raise ValueError(f"{label} must be >= 0")
        self.keep_last_assistants = keep_last_assistants
        self.soft_trim_ratio = soft_trim_ratio
        self.hard_clear_ratio = hard_clear_ratio
        self.min_prunable_tool_chars = min_prunable_tool_chars
        self.max_chars = soft_trim_max_chars
        self.head_chars = soft_trim_head_chars
        self.tail_chars = soft_trim_tail_chars
        self.hard_clear_enabled = hard_clear_enabled
        self.placeholder = placeholder

    def default_target(self) -> Condition | None:
        # Once triggered, prune every eligible result (LibreChat's shape) unless a target is set.
        return Always() if self._trigger is None else None

    # ------------------------------------------------------------------ selection
    def candidates(self, draft: Draft) -> list[int]:
        """Indices of answered tool results outside the protected regions, oldest first."""
        messages = draft.view.messages
        first_user = next(
            (i for i, m in enumerate(messages) if role_of(m) == "user"), len(messages)
        )
        end = assistant_protection_start(messages, self.keep_last_assistants)
        floor = newest_non_system(draft, self.minimum_preserved)
        out: list[int] = []
        for group in draft.removable(_TOOL_GROUPS):
            if group.index in floor or group.last <= first_user or group.first >= end:
                continue
            if not any(self._may_prune(draft.message(i)) for i in group.members[1:]):
                continue  # cheap pre-check before pairing the group's results
            out.extend(
                r.index for r in answered_results(draft, group) if first_user < r.index < end
            )
        out.sort()
        return out

    def _may_prune(self, message: Message) -> bool:
        """A cheap upper bound: could this message be a candidate at all?"""
        if role_of(message) not in ("tool", "function"):
            return False
        content = message.get("content")
        if isinstance(content, str):  # a trimmed result counts with its original length
            return len(content) >= self.min_prunable_tool_chars or "[soft-trimmed: " in content
        return isinstance(content, list)

    def pruned(self, message: Message, age: float) -> Message | None:
        """The pruned form of ``message`` at ``age``, or ``None`` when it stays as it is."""
        content = message.get("content")
        text = all_text(content)
        if text is not None:
            parts = content if isinstance(content, list) else None
            return self._prune_text(message, text, age, parts)
        if not isinstance(content, list):
            return None
        return self._prune_mixed(message, content, age)

    def _prune_text(
        self, message: Message, text: str, age: float, parts: list[Any] | None
    ) -> Message | None:
        if strip_mark(text) == self.placeholder:  # cleared already (with recall: and marked)
            return None
        original = trimmed_original_length(text)
        length = original if original is not None else len(text)
        if length < self.min_prunable_tool_chars:
            return None
        if (
            age >= self.hard_clear_ratio
            and self.hard_clear_enabled
            and len(self.placeholder) < len(text)
        ):
            return {**message, "content": self.placeholder}
        if original is None and age >= self.soft_trim_ratio and length > self.max_chars:
            trimmed = soft_trim(text, self.head_chars, self.tail_chars)
            if len(trimmed) < length:
                return {
                    **message,
                    "content": trimmed if parts is None else [text_part_like(parts, trimmed)],
                }
        return None

    def _prune_mixed(self, message: Message, parts: list[Any], age: float) -> Message | None:
        text = joined_text(parts)
        if trimmed_original_length(text) is not None or age < self.soft_trim_ratio:
            return None
        length = len(text)
        if length < self.min_prunable_tool_chars or length <= self.max_chars:
            return None
        trimmed = soft_trim(text, self.head_chars, self.tail_chars)
        if len(trimmed) >= length:
            return None
        text_parts = [p for p in parts if is_text_part(p)]
        new_parts: list[Any] = []
        placed = False
        for part in parts:
            if not is_text_part(part):
                new_parts.append(part)
            elif not placed:
                new_parts.append(text_part_like(text_parts, trimmed))
                placed = True
        return {**message, "content": new_parts}

    # ------------------------------------------------------------------ apply
    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        size = len(draft.view.messages)
        cleared = trimmed = 0
        for index in self.candidates(draft):
            message = draft.message(index)
            new = self.pruned(message, (size - index) / size)
            if new is None:
                continue
            if not self.keep_going(draft, ctx):
                break
            if not draft.edit(index, new):
                continue  # recall on: a stub's own form again, or a mark that frees nothing
            if new.get("content") == self.placeholder:
                cleared += 1
            else:
                trimmed += 1
        notes = []
        if trimmed:
            notes.append(f"soft-trimmed {trimmed} tool result(s)")
        if cleared:
            notes.append(f"hard-cleared {cleared} tool result(s)")
        return StrategyOutcome(changed=bool(cleared or trimmed), notes=tuple(notes))
