"""The last resort: soft-trim a tool result that alone keeps the request over budget.

An agent's newest step is protected (see "Groups and invariants" in
compaction_proxy/compaction/README.md): the
model must read what the tool
just returned.  But when that result is a 200k-token log, forwarding it whole only earns the
upstream's refusal, and the agent's session ends there.  So, once everything else that may go
has gone (the fallback truncation ran and nothing is left to drop) and the request still does
not fit, the largest tool results are cut to head + marker + tail, the same marker
``context_pruning`` writes, until the request fits.  User and system text is never cut: a
request whose task alone exceeds the window goes upstream as it is, and the upstream says so.

This is not a configurable strategy; the pipeline runs it after the fallback and the report
carries a warning naming what was trimmed, which the edge turns into ``X-Compaction-Warning``.
Idempotent: the trimmed request fits, so a second run finds nothing over budget.
"""

from __future__ import annotations

import math
from typing import Any

from ...chat_messages import Message
from ...draft import Draft
from ...view import GroupKind
from ..base import Strategy, StrategyContext, StrategyOutcome
from ..context_pruning import soft_trim, trimmed_original_length
from .tool_results import all_text, answered_results, text_part_like

MIN_KEPT_CHARS = 400
"""Characters a trimmed result keeps at least (head and tail together): enough for the
model to see what the tool returned and where it ended."""

_ATTEMPTS = 8
_MARGIN_TOKENS = 32  # the marker and rounding


class OversizedResultTrim(Strategy):
    """Trim the largest tool results, head + marker + tail, until the request fits."""

    name = "last_resort_trim"

    def should_run(self, draft: Draft, ctx: StrategyContext) -> bool:
        return draft.over_budget() and not any(True for _ in draft.removable())

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        trimmed: list[str] = []
        tried: set[int] = set()
        while draft.over_budget():
            index = _largest_result(draft, tried)
            if index is None:
                break
            tried.add(index)
            before = draft.message_stats(index).token_count
            if _trim_to_fit(draft, index):
                after = draft.message_stats(index).token_count
                trimmed.append(f"message {index} ({before} -> {after} tokens)")
        if not trimmed:
            return StrategyOutcome(changed=False, notes=("no tool result left to trim",))
        warning = (
            "a tool result too large for the window was soft-trimmed to head + tail, "
            f"nothing else being left to compact: {', '.join(trimmed)}"
        )
        return StrategyOutcome(
            changed=True,
            notes=(f"soft-trimmed {len(trimmed)} oversized tool result(s)",),
            warnings=(warning,),
        )


def _largest_result(draft: Draft, tried: set[int]) -> int | None:
    """The kept tool result with the most tokens that can still be trimmed.

    Only results that answer a call: an orphan result stays exactly as the client sent it.
    """
    best: tuple[int, int] | None = None
    for group in draft.groups:
        if group.kind is not GroupKind.TOOL_CALL or not draft.is_kept(group):
            continue
        for result in answered_results(draft, group):
            index = result.index
            if index in tried:
                continue
            text = all_text(draft.message(index).get("content"))
            if text is None or len(text) <= MIN_KEPT_CHARS:
                continue
            tokens = draft.message_stats(index).token_count
            if best is None or tokens > best[0]:
                best = (tokens, index)
    return None if best is None else best[1]


def _trim_to_fit(draft: Draft, index: int) -> bool:
    """Cut message ``index`` just enough to fit the budget (or to the minimum); True if cut."""
    original = draft.message(index)
    text = all_text(original.get("content"))
    if text is None:
        return False
    if trimmed_original_length(text) is not None:
        return False  # already trimmed once: never stack markers
    length = len(text)
    tokens = max(1, draft.message_stats(index).token_count)
    ratio = draft.calibration.effective
    limit_raw = math.floor(draft.budget.limit / ratio)
    excess = draft.prompt_tokens - limit_raw
    keep_tokens = tokens - excess - _MARGIN_TOKENS
    keep = max(MIN_KEPT_CHARS, int(length * keep_tokens / tokens)) if keep_tokens > 0 else 0
    keep = max(MIN_KEPT_CHARS, keep)
    changed = False
    for _ in range(_ATTEMPTS):
        if keep >= length:
            break
        head = keep // 2
        trimmed = _with_text(original, soft_trim(text, head, keep - head))
        changed = draft.trim_newest(index, trimmed) or changed
        if not draft.over_budget() or keep <= MIN_KEPT_CHARS:
            break
        keep = max(MIN_KEPT_CHARS, keep * 3 // 4)
    return changed


def _with_text(message: Message, text: str) -> dict[str, Any]:
    """``message`` with ``text`` as its content, every other field kept."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [text_part_like(content, text)]}
    return {**message, "content": text}
