"""A strategy of a user's own, as a plug-in module: what ``compaction.plugins`` loads.

``stamp_old_results`` replaces the content of every old tool result with a stamp, keeping the
newest ``keep`` tool-call groups as they are.  Nothing built in writes such a stamp, so a
request that reaches the upstream with it went through this strategy.  It is written the way
compaction_proxy/compaction/README.md ("Strategies of your own") tells a user to write one: a
parameter model, a
strategy class, and a ``register(registry)`` function.
"""

from __future__ import annotations

from pydantic import Field

from compaction_proxy.compaction.chat_messages import role_of
from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies import (
    Strategy,
    StrategyContext,
    StrategyOutcome,
    StrategyParams,
    StrategyRegistry,
)
from compaction_proxy.compaction.triggers import Always, Condition
from compaction_proxy.compaction.view import GroupKind

NAME = "stamp_old_results"
DEFAULT_STAMP = "[result stamped by a plug-in]"
REFERENCE = "tests.support.plugin_strategy:register"
BROKEN = "tests.support.plugin_strategy:register_broken"


class StampParams(StrategyParams):
    """``strategy: stamp_old_results``."""

    stamp: str = Field(default=DEFAULT_STAMP, min_length=1)
    keep: int = Field(default=1, ge=0)


class StampOldResults(Strategy):
    """Stamp the results of all but the newest ``keep`` tool-call groups."""

    name = NAME

    def __init__(
        self,
        *,
        stamp: str = DEFAULT_STAMP,
        keep: int = 1,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 0,
    ) -> None:
        super().__init__(trigger=trigger, target=target, minimum_preserved=minimum_preserved)
        self.stamp = stamp
        self.keep = keep

    def default_trigger(self) -> Condition:
        return Always()

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        groups = list(draft.removable(frozenset({GroupKind.TOOL_CALL})))
        old = groups[: len(groups) - self.keep] if self.keep else groups
        stamped = 0
        for group in old:
            for index in group.members:
                message = draft.message(index)
                if role_of(message) == "tool" and message.get("content") != self.stamp:
                    draft.edit(index, {**message, "content": self.stamp})
                    stamped += 1
        notes = (f"stamped {stamped} result(s)",) if stamped else ()
        return StrategyOutcome(changed=stamped > 0, notes=notes)


def register(registry: StrategyRegistry) -> None:
    """The plug-in's entry point, named in ``compaction.plugins`` as :data:`REFERENCE`."""
    registry.register(NAME, StampParams, StampOldResults)


def register_broken(registry: StrategyRegistry) -> None:
    """A plug-in whose start-up fails."""
    raise RuntimeError("the plug-in could not reach its licence server")
