"""Clear tool uses: Anthropic's ``clear_tool_uses_20250919`` context edit, client-side.

Semantics (Anthropic's documented context edit; LangChain's ``ClearToolUsesEdit`` mirrors it):

* ``keep`` (default 3): the newest N answered tool results (by position, cleared or excluded
  ones included) are never cleared;
* every older result is a candidate, oldest first, unless its tool's name is in
  ``exclude_tools``; its content becomes ``placeholder`` (default ``[Old tool result content
  cleared]``); ``tool_call_id``, ``name`` and every other field are kept, so pairing is intact;
* ``clear_tool_inputs``: the calls whose results are cleared also get their ``arguments``
  replaced by ``"{}"`` -- still a valid JSON object string, as OpenAI requires; the call's
  ``id``, ``type`` and ``name`` are kept;
* ``clear_at_least`` (tokens, default 0): the cache-friendly guard.  The plan (the edits the
  strategy would make) is computed first; if it would clear fewer than this many tokens, the
  strategy changes nothing, because an edit in the middle of the prompt invalidates the
  upstream prompt cache from that point on and is only worth it when it frees enough.

Trigger and target: the trigger defaults to the pipeline's (``over_budget``; Anthropic's own
default is ``{input_tokens: 100000}``, write ``trigger: {tokens_exceed: 100000}`` for it).
Once triggered it clears every candidate (Anthropic's shape: one larger edit, then a stable
prefix for many turns); a configured target stops it earlier, but never before
``clear_at_least`` tokens are planned.

Idempotence: a result that already holds the placeholder (and, with ``clear_tool_inputs``,
whose call already has ``"{}"`` arguments) needs no edit and frees nothing, so a second run
plans nothing.  With recall on, the plan is made of the marked copies the draft would record
(:meth:`~..draft.Draft.preview_edit`): what is measured is what goes upstream, and a result
cleared on an earlier request (``placeholder [recall id r…]``) plans nothing either.  A step
that would not free any token (a result shorter than the placeholder) is skipped.  Results of
the newest step (an invariant, see "Groups and invariants" in
compaction_proxy/compaction/README.md), orphans and
system messages are never touched.  ``minimum_preserved`` (default 0) protects the newest N
non-system groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Unpack

from pydantic import Field

from ..chat_messages import Message
from ..draft import Draft
from ..triggers import Always, Condition
from ._support.tool_results import ToolResult, answered_results, newest_non_system
from .base import Conditions, Strategy, StrategyContext, StrategyOutcome
from .context_pruning import DEFAULT_PLACEHOLDER
from .params import StrategyParams

CLEARED_ARGUMENTS = "{}"


class ClearToolUsesParams(StrategyParams):
    """``strategy: clear_tool_uses``: Anthropic's context edit (see the module docstring)."""

    keep: int = Field(default=3, ge=0)
    exclude_tools: tuple[str, ...] = ()
    clear_at_least: int = Field(default=0, ge=0)
    clear_tool_inputs: bool = False
    placeholder: str = DEFAULT_PLACEHOLDER


def clear_call_arguments(message: Message, call_id: str | None) -> Message | None:
    """``message`` with the arguments of ``call_id`` (legacy call: ``None``) set to ``{}``.

    ``None`` when they already are (or the call is not found).
    """
    if call_id is None:
        function = message.get("function_call")
        if not isinstance(function, Mapping) or function.get("arguments") == CLEARED_ARGUMENTS:
            return None
        return {**message, "function_call": {**function, "arguments": CLEARED_ARGUMENTS}}
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return None
    new_calls: list[Any] = []
    changed = False
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if (
            isinstance(call, Mapping)
            and call.get("id") == call_id
            and isinstance(function, Mapping)
            and function.get("arguments") != CLEARED_ARGUMENTS
        ):
            new_calls.append({**call, "function": {**function, "arguments": CLEARED_ARGUMENTS}})
            changed = True
        else:
            new_calls.append(call)
    return {**message, "tool_calls": new_calls} if changed else None


class ClearToolUsesStrategy(Strategy):
    """Anthropic-style clearing of old tool results (see the module docstring)."""

    name = "clear_tool_uses"

    def __init__(
        self,
        *,
        keep: int = 3,
        exclude_tools: tuple[str, ...] | list[str] = (),
        clear_at_least: int = 0,
        clear_tool_inputs: bool = False,
        placeholder: str = DEFAULT_PLACEHOLDER,
        **conditions: Unpack[Conditions],
    ) -> None:
        super().__init__(**conditions)
        if keep < 0:
            raise ValueError("keep must be >= 0")
        if clear_at_least < 0:
            raise ValueError("clear_at_least must be >= 0")
        self.keep = keep
        self.exclude_tools = frozenset(exclude_tools)
        self.clear_at_least = clear_at_least
        self.clear_tool_inputs = clear_tool_inputs
        self.placeholder = placeholder

    def default_target(self) -> Condition | None:
        return Always()

    def _results(self, draft: Draft) -> list[tuple[ToolResult, bool]]:
        """Every answered result, oldest first, with whether it may be cleared."""
        floor = newest_non_system(draft, self.minimum_preserved)
        out: list[tuple[ToolResult, bool]] = []
        for group in draft.groups:
            if not draft.is_kept(group):
                continue
            allowed = not draft.is_protected(group) and group.index not in floor
            out.extend((r, allowed) for r in answered_results(draft, group))
        out.sort(key=lambda item: item[0].index)
        return out

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        results = self._results(draft)
        if self.keep:
            results = results[: -self.keep]
        target = self.effective_target(ctx)
        base_metrics = draft.metrics()
        calibration = draft.calibration
        prompt = draft.prompt_tokens
        if not target.fires(replace(base_metrics, tokens=calibration.apply(prompt))):
            # Already at the target: `clear_at_least` sizes an edit that is needed, it is no
            # reason to make one (and clearing anyway would not be idempotent).
            return StrategyOutcome(changed=False)
        planned: dict[int, Message] = {}
        saved = 0
        cleared = 0
        for result, allowed in results:
            if not allowed or result.name in self.exclude_tools:
                continue
            predicted = replace(base_metrics, tokens=calibration.apply(prompt - saved))
            if saved >= self.clear_at_least and not target.fires(predicted):
                break
            step = self._step(draft, planned, result)
            gain = sum(
                self._tokens(draft, planned, index) - draft.measure(message).token_count
                for index, message in step.items()
            )
            if gain <= 0:
                continue  # nothing to clear, or a placeholder longer than the result
            planned.update(step)
            saved += gain
            cleared += 1
        if not planned or saved < self.clear_at_least:
            note = (
                (f"skipped: would clear {saved} token(s) < clear_at_least {self.clear_at_least}",)
                if planned
                else ()
            )
            return StrategyOutcome(changed=False, notes=note)
        for index in sorted(planned):
            draft.edit(index, planned[index])
        return StrategyOutcome(
            changed=True, notes=(f"cleared {cleared} tool result(s), {saved} token(s)",)
        )

    def clears_inputs(self, tool: str) -> bool:
        """Whether clearing a result of ``tool`` clears its call's arguments too
        (``clear_tool_inputs``; a subclass may name the tools, as Anthropic's edit can)."""
        return self.clear_tool_inputs

    @staticmethod
    def _tokens(draft: Draft, planned: dict[int, Message], index: int) -> int:
        message = planned.get(index)
        if message is None:
            return draft.message_stats(index).token_count
        return draft.measure(message).token_count

    def _step(
        self, draft: Draft, planned: dict[int, Message], result: ToolResult
    ) -> dict[int, Message]:
        """The edits clearing one result (and its call's arguments), ``{}`` when none."""
        edits: dict[int, Message] = {}
        message = planned.get(result.index, draft.message(result.index))
        if message.get("content") != self.placeholder:
            cleared = draft.preview_edit(result.index, {**message, "content": self.placeholder})
            if cleared is not None:  # with recall on: marked, and None for a stub's own form
                edits[result.index] = cleared
        if self.clears_inputs(result.name):
            call = planned.get(result.call_index, draft.message(result.call_index))
            new_call = clear_call_arguments(call, result.call_id)
            if new_call is not None:
                new_call = draft.preview_edit(result.call_index, new_call)
            if new_call is not None:
                edits[result.call_index] = new_call
        return edits
