"""``strategy: ledger``: a pipeline entry that turns the ledger on (see "The ledger" in
docs/compaction.md).

The ledger is not a strategy that compacts: it is what every fold leaves behind (the draft
feeds it at each drop, replacement and edit, :mod:`..ledger.state`).  An explicit pipeline, read
in the Agent Framework's terms, has none unless it names this entry (or ``compaction.ledger``
writes ``enabled: true``); the factory takes the entry out of the strategies and gives the
pipeline its ``share`` (:func:`~..factory.build_pipeline`).  Only a top-level entry counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from pydantic import Field

from .base import Conditions, Strategy, StrategyContext, StrategyOutcome
from .params import StrategyParams

if TYPE_CHECKING:
    from ..draft import Draft

DEFAULT_LEDGER_SHARE = 0.5
"""The most of the budget the ledger may take (``compaction.ledger.share``).  A cap, not a
reservation: a session whose tool output is mostly bulk leaves a small ledger.  Half, because
an agent loop dense in exact strings (a path, a command and its verdict, a measurement every
step) holds about a fifth of its tokens in them: at a quarter the ledger kept 83% of a 70-step
loop's folded strings on an 8k window, at half 100% (bench/quality, docs/compaction.md)."""


class LedgerParams(StrategyParams):
    """``strategy: ledger``, with its optional ``share`` of the budget (default: the
    ``compaction.ledger.share``)."""

    share: float | None = Field(default=None, gt=0, le=0.9)


class LedgerStep(Strategy):
    """The ``ledger`` entry as the factory reads it; it never runs (see the module docstring)."""

    name = "ledger"

    def __init__(self, *, share: float | None = None, **conditions: Unpack[Conditions]) -> None:
        super().__init__(**conditions)
        self.share = share

    def should_run(self, draft: Draft, ctx: StrategyContext) -> bool:
        return False

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        return StrategyOutcome(changed=False)
