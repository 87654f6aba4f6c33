"""Summarization: fold older history into one summary checkpoint (see "Strategies" and
"Checkpoints" in compaction_proxy/checkpoints/README.md).

The strategy picks a stretch of old history, asks the edge's
:class:`~compaction_proxy.compaction.summarizer_contract.Summarizer` for a summary of it (one
call per compaction event), and replaces the stretch with one message placed right after the
system block::

    {"role": "user", "content": "<summary>\\n{text}\\n</summary>\\n\\n{CHECKPOINT_NOTE}"}

Selection has two shapes.

* **Turns** (LibreChat's ``retainRecent``, the default): keep the last ``retain_turns``
  user-led turns (default 2) verbatim and fold everything between the system block and the
  start of the first retained turn (fewer retained when that misses the target, see "Stopping
  at the target" below).  Cuts are made only at turn
  boundaries (a user message), so a tool call is never separated from its results.
  ``retain_tokens`` caps the retained tail: while the retained turns exceed it, one turn fewer
  is retained, but never fewer than the newest turn.  ``retain_turns=0`` may fold everything
  except the newest turn (LibreChat: "summarize everything", with the newest turn always kept).
* **Steps** (an agent loop: the newest turn holds more than ``retain_turns`` steps, so keeping
  whole turns cannot help): a step counts as a turn.  The newest ``retain_turns`` steps (at
  least one, fewer while they exceed ``retain_tokens``) stay verbatim; everything older, earlier
  turns first, is folded (down to the newest step when that misses the target) into one
  summary placed right after the task message ("progress so far"; see "Agent loops" in
  compaction_proxy/compaction/README.md), or after the system block when only earlier turns are
  folded.  The
  task message is never folded.
* **Groups** (the Agent Framework's ``SummarizationStrategy``, chosen by giving
  ``target_count``; ``threshold`` defaults to 0 here and to 2 in a config entry, as in the
  Agent Framework): fires when the non-system messages exceed ``target_count + threshold``,
  keeps the newest whole groups until they hold at least ``target_count`` messages (at least
  one group), and folds the older ones.  Cuts are made at group boundaries, as the Agent
  Framework does: a tool-call group is atomic, so pairing stays valid even without turn
  boundaries.  The cut may fall inside the newest turn, but the newest user message and the
  newest step are always kept (invariant 4), which is where this shape departs from the Agent
  Framework: over ``[u1, a1, u2, call(c1, c2), tool, tool]`` with ``target_count=2`` the Agent
  Framework folds ``u2`` too, here ``u2`` stays.  A summary of steps after the newest user
  message goes right after it.

In the turn shape a cut is only made where no kept group straddles it (a result that arrives after a
later user message belongs to its call's group): the cut moves to the nearest earlier clean boundary
instead, so kept turns stay verbatim.  The group shape folds whole groups, a late result together
with its call, so any group boundary is a cut (the newest user message and the newest step are never
folded); folding such a group also keeps the output a fixpoint when a later strategy would collapse
it.  ``minimum_preserved`` keeps the newest N non-system groups out of the stretch.
Mid-conversation system/developer messages are never folded; they stay in place and are not sent to
the summarizer.  Nothing happens (and the summarizer is not called) when the stretch holds nothing
but an earlier summary, or, in the turn shape, when it holds no user message (a carried one counts):
only assistant/tool messages from before the first user message, after an earlier summary or not (a
greeting, or what a truncation left of an older turn), which are not worth a call and would
otherwise be folded again on the next run after a forced compaction.

Pins (see compaction_proxy/compaction/carry.py): an earlier summary in the stretch is pinned, and
folded all the same (into the new one); a carried user message in the stretch stays where it is,
verbatim, and is shown to the summarizer with the messages around it.  The new summary is pinned
for the rest of the run, so no later strategy drops it.

Carried user messages count inside the event's target, so they never make summaries come more
often than without them (:class:`._support.summary_selection.TargetStop`): when releasing the
oldest of them alone reaches the target and the request already holds a summary (their turns
were folded into it), they are released, oldest first, and no summary is paid for
(:meth:`~._support.summary_selection.TargetStop.carried_instead`); when a summary is made and its
fold still leaves the request over the target, the oldest of them are folded into it too
(:meth:`~._support.summary_selection.TargetStop.with_carried`).

The summary's size: at most ``summary_share`` (a quarter) of the budget, less the wrapper
(:meth:`SummarizationStrategy.summary_bound`), sent as ``SummaryRequest.max_tokens``.  When the
summary is over that bound, or it and what stays do not fit the budget, more is folded into it
(:class:`._support.summary_event.SummaryEvent`: the older retained turns, then the older steps;
never a carried user message, the task, the newest step or the ``minimum_preserved`` floor) by a
further call with the summary so far as ``previous_summary`` (the update prompt), at most
``max_rounds`` (3) calls in all.  A further call that fails keeps the summary before it.

Rolling update: a summary checkpoint inside the stretch (a ``summary`` group of the view) is
not sent as a message; its text, taken out of the wrapper, becomes the request's
``previous_summary`` and the checkpoint is replaced by the new summary.

Validation and failure: a stretch that costs no more than an empty checkpoint is not sent (no
summary could be shorter); the new summary message must cost fewer tokens than everything it
replaces (else ``not_shorter``); an empty text is ``empty``; a
:class:`~compaction_proxy.compaction.summarizer_contract.SummaryError` carries its own reason,
and any other exception from the summarizer counts as ``error``.  On failure the strategy
changes nothing and returns an outcome with ``failed`` set; the pipeline continues with its next
strategy.
Without a summarizer (the synchronous ``compact``, or the edge has none) the strategy skips
with the note "summarizer not available" and never fakes a summary.

Placement (``user``, the default; ``assistant``; ``system``) only sets the role; the content
and its wrapper are the same.  ``system`` gives summarized user and tool text system
authority, so it is used only when the operator configures it; the
pipeline's summary marker then recognises system-role checkpoints too
(:func:`~compaction_proxy.compaction.pipeline.summary_marker_for`).

Triggers and targets: the trigger is the configured one (the default pipeline's
``token_ratio: 0.8``; ``over_budget`` when none is configured; the message count rule in the
group shape).  One summarizer call per compaction event (more only to fold more, above).

Stopping at the target (turn and step shapes): a summary costs one call whatever it folds, so
the fold goes as far as ``retain_turns``/``retain_tokens`` allow and the next event is far away
(a fold that only just reaches the target fires again a turn or two later).  When the estimated
result of that fold -- everything kept plus one checkpoint -- still fires the strategy's target
(:attr:`~.base.Strategy.target`, in force mode too; the default pipeline's ``token_ratio:
0.5``), all but the newest turn (in an agent loop: step) is folded instead, so what is kept
verbatim shrinks before a later strategy would drop it unsummarized; not for an ``always``
target, which no fold meets.  The checkpoint is estimated as the empty wrapper plus
:meth:`SummarizationStrategy.summary_estimate`: ``summary_ratio`` (0.2) of the folded tokens, at
least ``summary_floor_tokens`` (64), at most ``summary_cap_tokens`` (2048) and the bound.  In
force mode the fold is the one a normal run makes: the same target (a target left implicit is
the trigger's, not the forced ``always``: :class:`._support.summary_selection.TargetStop`), so
``force`` never folds less than the trigger would; a forced run that then makes no summary
while groups are dropped says so in a warning (:mod:`..pipeline`).  Without a context (the bare
:meth:`SummarizationStrategy.select`) the fold goes as far as the retention allows.
The output is then under the target, so the trigger does not fire on it again (idempotence);
the prefix stays stable because the checkpoint, not the cut, is reused on later requests.  The
group shape keeps the Agent Framework's semantics (``target_count``) and ignores the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from ..chat_messages import Message
from ..draft import Draft
from ..fields import CamelModel
from ..ledger.span import span_strings
from ..triggers import Condition
from ..view import CHECKPOINT_NOTE as CHECKPOINT_NOTE  # re-exported: the wrapper's closing note
from ..view import Group, GroupKind
from ._support.summary_event import SUMMARY_OPEN as SUMMARY_OPEN  # re-exported with the two below
from ._support.summary_event import SummaryEvent, wrap_summary
from ._support.summary_event import unwrap_summary as unwrap_summary
from ._support.summary_record import NO_ITEMS
from ._support.summary_record import CheckItems as CheckItems  # re-exported: check_items' type
from ._support.summary_record import (  # re-exported: the edge words a hit's warnings with it
    contradiction_warning as contradiction_warning,
)
from ._support.summary_selection import (
    TURN_ANCHORS,
    TargetStop,
    fold_steps_before,
    foldable,
    is_group_boundary,
    is_turn_boundary,
    non_system_messages,
    position_at_or_before,
    tail_tokens,
)
from .base import Strategy, StrategyContext, StrategyOutcome
from .params import BuildContext, StrategyParams

Placement = Literal["user", "system", "assistant"]
"""The role a summary checkpoint is written with (see "Checkpoints" in
compaction_proxy/checkpoints/README.md)."""
PLACEMENTS: tuple[str, ...] = get_args(Placement)

DEFAULT_SUMMARY_RATIO = 0.2
"""Estimated summary size as a share of the tokens folded (see "Stopping at the target")."""
DEFAULT_SUMMARY_CAP_TOKENS = 2048
"""Upper end of the estimated summary text, in tokens (half the summarizer's default
``maxSummaryTokens``; the core does not know the configured one)."""
DEFAULT_SUMMARY_FLOOR_TOKENS = 64
"""Lower end of the estimated summary text: a small stretch still costs a sentence or two."""
DEFAULT_SUMMARY_SHARE = 0.25
"""The summary text may take at most this share of the budget (the summarizer's output limit
is the smaller of ``maxSummaryTokens`` and this bound)."""
DEFAULT_MAX_ROUNDS = 3
"""Summarizer calls one event may make: the first, and two updates that fold more when the
summary and what must stay do not fit the budget."""


AF_DEFAULT_TARGET_COUNT = 4
"""The Agent Framework's ``target_count`` when an entry writes only ``threshold``."""
AF_DEFAULT_THRESHOLD = 2
"""The Agent Framework's ``threshold`` when an entry writes only ``target_count``."""


class RetainRecentSettings(CamelModel):
    """How much recent history a summary leaves verbatim (whole turns only): LibreChat's
    ``retainRecent``."""

    turns: int = Field(default=2, ge=0, le=20)
    tokens: int | None = Field(default=None, gt=0)


class SummarizationParams(StrategyParams):
    """``strategy: summarization``, in one of two selection shapes (module docstring).

    The Agent Framework's, chosen by writing ``target_count`` and/or ``threshold`` (defaults 4
    and 2 as in the Agent Framework; ``threshold: null`` means 0), or LibreChat's
    ``retain_recent: {turns, tokens}`` (the default, ``turns: 2``).  Prompts and the summarizer
    model are set in the ``summarization`` block.
    """

    target_count: int | None = Field(default=None, ge=1)
    threshold: int | None = Field(default=None, ge=0)
    retain_recent: RetainRecentSettings | None = None
    placement: Placement = "user"

    @property
    def uses_group_shape(self) -> bool:
        """True when ``target_count`` or ``threshold`` was written (Agent Framework shape)."""
        return bool({"target_count", "threshold"} & self.model_fields_set)

    @model_validator(mode="after")
    def _check(self) -> SummarizationParams:
        if self.uses_group_shape and self.retain_recent is not None:
            raise ValueError(
                "set target_count/threshold (Agent Framework shape) or retain_recent "
                "(LibreChat shape), not both"
            )
        return self

    def arguments(self, ctx: BuildContext) -> dict[str, Any]:
        arguments = super().arguments(ctx)
        retain = arguments.pop("retain_recent") or RetainRecentSettings()
        arguments.update(retain_turns=retain.turns, retain_tokens=retain.tokens)
        if self.uses_group_shape:
            written = "threshold" in self.model_fields_set
            threshold = self.threshold if written else AF_DEFAULT_THRESHOLD
            target_count = self.target_count or AF_DEFAULT_TARGET_COUNT
            arguments.update(target_count=target_count, threshold=threshold or 0)
        else:
            arguments.update(target_count=None, threshold=0)
        return arguments


class SummarizationStrategy(Strategy):
    """Fold older history into a summary checkpoint (see the module docstring)."""

    name = "summarization"
    minimum_saving_applies = False  # a summary is paid for: whatever it saves is kept

    def __init__(
        self,
        *,
        retain_turns: int = 2,
        retain_tokens: int | None = None,
        target_count: int | None = None,
        threshold: int | None = None,
        placement: Placement = "user",
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 0,
        summary_ratio: float = DEFAULT_SUMMARY_RATIO,
        summary_cap_tokens: int = DEFAULT_SUMMARY_CAP_TOKENS,
        summary_floor_tokens: int = DEFAULT_SUMMARY_FLOOR_TOKENS,
        summary_share: float = DEFAULT_SUMMARY_SHARE,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> None:
        super().__init__(trigger=trigger, target=target, minimum_preserved=minimum_preserved)
        if retain_turns < 0:
            raise ValueError("retain_recent.turns must be >= 0")
        if retain_tokens is not None and retain_tokens <= 0:
            raise ValueError("retain_recent.tokens must be > 0")
        if target_count is not None and target_count < 1:
            raise ValueError("target_count must be >= 1")
        if threshold is not None and threshold < 0:
            raise ValueError("threshold must be >= 0")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}")
        if not 0 < summary_ratio < 1:
            raise ValueError("summary_ratio must be > 0 and < 1")
        if summary_floor_tokens < 0 or summary_cap_tokens < summary_floor_tokens:
            raise ValueError("summary estimate: need 0 <= floor <= cap")
        if not 0 < summary_share <= 1:
            raise ValueError("summary_share must be > 0 and <= 1")
        if max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self.retain_turns = retain_turns
        self.retain_tokens = retain_tokens
        self.target_count = target_count
        self.threshold = threshold or 0
        self.placement: Placement = placement
        self.summary_ratio = summary_ratio
        self.summary_cap_tokens = summary_cap_tokens
        self.summary_floor_tokens = summary_floor_tokens
        self.summary_share = summary_share
        self.max_rounds = max_rounds

    # ------------------------------------------------------------------ configuration
    @property
    def by_groups(self) -> bool:
        """True for the Agent Framework's group shape (``target_count`` given)."""
        return self.target_count is not None

    @property
    def summary_roles(self) -> frozenset[str]:
        return frozenset({self.placement})

    def should_run(self, draft: Draft, ctx: StrategyContext) -> bool:
        if ctx.force:
            return True
        if self._trigger is None and self.target_count is not None:
            return non_system_messages(draft) > self.target_count + self.threshold
        return super().should_run(draft, ctx)

    def summary_message(self, text: str) -> Message:
        """The checkpoint message for summary ``text`` (role from ``placement``)."""
        return {"role": self.placement, "content": wrap_summary(text)}

    # ------------------------------------------------------------------ selection
    def select(self, draft: Draft, ctx: StrategyContext | None = None) -> list[Group]:
        """The groups to fold, oldest first (empty: nothing to summarize).

        One pass over the groups; see the module docstring for the rules.  With ``ctx`` the
        turn and step shapes stop at the target ("Stopping at the target"; forced, as the
        trigger would); without it they fold as far as the minimum retention allows.
        """
        groups = draft.groups
        view = draft.view
        non_system = [g for g in groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)]
        if not non_system:
            return []
        stop = None if ctx is None or self.by_groups else TargetStop(self, draft)
        if not self.by_groups:
            in_turn = self._select_in_turn(draft, non_system, stop)
            if in_turn is not None:
                return in_turn
        # The group shape may cut inside the newest turn, up to its newest step.
        limit = view.insert_limit if self.by_groups else view.tail_start
        if self.minimum_preserved:
            if len(non_system) <= self.minimum_preserved:
                return []
            limit = min(limit, non_system[-self.minimum_preserved].first)
        is_boundary = is_group_boundary if self.by_groups else is_turn_boundary
        candidates: list[Group] = []  # clean cut points, oldest first
        reach = -1  # the furthest member of any earlier group
        for group in groups:
            if group.first > limit:
                break
            # The group shape folds whole groups, a late result with its call, so any group
            # boundary is a cut; the turn shape keeps whole turns verbatim, so it cuts only
            # where no earlier group reaches past the boundary.
            clean = self.by_groups or reach < group.first
            if clean and draft.is_kept(group) and is_boundary(group):
                candidates.append(group)
            reach = max(reach, group.last)
        if not candidates:
            return []
        position = self._cut(draft, candidates, non_system)
        if position is None:
            return []
        if stop is not None:
            # A summary is paid for by the call, not by what it folds: fold what the retention
            # allows, so the next event is far away (a fold that only just reaches the target
            # fires again a turn or two later).  When even that misses the target, fold all but
            # the newest turn: what is kept verbatim shrinks before a later strategy would drop
            # it unsummarized.  Not for an ``always`` target, which no fold can meet.
            earliest = position
            if stop.reachable and not stop.reached(
                self._fold_before(draft, non_system, candidates[position])
            ):
                earliest = len(candidates) - 1
            cut = candidates[earliest]
            return stop.with_carried(self._fold_before(draft, non_system, cut), cut.first)
        return self._fold_before(draft, non_system, candidates[position])

    def _fold_before(self, draft: Draft, non_system: list[Group], cut: Group) -> list[Group]:
        """What a cut at ``cut`` folds (empty when it is not worth a summarizer call)."""
        stretch = [g for g in non_system if g.index < cut.index and not draft.is_fixed(g)]
        folded = [g for g in stretch if foldable(draft, g)]
        if all(g.kind is GroupKind.SUMMARY for g in folded):
            return []  # only an earlier summary (or nothing) before the cut
        if not self.by_groups and not any(g.kind in TURN_ANCHORS for g in stretch):
            return []  # only what precedes the first turn (e.g. the rest of a truncated turn)
        return folded

    def _select_in_turn(
        self, draft: Draft, non_system: list[Group], stop: TargetStop | None = None
    ) -> list[Group] | None:
        """The agent-loop selection, or ``None`` when the newest turn is short.

        When the newest turn holds more steps than ``retain_turns``, keeping whole turns
        cannot help (the newest turn is the conversation), so a step counts as a turn: the
        newest ``retain_turns`` steps (at least the newest one, fewer while they exceed
        ``retain_tokens``) stay verbatim, and what is older -- earlier turns, an earlier
        summary, the older steps of this turn -- is folded, oldest first and with ``stop`` only
        up to the first step boundary that reaches the target, into one summary placed right
        after the task message.  The task (the newest user message) itself is never folded.
        """
        view = draft.view
        steps = [
            g for g in non_system if view.in_newest_turn(g) and g.kind is not GroupKind.SUMMARY
        ]
        retain = max(1, self.retain_turns)
        if len(steps) <= retain:
            return None
        kept = steps[-retain:]
        if self.retain_tokens is not None:
            while len(kept) > 1 and sum(draft.group_tokens(g) for g in kept) > self.retain_tokens:
                kept = kept[1:]
        deepest = kept[-1]
        if self.minimum_preserved:
            floor = non_system[-self.minimum_preserved :]
            if floor[0].first < kept[0].first:
                kept = [g for g in steps if g.first >= floor[0].first] or kept
            deepest = next((g for g in steps if g.first >= floor[0].first), kept[0])
        # As in the turn shape: the retained steps stay, unless they alone miss the target;
        # then all but the newest step are folded (above any minimum_preserved floor).
        retained = fold_steps_before(draft, non_system, kept[0].first)
        if stop is None:
            return retained
        cut = kept[0].first
        if stop.reachable and not stop.reached(retained):
            cut = deepest.first
        return stop.with_carried(fold_steps_before(draft, non_system, cut), cut)

    def _cut(self, draft: Draft, candidates: list[Group], non_system: list[Group]) -> int | None:
        """Position in ``candidates`` of the cut the minimum retention allows (the most folding
        one)."""
        if self.target_count is not None:
            kept = 0
            wanted = non_system[0].first
            for group in reversed(non_system):
                kept += group.message_count
                if kept >= self.target_count:
                    wanted = group.first
                    break
            return position_at_or_before(candidates, wanted)
        retain = max(1, self.retain_turns)
        users = [g for g in draft.groups if g.kind is GroupKind.USER]
        if not users:
            return None
        wanted = users[-retain].first if len(users) >= retain else users[0].first
        position = position_at_or_before(candidates, wanted)
        if position is None:
            return None
        if self.retain_tokens is not None:
            tail = tail_tokens(draft, candidates)
            while position + 1 < len(candidates) and tail[position] > self.retain_tokens:
                position += 1
        return position

    def _release_carried(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome | None:
        """The event without a summary, when releasing the oldest carried user messages reaches
        the target (:meth:`._support.summary_selection.TargetStop.carried_instead`); ``None``: a
        summary it is."""
        if self.by_groups:
            return None
        carried = TargetStop(self, draft).carried_instead()
        if not carried:
            return None
        tokens = sum(draft.group_tokens(g) for g in carried)
        for group in carried:
            draft.drop(group, release=True)
        return StrategyOutcome(
            changed=True,
            notes=(
                f"released {len(carried)} carried user message(s), oldest first ({tokens} "
                "tokens): the target holds without another summary",
            ),
        )

    def summary_estimate(self, folded_tokens: int, bound: int | None = None) -> int:
        """Estimated tokens of the summary text for a stretch of ``folded_tokens`` (without the
        wrapper): ``summary_ratio`` of the stretch, at least ``summary_floor_tokens``, at most
        ``summary_cap_tokens`` and the run's ``bound`` (:meth:`summary_bound`)."""
        share = math.ceil(folded_tokens * self.summary_ratio)
        cap = self.summary_cap_tokens if bound is None else min(self.summary_cap_tokens, bound)
        return min(cap, max(self.summary_floor_tokens, share))

    def summary_bound(self, draft: Draft) -> int:
        """The most tokens the summary text may have in this run: ``summary_share`` of the
        budget, less the wrapper, at least ``summary_floor_tokens`` (see "The summary's size"
        in the module docstring)."""
        overhead = draft.measure(self.summary_message("")).token_count
        share = math.floor(draft.budget.limit * self.summary_share) - overhead
        return max(self.summary_floor_tokens, share)

    def check_items(self, draft: Draft, folded: Sequence[Group]) -> CheckItems:
        """The exact strings and rules of ``folded`` its summary is checked against before it
        is stored (:mod:`._support.summary_record`, "Summaries checked" in docs/compaction.md):
        what the ledger takes from the span (earlier summaries apart: they were checked when
        written)."""
        messages = [
            draft.message(index)
            for group in folded
            if group.kind is not GroupKind.SUMMARY
            for index in group.members
        ]
        strings, rules = span_strings(messages)
        return CheckItems(strings, rules) if strings or rules else NO_ITEMS

    # ------------------------------------------------------------------ running
    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        """Synchronous stand-in: there is no summarizer to await, so nothing is folded (carried
        user messages are released as in :meth:`apply_async`)."""
        released = self._release_carried(draft, ctx)
        if released is not None:
            return released
        folded = self.select(draft, ctx)
        if not folded:
            return _nothing()
        return _unavailable(folded)

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        released = self._release_carried(draft, ctx)
        if released is not None:
            return released
        folded = self.select(draft, ctx)
        if not folded:
            return _nothing()
        summarizer = ctx.summarizer
        if summarizer is None:
            return _unavailable(folded)
        old_tokens = sum(draft.group_tokens(g) for g in folded)
        overhead = draft.measure(self.summary_message("")).token_count
        if old_tokens <= overhead:  # no summary can be shorter: do not ask for one
            return StrategyOutcome(
                changed=False,
                notes=(
                    f"stretch too small to summarize ({old_tokens} tokens; an empty "
                    f"checkpoint costs {overhead})",
                ),
            )
        marker = draft.summary_marker
        if marker is None or not marker.matches(self.summary_message("")):
            return StrategyOutcome(
                changed=False,
                failed="error",
                failure_message=f"the pipeline's summary marker does not recognise "
                f"{self.placement!r} checkpoints; configure the placement through the pipeline",
            )
        return await SummaryEvent(self, draft, ctx, folded).run(summarizer)


def _nothing() -> StrategyOutcome:
    return StrategyOutcome(changed=False, notes=("nothing to summarize before the kept turns",))


def _unavailable(folded: Sequence[Group]) -> StrategyOutcome:
    count = sum(g.message_count for g in folded)
    return StrategyOutcome(
        changed=False,
        notes=(f"summarizer not available: skipped ({count} message(s) left to later strategies)",),
    )
