"""The shape shared by the strategies that act on old tool-call groups, one group at a time.

``tool_result_compaction`` collapses each old group and ``selective_tool_calls`` drops it; which
groups count as old, the floors that protect the newest ones, and when to stop are the same.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Unpack

from pydantic import Field

from ...draft import Draft
from ...triggers import Always, Condition
from ...view import Group
from ..base import Conditions, Strategy, StrategyContext, StrategyOutcome
from ..params import StrategyParams
from .tool_results import kept_tool_call_groups, newest, newest_non_system


class OldToolGroupsParams(StrategyParams):
    """The parameter both share: how many of the newest tool-call groups stay as they are."""

    keep_last_tool_call_groups: int = Field(default=1, ge=0)


class OldToolGroupsStrategy(Strategy):
    """Act on every kept tool-call group but the newest ``keep_last_tool_call_groups``.

    By default it fires always and acts on all of them (the Agent Framework's shape); with a
    configured trigger and no target it acts oldest first until the trigger stops firing.
    """

    verb = "changed"
    """Past tense for the report note ("collapsed 3 tool-call group(s)")."""

    def __init__(
        self,
        *,
        keep_last_tool_call_groups: int = 1,
        **conditions: Unpack[Conditions],
    ) -> None:
        super().__init__(**conditions)
        if keep_last_tool_call_groups < 0:
            raise ValueError("keep_last_tool_call_groups must be >= 0")
        self.keep_last_tool_call_groups = keep_last_tool_call_groups

    def default_trigger(self) -> Condition:
        return Always()

    def default_target(self) -> Condition | None:
        return Always() if self._trigger is None else None

    @abstractmethod
    def act(self, draft: Draft, group: Group) -> None:
        """Collapse, drop, ... one old group."""

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        groups = kept_tool_call_groups(draft)
        keep = newest(groups, self.keep_last_tool_call_groups)
        floor = newest_non_system(draft, self.minimum_preserved)
        acted = 0
        for group in groups:
            if group.index in keep or group.index in floor or draft.is_protected(group):
                continue
            if not self.keep_going(draft, ctx):
                break
            self.act(draft, group)
            acted += 1
        note = (f"{self.verb} {acted} tool-call group(s)",) if acted else ()
        return StrategyOutcome(changed=acted > 0, notes=note)
