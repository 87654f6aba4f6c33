"""Sliding window: keep only the most recent turns or groups.

Two shapes, after the two anchors:

* ``keep_last_groups=N`` (Agent Framework Python ``SlidingWindowStrategy``): keep the newest N
  non-system groups (a tool-call group counts as one), drop every older one.  Fires always by
  default; a configured target can stop it earlier.
* Turn-based (Agent Framework .NET ``SlidingWindowCompactionStrategy``): drop whole turns,
  oldest first.  ``keep_last_turns=N`` fires when more than N turns are kept and drops turns
  until N remain; without it the trigger/target form applies (e.g. ``trigger:
  {turns_exceed: 4}``), keeping at least ``minimum_preserved`` turns (default 1).  Groups before
  the first user message (turn 0, where summaries sit) are kept, as in .NET.

Either way system groups, the newest user message and the newest step are never touched, and
groups are never split; the turn shape never drops part of a turn, so it leaves the running
turn of an agent loop alone (the group shape counts its steps), except that a carried user
message (see compaction_proxy/compaction/carry.py) stays in place, verbatim, when the rest of
its turn goes; a turn of which only that message is left no longer counts as a turn.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ..draft import Draft
from ..triggers import Always, Condition, Metrics, TurnsExceed
from ..view import GroupKind
from .base import Strategy, StrategyContext, StrategyOutcome
from .params import StrategyParams, require_system_kept


class SlidingWindowParams(StrategyParams):
    """``strategy: sliding_window``: ``keep_last_turns``, ``keep_last_groups`` or a trigger."""

    keep_last_groups: int | None = Field(default=None, gt=0)
    keep_last_turns: int | None = Field(default=None, gt=0)
    preserve_system: bool = True

    @model_validator(mode="after")
    def _check(self) -> SlidingWindowParams:
        if self.keep_last_groups is not None and self.keep_last_turns is not None:
            raise ValueError("set keep_last_groups or keep_last_turns, not both")
        if self.keep_last_groups is None and self.keep_last_turns is None and not self.trigger:
            raise ValueError(
                "sliding_window needs keep_last_groups, keep_last_turns or a "
                "trigger such as {turns_exceed: 4}"
            )
        require_system_kept(self.preserve_system, "a sliding window")
        return self


class SlidingWindowStrategy(Strategy):
    """Keep the last N turns or groups (see the module docstring)."""

    name = "sliding_window"

    def __init__(
        self,
        *,
        keep_last_groups: int | None = None,
        keep_last_turns: int | None = None,
        preserve_system: bool = True,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 1,
    ) -> None:
        super().__init__(trigger=trigger, target=target, minimum_preserved=minimum_preserved)
        require_system_kept(preserve_system, "a sliding window")
        if keep_last_groups is not None and keep_last_turns is not None:
            raise ValueError("set keep_last_groups or keep_last_turns, not both")
        for label, value in (
            ("keep_last_groups", keep_last_groups),
            ("keep_last_turns", keep_last_turns),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{label} must be > 0")
        if keep_last_groups is None and keep_last_turns is None and trigger is None:
            raise ValueError("sliding_window needs keep_last_groups, keep_last_turns or a trigger")
        self.keep_last_groups = keep_last_groups
        self.keep_last_turns = keep_last_turns

    def default_trigger(self) -> Condition:
        if self.keep_last_turns is not None:
            return TurnsExceed(self.keep_last_turns)
        return Always()

    def default_target(self) -> Condition | None:
        # The window itself is the stop; a configured target can only stop earlier.
        if self.keep_last_groups is not None or self.keep_last_turns is not None:
            return Always()
        return None

    def count_demanded(self, metrics: Metrics) -> bool:
        # ``keep_last_groups`` / ``keep_last_turns`` is itself a count: the window was asked for.
        if self.keep_last_groups is not None or self.keep_last_turns is not None:
            return True
        return super().count_demanded(metrics)

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        if self.keep_last_groups is not None:
            dropped = self._by_groups(
                draft, ctx, max(self.keep_last_groups, self.minimum_preserved)
            )
            unit = "group"
        else:
            window = self.keep_last_turns or 0
            dropped = self._by_turns(draft, ctx, max(window, self.minimum_preserved))
            unit = "turn"
        return StrategyOutcome(
            changed=dropped > 0, notes=(f"dropped {dropped} {unit}(s)",) if dropped else ()
        )

    def _by_groups(self, draft: Draft, ctx: StrategyContext, keep: int) -> int:
        kept = [g for g in draft.groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)]
        dropped = 0
        for group in kept[: max(0, len(kept) - keep)]:
            if not self.keep_going(draft, ctx):
                break
            if draft.is_protected(group):
                continue
            draft.drop(group)
            dropped += 1
        return dropped

    def _by_turns(self, draft: Draft, ctx: StrategyContext, keep: int) -> int:
        turns: dict[int, list[int]] = {}
        for group in draft.groups:
            if group.turn and draft.is_kept(group):
                turns.setdefault(group.turn, []).append(group.index)
        dropped = 0
        for turn in sorted(turns):
            if draft.metrics().turns <= keep or not self.keep_going(draft, ctx):
                break
            if any(draft.is_fixed(g) for g in turns[turn]):
                continue  # part of this turn is protected (the running turn): keep it whole
            removable = [g for g in turns[turn] if not draft.is_protected(g)]
            if not removable:
                continue  # only a carried user message is left of this turn
            # A carried user message stays where it is, verbatim; the rest of the turn goes.
            for group_index in removable:
                draft.drop(group_index)
            dropped += 1
        return dropped
