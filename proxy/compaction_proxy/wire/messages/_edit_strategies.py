"""The compaction strategies that stand for Anthropic's context edits (translated in
:mod:`._context_management`): Anthropic's semantics on the core's chat-shaped view of a
Messages request.

* :class:`ClearToolUses` (``clear_tool_uses_20250919``): the core's ``clear_tool_uses``, under
  the edit's name, with the tools whose inputs go named, and :class:`ClearToolUsesByCount` for
  a trigger by tool uses;
* :class:`ClearThinking` (``clear_thinking_20251015``): the thinking of older assistant turns
  dropped (the view carries it in a riding field, :data:`._lift.THINKING_FIELD`; the lowering
  drops the blocks, :mod:`._cleared_thinking`);
* :class:`Compact` (``compact_20260112``): the core's summarization at the edit's trigger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies.base import (
    Conditions,
    Strategy,
    StrategyContext,
    StrategyOutcome,
)
from compaction_proxy.compaction.strategies.clear_tool_uses import ClearToolUsesStrategy
from compaction_proxy.compaction.strategies.composite import (
    run_strategy_async,
    run_to_completion,
    without_summarizer,
)
from compaction_proxy.compaction.strategies.summarization import SummarizationStrategy
from compaction_proxy.compaction.triggers import Always, Never, TokensExceed

from ._lift import BLOCKS_FIELD, THINKING_FIELD

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
TOOL_USES_KEEP = 3
"""``clear_tool_uses_20250919``'s default ``keep``: tool uses."""


class ClearThinking(Strategy):
    """``clear_thinking_20251015``: the thinking of older assistant turns is dropped.

    A turn is what the model does between two user messages: its messages and the tool
    results they are answered with (a user message of tool results, with or without text
    beside them, continues the turn). The newest ``keep`` turns that hold thinking keep it
    (``None``: every turn does, and the strategy never fires); an older turn's assistant
    messages lose their thinking field, which the Messages lowering turns into the client's
    message without its ``thinking`` / ``redacted_thinking`` blocks
    (:mod:`._cleared_thinking`). Never touched: the turn the request continues (its last
    message answers that turn's ``tool_use``: the API wants its thinking back), the newest
    step and what else the core protects, and a message that would be left with nothing but
    its thinking.
    """

    name = CLEAR_THINKING

    def __init__(self, keep: int | None) -> None:
        super().__init__(trigger=Always() if keep is not None else Never(), target=Always())
        self.keep = keep

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        if self.keep is None:
            return StrategyOutcome(changed=False)
        turns = _thinking_turns(draft)
        if not turns.by_turn:
            return StrategyOutcome(changed=False, notes=("no thinking to clear",))
        ordered = sorted(turns.by_turn)
        kept = set(ordered[len(ordered) - self.keep :] if self.keep else ())
        if turns.open is not None:
            kept.add(turns.open)
        before = draft.prompt_tokens
        cleared_turns = 0
        cleared = 0
        for turn in ordered:
            if turn in kept:
                continue
            edited = 0
            for index in turns.by_turn[turn]:
                message = draft.message(index)
                group = draft.groups[draft.view.group_of[index]]
                if draft.is_protected(group) or not _more_than_thinking(message):
                    continue
                draft.edit(index, {k: v for k, v in message.items() if k != THINKING_FIELD})
                edited += 1
            if edited:
                cleared_turns += 1
                cleared += edited
        if not cleared:
            return StrategyOutcome(changed=False, notes=("no thinking to clear",))
        saved = before - draft.prompt_tokens
        note = (
            f"cleared the thinking of {cleared_turns} turn(s) "
            f"({cleared} message(s), {saved} token(s))"
        )
        return StrategyOutcome(changed=True, notes=(note,))


@dataclass(frozen=True, slots=True)
class _Turns:
    by_turn: dict[int, list[int]]  # turn -> its assistant messages that carry thinking
    open: int | None  # the turn the request continues (its last message answers a tool use)


def _thinking_turns(draft: Draft) -> _Turns:
    """The draft's kept assistant messages with thinking, by turn (see :class:`ClearThinking`)."""
    by_turn: dict[int, list[int]] = {}
    turn = 0
    previous = ""
    view = draft.view
    for index in range(len(view.messages)):
        if not draft.is_kept(view.group_of[index]):
            continue
        message = draft.message(index)
        role = message.get("role")
        if role == "system" or not isinstance(role, str):
            continue
        if role == "user" and previous != "tool":
            turn += 1  # a user message that is not tool results (or text beside them)
        if role == "assistant" and message.get(THINKING_FIELD):
            by_turn.setdefault(turn, []).append(index)
        if role != "user" or previous != "tool":
            previous = role  # text beside results keeps the turn open, as the results do
    return _Turns(by_turn, turn if previous == "tool" else None)


def _more_than_thinking(message: Mapping[str, Any]) -> bool:
    """Whether the message holds something besides its thinking (the API refuses an empty
    assistant message)."""
    return bool(message.get("content") or message.get("tool_calls") or message.get(BLOCKS_FIELD))


class ClearToolUses(ClearToolUsesStrategy):
    """``clear_tool_uses_20250919``: the core's ``clear_tool_uses`` under the edit's name, with
    ``clear_tool_inputs`` also naming tools (only their calls' inputs are cleared) and a
    trigger by tool uses (:class:`ClearToolUsesByCount`)."""

    name = CLEAR_TOOL_USES

    def __init__(
        self,
        *,
        inputs_of: frozenset[str] | None = None,
        keep: int = TOOL_USES_KEEP,
        exclude_tools: tuple[str, ...] = (),
        clear_at_least: int = 0,
        clear_tool_inputs: bool = False,
        **conditions: Unpack[Conditions],
    ) -> None:
        super().__init__(
            keep=keep,
            exclude_tools=exclude_tools,
            clear_at_least=clear_at_least,
            clear_tool_inputs=clear_tool_inputs or inputs_of is not None,
            **conditions,
        )
        self.inputs_of = inputs_of

    def clears_inputs(self, tool: str) -> bool:
        if self.inputs_of is not None:
            return tool in self.inputs_of
        return self.clear_tool_inputs


class ClearToolUsesByCount(ClearToolUses):
    """:class:`ClearToolUses` with ``trigger: {type: tool_uses, value: N}``: it fires once the
    request holds more than N tool uses (``tool_use`` blocks, parallel ones counted one by
    one), whatever its length."""

    def __init__(self, uses: int, **arguments: Any) -> None:
        super().__init__(trigger=Always(), **arguments)
        self.uses = uses

    def should_run(self, draft: Draft, ctx: StrategyContext) -> bool:
        return ctx.force or ctx.engaged or _tool_uses(draft) > self.uses


def _tool_uses(draft: Draft) -> int:
    count = 0
    view = draft.view
    for index in range(len(view.messages)):
        if draft.is_kept(view.group_of[index]):
            calls = draft.message(index).get("tool_calls")
            count += len(calls) if isinstance(calls, list) else 0
    return count


class Compact(Strategy):
    """``compact_20260112``: the core's summarization at the edit's trigger, reported under the
    edit's name with the summary step inside (so the edge treats it as the summary it is: it
    is stored, backed off and withheld as any summary)."""

    name = COMPACT
    minimum_saving_applies = False  # a summary is paid for

    def __init__(self, tokens: int) -> None:
        trigger = TokensExceed(tokens)
        super().__init__(trigger=trigger)
        self.summary = SummarizationStrategy(trigger=trigger)

    @property
    def summary_roles(self) -> frozenset[str]:
        return self.summary.summary_roles

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        return run_to_completion(self.apply_async(draft, without_summarizer(ctx)))

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        report = await run_strategy_async(self.summary, draft, ctx)
        return StrategyOutcome(changed=report.changed, children=(report,))
