"""Truncation: drop the oldest groups until the target is met.

Agent Framework (Python ``TruncationStrategy``) semantics: with ``max_n`` the strategy fires
when the metric (calibrated prompt tokens, or messages including system ones) exceeds
``max_n`` and drops whole groups oldest first until the metric is at most ``compact_to``
(``0 < compact_to <= max_n``; it defaults to ``max_n``).  The first user group is kept when
``preserve_first_user_group`` is set, and the newest ``minimum_preserved`` non-system groups
are never dropped (default 1: the Agent Framework's "minimum retained group").

Without ``max_n`` the trigger/target form applies (see "Triggers and targets" in
compaction_proxy/compaction/README.md); the default trigger is "over budget".  Divergences from the
Agent Framework,
because our invariants win (see "Groups and invariants" in compaction_proxy/compaction/README.md):
``preserve_system`` must stay true, and the newest user message and the newest step are never
dropped (older steps of the running turn are), so e.g.  ``preserve_first_user_group`` over ``[S,
task, a1, u2, a2]`` with ``max_n=3, compact_to=2`` yields ``[S, task, u2, a2]`` where the Agent
Framework drops ``u2``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..draft import Draft
from ..triggers import Condition, MessagesExceed, TokensExceed
from ..view import GroupKind
from ._support.tool_results import newest_non_system
from .base import Strategy, StrategyContext, StrategyOutcome
from .params import StrategyParams, require_system_kept

Metric = Literal["tokens", "messages"]


class TruncationParams(StrategyParams):
    """``strategy: truncation``: the Agent Framework's ``max_n``/``compact_to``, or a trigger
    and target."""

    max_n: int | None = Field(default=None, gt=0)
    compact_to: int | None = Field(default=None, gt=0)
    metric: Metric = "tokens"
    preserve_system: bool = True
    preserve_first_user_group: bool = False

    @model_validator(mode="after")
    def _check(self) -> TruncationParams:
        if self.compact_to is not None and (self.max_n is None or self.compact_to > self.max_n):
            raise ValueError("compact_to requires max_n and must satisfy compact_to <= max_n")
        require_system_kept(self.preserve_system, "truncation")
        return self


class TruncationStrategy(Strategy):
    """Drop oldest non-system groups (see the module docstring)."""

    name = "truncation"

    def __init__(
        self,
        *,
        max_n: int | None = None,
        compact_to: int | None = None,
        metric: Metric = "tokens",
        preserve_system: bool = True,
        preserve_first_user_group: bool = False,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 1,
    ) -> None:
        super().__init__(trigger=trigger, target=target, minimum_preserved=minimum_preserved)
        require_system_kept(preserve_system, "truncation")
        if max_n is not None and max_n <= 0:
            raise ValueError("max_n must be > 0")
        if compact_to is not None:
            if max_n is None:
                raise ValueError("compact_to requires max_n")
            if not 0 < compact_to <= max_n:
                raise ValueError("compact_to must satisfy 0 < compact_to <= max_n")
        if metric not in ("tokens", "messages"):
            raise ValueError("metric must be 'tokens' or 'messages'")
        self.max_n = max_n
        self.compact_to = compact_to if compact_to is not None else max_n
        self.metric: Metric = metric
        self.preserve_first_user_group = preserve_first_user_group

    def _threshold(self, limit: int) -> Condition:
        return TokensExceed(limit) if self.metric == "tokens" else MessagesExceed(limit)

    def default_trigger(self) -> Condition:
        if self.max_n is not None:
            return self._threshold(self.max_n)
        return super().default_trigger()

    def default_target(self) -> Condition | None:
        if self.compact_to is not None:
            return self._threshold(self.compact_to)
        return None

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        floor = newest_non_system(draft, self.minimum_preserved)
        first_user = None
        if self.preserve_first_user_group:
            first_user = next((g.index for g in draft.groups if g.kind is GroupKind.USER), None)
        dropped = 0
        for group in list(draft.removable()):
            if not self.keep_going(draft, ctx):
                break
            if group.index in floor or group.index == first_user:
                continue
            draft.drop(group)
            dropped += 1
        return StrategyOutcome(
            changed=dropped > 0, notes=(f"dropped {dropped} group(s)",) if dropped else ()
        )
