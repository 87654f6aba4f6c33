"""The strategy interface.

A strategy is a small object with a ``name``, a ``trigger`` (when to start), a ``target`` (continue
while it fires; defaults to the trigger) and a ``minimum_preserved`` floor whose unit the strategy
documents.  The pipeline checks the trigger; :meth:`Strategy.apply` does the work on a
:class:`~compaction_proxy.compaction.draft.Draft`, one unit at a time, oldest first, re-checking
:meth:`Strategy.keep_going` after each step.  The draft refuses to touch system groups, the newest
user message and the newest step, and decisions are per whole group, so a strategy cannot break the
invariants even by mistake; it should still skip protected groups (``draft.removable()`` does).

Writing a new strategy:

1. Subclass :class:`Strategy`, set ``name`` (the config's ``strategy:`` value), override
   :meth:`default_trigger` / :meth:`default_target` if the strategy has a natural condition
   (e.g. ``max_n``), and implement :meth:`apply` using ``draft.removable()``,
   ``draft.drop/replace/edit/insert_after_system`` and ``self.keep_going(draft, ctx)``.
2. Return ``StrategyOutcome(changed=...)``; add notes/warnings for the report.  A strategy that
   has to await something (the summarizer) overrides :meth:`Strategy.apply_async` instead and
   keeps :meth:`Strategy.apply` as its synchronous stand-in (the summarization strategy skips
   there: it never fakes a summary).
3. Declare its parameters once, beside it: a :class:`~.params.StrategyParams` subclass whose
   fields are the constructor's keywords (override ``arguments`` where the config's shape
   differs), and register both under the name (:mod:`.registry`):
   ``registry.register("my_strategy", MyParams, MyStrategy)``, for a built-in in
   :mod:`.builtin`, for a strategy of your own in a plug-in function listed in
   ``compaction.plugins`` ("Strategies of your own" in compaction_proxy/compaction/README.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypedDict

from ..summarizer_contract import Summarizer
from ..triggers import Always, Condition, Metrics, OverBudget, count_demands

if TYPE_CHECKING:
    from ..draft import Draft
    from ..report import StrategyReport
    from ..summary_check import SummaryCheck


@dataclass(frozen=True, slots=True)
class StrategyContext:
    """Per-run settings every strategy may consult.

    ``force``: treat every trigger as fired; a strategy without an explicit target then
    compacts down to its floor (``X-Compaction: force``, see "Controlling it per request" in
    docs/http-api.md).
    ``summarizer``: the edge's summarizer
    (:func:`~compaction_proxy.compaction.pipeline.compact_async`);
    ``None`` in the synchronous :func:`~compaction_proxy.compaction.pipeline.compact` and whenever
    none is available, and the summarization strategy then skips.
    ``model``: the chat request's model (passed on in a summary request).
    ``engaged``: an earlier strategy of a hysteresis pipeline acted; this one runs towards
    its target even if its own trigger no longer fires (see ``Pipeline.hysteresis``).
    ``min_saving``: the fewest tokens a strategy's work must save to be kept (see
    :mod:`._support.churn`); 0: every change is kept.
    ``budget``: the budget of the composition the strategy runs in, where it is not the
    request's: a nested token-budget entry's ``tokens_exceed N``.  A strategy that starts over
    it (or over the request's budget) is never held to ``min_saving``.
    """

    force: bool = False
    summarizer: Summarizer | None = None
    model: str = ""
    engaged: bool = False
    min_saving: int = 0
    budget: Condition | None = None


@dataclass(frozen=True, slots=True)
class StrategyOutcome:
    """What :meth:`Strategy.apply` reports back to the pipeline."""

    changed: bool
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    children: tuple[StrategyReport, ...] = field(default=())
    failed: str | None = None
    """Why the strategy could not do its work (a
    :class:`~..summarizer_contract.SummaryError` reason); a failed strategy changed nothing and
    the pipeline moves on to the next one."""
    failure_message: str | None = None
    summary_checks: tuple[SummaryCheck, ...] = ()
    """The checks of the summaries this run wrote (:mod:`._support.summary_record`), copied onto the
    strategy's report."""


class Conditions(TypedDict, total=False):
    """The keywords a strategy hands to :class:`Strategy` untouched (``**conditions:
    Unpack[Conditions]``), so that each one does not restate them with their defaults."""

    trigger: Condition | None
    target: Condition | None
    minimum_preserved: int


class Strategy(ABC):
    """Base class of all compaction strategies (see the module docstring)."""

    name: ClassVar[str] = "strategy"
    position_aged: ClassVar[bool] = False
    """True for a strategy whose decisions depend on where a message sits in the array (so a
    later drop can make it act again); the pipeline re-runs it on the final array."""
    minimum_saving_applies: ClassVar[bool] = True
    """False for a strategy whose work is paid for (a summary): it is kept whatever it saves
    (see :mod:`._support.churn`)."""

    def __init__(
        self,
        *,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 0,
    ) -> None:
        if minimum_preserved < 0:
            raise ValueError("minimum_preserved must be >= 0")
        self._trigger = trigger
        self._target = target
        self.minimum_preserved = minimum_preserved

    def default_trigger(self) -> Condition:
        """Trigger used when none is configured: fire while the request is over budget."""
        return OverBudget()

    def default_target(self) -> Condition | None:
        """Target used when none is configured; ``None`` means "the trigger"."""
        return None

    @property
    def trigger(self) -> Condition:
        """The effective trigger."""
        return self._trigger if self._trigger is not None else self.default_trigger()

    @property
    def target(self) -> Condition:
        """The effective target (continue while it fires)."""
        if self._target is not None:
            return self._target
        return self.default_target() or self.trigger

    @property
    def has_explicit_target(self) -> bool:
        """True when a target was configured or derived from the strategy's parameters."""
        return self._target is not None or self.default_target() is not None

    def effective_target(self, ctx: StrategyContext) -> Condition:
        """The target for this run: in force mode an implicit target becomes ``always``."""
        if ctx.force and not self.has_explicit_target:
            return Always()
        return self.target

    def should_run(self, draft: Draft, ctx: StrategyContext) -> bool:
        """Whether the trigger fires on the current state (always, when forced or engaged)."""
        return ctx.force or ctx.engaged or self.trigger.fires(draft.metrics())

    def count_demanded(self, metrics: Metrics) -> bool:
        """Whether a structural count asks for this run on ``metrics`` (the state it starts
        from): its trigger fires by ``turns_exceed``, ``messages_exceed`` or ``groups_exceed``
        (:func:`~..triggers.count_demands`).  Such a run is kept whatever it saves in tokens
        (:mod:`._support.churn`)."""
        return count_demands(self.trigger, metrics)

    def keep_going(self, draft: Draft, ctx: StrategyContext) -> bool:
        """Whether the target still fires, i.e. another step is wanted."""
        return self.effective_target(ctx).fires(draft.metrics())

    @property
    def summary_roles(self) -> frozenset[str]:
        """Roles of the summary checkpoints this strategy writes (the pipeline's summary marker
        must recognise them); none by default."""
        return frozenset()

    @abstractmethod
    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        """Compact ``draft`` in place (the trigger has already fired)."""

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        """The pipeline's entry point: :meth:`apply` unless the strategy has to await."""
        return self.apply(draft, ctx)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(trigger={self.trigger!r}, target={self.target!r}, "
            f"minimum_preserved={self.minimum_preserved})"
        )
