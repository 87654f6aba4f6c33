"""Selective tool calls: drop old tool-call groups entirely, keep the newest N.

Agent Framework (Python ``SelectiveToolCallCompactionStrategy``) semantics: every kept
``tool_call`` group (an assistant message with ``tool_calls`` or a legacy ``function_call`` plus
every result answering it) except the newest ``keep_last_tool_call_groups`` (default 1; 0 drops
them all) is removed as one unit; nothing is inserted in its place.  User and plain assistant
messages are untouched.

Trigger/target/``minimum_preserved`` as in :mod:`.tool_result_compaction`: by default it
fires always and drops all but the newest N (the anchor's shape); a configured trigger without
a target drops oldest first until the trigger stops firing.  ``minimum_preserved`` (default 0)
keeps the newest N non-system groups of any kind.

Deliberate differences from the Agent Framework: tool-call groups in the newest turn are never
dropped (DESIGN invariant 4), and grouping follows our view (``developer`` is a system message;
an orphan result run that does not follow a call shares its neighbour's fate instead of being a
``tool_call`` group of its own).
"""

from __future__ import annotations

from ..draft import Draft
from ..triggers import Always, Condition
from ._tools import kept_tool_call_groups, newest, newest_non_system
from .base import Strategy, StrategyContext, StrategyOutcome


class SelectiveToolCallsStrategy(Strategy):
    """Drop all but the newest N tool-call groups (see the module docstring)."""

    name = "selective_tool_calls"

    def __init__(
        self,
        *,
        keep_last_tool_call_groups: int = 1,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 0,
    ) -> None:
        super().__init__(trigger=trigger, target=target, minimum_preserved=minimum_preserved)
        if keep_last_tool_call_groups < 0:
            raise ValueError("keep_last_tool_call_groups must be >= 0")
        self.keep_last_tool_call_groups = keep_last_tool_call_groups

    def default_trigger(self) -> Condition:
        return Always()

    def default_target(self) -> Condition | None:
        return Always() if self._trigger is None else None

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        groups = kept_tool_call_groups(draft)
        keep = newest(groups, self.keep_last_tool_call_groups)
        floor = newest_non_system(draft, self.minimum_preserved)
        dropped = 0
        for group in groups:
            if group.index in keep or group.index in floor or draft.is_protected(group):
                continue
            if not self.keep_going(draft, ctx):
                break
            draft.drop(group)
            dropped += 1
        return StrategyOutcome(
            changed=dropped > 0, notes=(f"dropped {dropped} tool-call group(s)",) if dropped else ()
        )
