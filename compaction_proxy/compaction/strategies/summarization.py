"""Summarization: fold older history into one summary checkpoint (see "Strategies" and
"Checkpoints" in docs/architecture.md).

The strategy picks a stretch of old history, asks the edge's
:class:`~compaction_proxy.compaction.summarizer.Summarizer` for a summary of it (one call per
compaction event), and replaces the stretch with one message placed right after the system block::

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
  docs/architecture.md), or after the system block when only earlier turns are folded.  The
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

The summary's size: at most ``summary_share`` (a quarter) of the budget, less the wrapper
(:meth:`SummarizationStrategy.summary_bound`), sent as ``SummaryRequest.max_tokens``.  When the
summary is over that bound, or it and what stays do not fit the budget, more is folded into it
(:meth:`SummarizationStrategy._deeper`: the older retained turns, then the older steps; never a
carried user message, the task, the newest step or the ``minimum_preserved`` floor) by a further
call with the summary so far as ``previous_summary`` (the update prompt), at most ``max_rounds``
(3) calls in all.  A further call that fails keeps the summary before it.

Rolling update: a summary checkpoint inside the stretch (a ``summary`` group of the view) is
not sent as a message; its text, taken out of the wrapper, becomes the request's
``previous_summary`` and the checkpoint is replaced by the new summary.

Validation and failure: a stretch that costs no more than an empty checkpoint is not sent (no
summary could be shorter); the new summary message must cost fewer tokens than everything it
replaces (else ``not_shorter``); an empty text is ``empty``; a
:class:`~compaction_proxy.compaction.summarizer.SummaryError` carries its own reason, and any other
exception from the summarizer counts as ``error``.  On failure the strategy changes nothing
and returns an outcome with ``failed`` set; the pipeline continues with its next strategy.
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
(:meth:`~.base.Strategy.effective_target`; the default pipeline's ``token_ratio: 0.5``), all but
the newest turn (in an agent loop: step) is folded instead, so what is kept verbatim shrinks
before a later strategy would drop it unsummarized; not for an ``always`` target, which no fold
meets.  The checkpoint is estimated as the empty wrapper plus
:meth:`SummarizationStrategy.summary_estimate`: ``summary_ratio`` (0.2) of the folded tokens, at
least ``summary_floor_tokens`` (64), at most ``summary_cap_tokens`` (2048) and the bound.  In
force mode, or without a context (the bare :meth:`SummarizationStrategy.select`), the fold goes
as far as the retention allows.
The output is then under the target, so the trigger does not fire on it again (idempotence);
the prefix stays stable because the checkpoint, not the cut, is reused on later requests.  The
group shape keeps the Agent Framework's semantics (``target_count``) and ignores the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from typing import Any, Literal, cast, get_args

from ..draft import Draft, GroupState
from ..messages import Message
from ..summarizer import SummaryError, SummaryRequest
from ..triggers import Always, Condition, Metrics
from ..view import CHECKPOINT_NOTE as CHECKPOINT_NOTE  # re-exported: the wrapper's closing note
from ..view import SUMMARY_PREFIX, SUMMARY_SUFFIX, Group, GroupKind
from ._tools import newest_non_system
from .base import Strategy, StrategyContext, StrategyOutcome

Placement = Literal["user", "system", "assistant"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)

SUMMARY_OPEN = SUMMARY_PREFIX + "\n"
_EXACT_SUFFIX = SUMMARY_SUFFIX
_TURN_ANCHORS = frozenset({GroupKind.USER})
"""A turn-shape stretch is worth a call only with a user message in it (a carried one counts):
an earlier summary and the rest of a truncated turn after it are not (a summary is pinned, so
that rest sits after it, and would be folded again on the next run)."""
_ERROR_DETAIL_CHARS = 200
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


def wrap_summary(text: str) -> str:
    """The checkpoint content for summary ``text``."""
    return f"{SUMMARY_OPEN}{text}{_EXACT_SUFFIX}"


def unwrap_summary(content: str) -> str:
    """The summary text inside a checkpoint's content (inverse of :func:`wrap_summary`).

    Our own wrapper is removed exactly.  A checkpoint written with another note (an older
    version, another tool) loses its ``<summary>`` opening and everything from the last
    ``</summary>`` on.
    """
    if content.startswith(SUMMARY_OPEN) and content.endswith(_EXACT_SUFFIX):
        return content[len(SUMMARY_OPEN) : len(content) - len(_EXACT_SUFFIX)]
    body = content.removeprefix(SUMMARY_PREFIX)
    end = body.rfind("</summary>")
    if end >= 0:
        body = body[:end]
    return body.strip("\n")


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
            return _non_system_messages(draft) > self.target_count + self.threshold
        return super().should_run(draft, ctx)

    def summary_message(self, text: str) -> Message:
        """The checkpoint message for summary ``text`` (role from ``placement``)."""
        return {"role": self.placement, "content": wrap_summary(text)}

    # ------------------------------------------------------------------ selection
    def select(self, draft: Draft, ctx: StrategyContext | None = None) -> list[Group]:
        """The groups to fold, oldest first (empty: nothing to summarize).

        One pass over the groups; see the module docstring for the rules.  With ``ctx`` (and
        not forced) the turn and step shapes stop at the target ("Stopping at the target");
        without it they fold as far as the minimum retention allows.
        """
        groups = draft.groups
        view = draft.view
        non_system = [g for g in groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)]
        if not non_system:
            return []
        stop = None if ctx is None or ctx.force or self.by_groups else _TargetStop(self, draft, ctx)
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
        is_boundary = _is_group_boundary if self.by_groups else _is_turn_boundary
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
            return self._fold_before(draft, non_system, candidates[earliest])
        return self._fold_before(draft, non_system, candidates[position])

    def _fold_before(self, draft: Draft, non_system: list[Group], cut: Group) -> list[Group]:
        """What a cut at ``cut`` folds (empty when it is not worth a summarizer call)."""
        stretch = [g for g in non_system if g.index < cut.index and not draft.is_fixed(g)]
        folded = [g for g in stretch if _foldable(draft, g)]
        if all(g.kind is GroupKind.SUMMARY for g in folded):
            return []  # only an earlier summary (or nothing) before the cut
        if not self.by_groups and not any(g.kind in _TURN_ANCHORS for g in stretch):
            return []  # only what precedes the first turn (e.g. the rest of a truncated turn)
        return folded

    def _select_in_turn(
        self, draft: Draft, non_system: list[Group], stop: _TargetStop | None = None
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
        retained = _fold_steps_before(draft, non_system, kept[0].first)
        if stop is not None and stop.reachable and not stop.reached(retained):
            return _fold_steps_before(draft, non_system, deepest.first)
        return retained

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
            return _position_at_or_before(candidates, wanted)
        retain = max(1, self.retain_turns)
        users = [g for g in draft.groups if g.kind is GroupKind.USER]
        if not users:
            return None
        wanted = users[-retain].first if len(users) >= retain else users[0].first
        position = _position_at_or_before(candidates, wanted)
        if position is None:
            return None
        if self.retain_tokens is not None:
            tail = _tail_tokens(draft, candidates)
            while position + 1 < len(candidates) and tail[position] > self.retain_tokens:
                position += 1
        return position

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

    # ------------------------------------------------------------------ running
    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        """Synchronous stand-in: there is no summarizer to await, so nothing is folded."""
        folded = self.select(draft, ctx)
        if not folded:
            return _nothing()
        return _unavailable(folded)

    async def apply_async(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
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
            return _failed(
                "error",
                f"the pipeline's summary marker does not recognise {self.placement!r} "
                "checkpoints; configure the placement through the pipeline",
                0,
            )
        bound = self.summary_bound(draft)
        previous = [
            unwrap_summary(str(draft.message(g.first).get("content", "")))
            for g in folded
            if g.kind is GroupKind.SUMMARY
        ]
        indices = _shown(draft, folded)
        request = SummaryRequest(
            messages=tuple(_as_dict(draft.message(i)) for i in indices),
            previous_summary="\n\n".join(previous) if previous else None,
            model=ctx.model,
            max_tokens=bound,
        )
        text: str | None = None
        accepted = folded
        shown = len(indices)
        notes: list[str] = []
        for round_number in range(1, self.max_rounds + 1):
            try:
                answer = await summarizer.summarize(request)
            except SummaryError as error:
                if text is None:
                    return _failed(error.reason, error.message, shown)
                notes.append(f"folding more failed ({error.reason}); the summary before is kept")
                break
            except Exception as error:  # a summarizer bug must not fail the request
                detail = str(error)[:_ERROR_DETAIL_CHARS]
                if text is None:
                    return _failed(
                        "error", f"summarizer raised {type(error).__name__}: {detail}", 0
                    )
                notes.append("folding more failed (error); the summary before is kept")
                break
            answer = answer.strip() if isinstance(answer, str) else ""
            if not answer:
                if text is None:
                    return _failed("empty", "the summarizer returned no text", shown)
                notes.append("folding more failed (empty); the summary before is kept")
                break
            text, accepted = answer, folded
            new_tokens = draft.measure(self.summary_message(text)).token_count
            if round_number == self.max_rounds or self._fits(draft, folded, new_tokens, bound):
                break
            more = self._deeper(draft, folded)
            extra = _shown(draft, more)
            if not extra:
                break
            # What must stay and the summary do not fit: fold more, into this summary.
            folded = sorted([*folded, *more], key=_index)
            shown += len(extra)
            earlier = [
                unwrap_summary(str(draft.message(g.first).get("content", "")))
                for g in more
                if g.kind is GroupKind.SUMMARY
            ]
            notes.append(
                f"the summary ({new_tokens} tokens) and what stays did not fit the budget: "
                f"folded {len(more)} more group(s) into it"
            )
            request = SummaryRequest(
                messages=tuple(_as_dict(draft.message(i)) for i in extra),
                previous_summary="\n\n".join([*earlier, text]),
                model=ctx.model,
                max_tokens=bound,
            )
        assert text is not None
        message = self.summary_message(text)
        new_tokens = draft.measure(message).token_count
        old_tokens = sum(draft.group_tokens(g) for g in accepted)
        if new_tokens >= old_tokens:
            return _failed(
                "not_shorter",
                f"the summary ({new_tokens} tokens) is not shorter than what it would replace "
                f"({old_tokens} tokens)",
                shown,
            )
        in_turn = any(draft.view.in_newest_turn(g) for g in accepted)
        for group in accepted:
            draft.drop(group, release=group.kind is GroupKind.SUMMARY)
        if in_turn:  # "progress so far": the task stays first
            draft.insert_after_task([message], paid_by=self.name)
        else:
            draft.insert_after_system([message], paid_by=self.name)
        kind = "updated the summary with" if previous else "summarized"
        folded_groups = sum(1 for g in accepted if g.kind is not GroupKind.SUMMARY)
        return StrategyOutcome(
            changed=True,
            notes=(
                f"{kind} {shown} message(s) in {folded_groups} group(s): "
                f"{old_tokens} -> {new_tokens} tokens (at most {bound} allowed)",
                *notes,
            ),
        )

    def _fits(self, draft: Draft, folded: Sequence[Group], new_tokens: int, bound: int) -> bool:
        """Whether folding ``folded`` into a checkpoint of ``new_tokens`` tokens keeps the
        summary within its bound and the request within the budget."""
        overhead = draft.measure(self.summary_message("")).token_count
        if new_tokens - overhead > bound:
            return False
        after = draft.prompt_tokens - sum(draft.group_tokens(g) for g in folded) + new_tokens
        return draft.calibration.apply(after) <= draft.budget.limit

    def _deeper(self, draft: Draft, folded: Sequence[Group]) -> list[Group]:
        """What to fold next when the summary and what stays do not fit: the older turns
        still kept verbatim (all but the newest turn), else the older steps of the newest
        turn; never the task, the newest step, a carried user message or the
        ``minimum_preserved`` floor."""
        view = draft.view
        taken = {g.index for g in folded}
        floor = newest_non_system(draft, self.minimum_preserved)
        candidates = [
            g
            for g in draft.groups
            if g.kind is not GroupKind.SYSTEM
            and draft.is_kept(g)
            and g.index not in taken
            and g.index not in floor
            and _foldable(draft, g)
        ]
        older = [g for g in candidates if not view.in_newest_turn(g)]
        return older or [g for g in candidates if view.in_newest_turn(g)]


class _TargetStop:
    """Whether folding a stretch would bring the draft to the strategy's target.

    The draft after the fold is projected without touching it: the stretch's tokens, messages,
    groups, tool-call groups and whole turns leave, one checkpoint (the empty wrapper plus
    :meth:`SummarizationStrategy.summary_estimate`) arrives.  The target is reached when it no
    longer fires on that projection.  ``overflow_messages`` is projected as "all of them", so
    an over-budget ``messages_to_refine`` target counts as not reached (fold further).
    """

    def __init__(self, strategy: SummarizationStrategy, draft: Draft, ctx: StrategyContext) -> None:
        self.strategy = strategy
        self.draft = draft
        self.target = strategy.effective_target(ctx)
        self.base = draft.metrics()
        self.overhead = draft.measure(strategy.summary_message("")).token_count
        self.bound = strategy.summary_bound(draft)
        # Folding can meet the target (it is not ``always``): when no cut reaches it, the
        # deepest one is taken, since the pipeline would otherwise drop what the summary left
        # verbatim to get there.
        self.reachable = not isinstance(self.target, Always)
        self.turn_live: dict[int, int] = {}
        for group in draft.groups:
            if group.turn and draft.state(group) is not GroupState.DROPPED:
                self.turn_live[group.turn] = self.turn_live.get(group.turn, 0) + 1

    def reached(self, folded: Sequence[Group]) -> bool:
        """Whether folding exactly ``folded`` reaches the target."""
        tally = _Tally(self)
        for group in folded:
            tally.add(group)
        return tally.reached()

    def first_reaching(
        self,
        non_system: Sequence[Group],
        cuts: Sequence[int],
        position: Callable[[Group], int],
        *,
        anchored: bool,
    ) -> int | None:
        """The first of ``cuts`` (ascending) whose fold reaches the target: a cut folds the
        unprotected groups of ``non_system`` whose ``position`` is below it, and is skipped
        when that is nothing but summaries (or, ``anchored``, holds no user turn or summary).

        Each cut's fold extends the previous one's, so one running tally serves every cut:
        linear in the groups where rebuilding each fold was quadratic. Positions out of
        order (never seen; the view orders groups by their first message) fall back to
        rebuilding each fold.
        """
        positions = [position(g) for g in non_system]
        if not (_ascending(positions) and _ascending(cuts)):
            return self._first_reaching_slowly(non_system, cuts, positions, anchored=anchored)
        draft = self.draft
        tally = _Tally(self)
        worth = anchor = False
        taken = 0
        for number, cut in enumerate(cuts):
            while taken < len(non_system) and positions[taken] < cut:
                group = non_system[taken]
                taken += 1
                if draft.is_fixed(group):
                    continue
                anchor = anchor or group.kind in _TURN_ANCHORS
                if not _foldable(draft, group):
                    continue  # a carried user message: it stays where it is
                tally.add(group)
                worth = worth or group.kind is not GroupKind.SUMMARY
            if worth and (anchor or not anchored) and tally.reached():
                return number
        return None

    def _first_reaching_slowly(
        self,
        non_system: Sequence[Group],
        cuts: Sequence[int],
        positions: Sequence[int],
        *,
        anchored: bool,
    ) -> int | None:
        for number, cut in enumerate(cuts):
            stretch = [
                g
                for g, at in zip(non_system, positions, strict=True)
                if at < cut and not self.draft.is_fixed(g)
            ]
            folded = [g for g in stretch if _foldable(self.draft, g)]
            if all(g.kind is GroupKind.SUMMARY for g in folded):
                continue
            if anchored and not any(g.kind in _TURN_ANCHORS for g in stretch):
                continue
            if self.reached(folded):
                return number
        return None


class _Tally:
    """What a growing fold takes away, summed as groups join it (see :class:`_TargetStop`)."""

    def __init__(self, stop: _TargetStop) -> None:
        self.stop = stop
        self.tokens = 0
        self.messages = 0
        self.groups = 0
        self.tool_calls = 0
        self.gone_turns = 0
        self.per_turn: dict[int, int] = {}

    def add(self, group: Group) -> None:
        self.tokens += self.stop.draft.group_tokens(group)
        self.messages += group.message_count
        self.groups += 1
        if group.kind is GroupKind.TOOL_CALL:
            self.tool_calls += 1
        if group.turn:
            seen = self.per_turn.get(group.turn, 0) + 1
            self.per_turn[group.turn] = seen
            # A turn is gone once every live group of it is folded (counted once, when the
            # fold first covers them all).
            if seen == max(1, self.stop.turn_live.get(group.turn, 0)):
                self.gone_turns += 1

    def reached(self) -> bool:
        stop = self.stop
        draft, base = stop.draft, stop.base
        added = stop.overhead + stop.strategy.summary_estimate(self.tokens, stop.bound)
        remaining = base.messages
        projected: Metrics = replace(
            base,
            tokens=draft.calibration.apply(draft.prompt_tokens - self.tokens + added),
            messages=base.messages - self.messages + 1,
            groups=base.groups - self.groups + 1,
            turns=base.turns - self.gone_turns,
            tool_call_groups=base.tool_call_groups - self.tool_calls,
            overflow_messages=lambda: remaining,
        )
        return not stop.target.fires(projected)


def _ascending(values: Sequence[int]) -> bool:
    return all(a <= b for a, b in pairwise(values))


def _index(group: Group) -> int:
    return group.index


def _first(group: Group) -> int:
    return group.first


def _fold_steps_before(draft: Draft, non_system: list[Group], cut: int) -> list[Group]:
    """What a step-shape cut at message ``cut`` folds (the task is protected, so never)."""
    folded = [g for g in non_system if g.first < cut and _foldable(draft, g)]
    if all(g.kind is GroupKind.SUMMARY for g in folded):
        return []  # only an earlier summary (or nothing) before the kept steps
    return folded


def _foldable(draft: Draft, group: Group) -> bool:
    """A group a summary may take in: not protected by the invariants, and not pinned unless
    it is an earlier summary (a carried user message stays where it is, verbatim)."""
    if draft.is_fixed(group):
        return False
    return not draft.is_pinned(group) or group.kind is GroupKind.SUMMARY


def _is_turn_boundary(group: Group) -> bool:
    return group.kind is GroupKind.USER


def _is_group_boundary(group: Group) -> bool:
    return group.kind is not GroupKind.SYSTEM and group.kind is not GroupKind.SUMMARY


def _position_at_or_before(candidates: Sequence[Group], position: int) -> int | None:
    found: int | None = None
    for index, group in enumerate(candidates):
        if group.first > position:
            break
        found = index
    return found


def _tail_tokens(draft: Draft, candidates: Sequence[Group]) -> list[int]:
    """Tokens of the non-system groups from each candidate cut to the end (one reverse pass)."""
    total = 0
    out = [0] * len(candidates)
    position = len(candidates) - 1
    for group in reversed(draft.groups):
        if group.kind is not GroupKind.SYSTEM and draft.is_kept(group):
            total += draft.group_tokens(group)
        if position >= 0 and candidates[position].index == group.index:
            out[position] = total
            position -= 1
    return out


def _non_system_messages(draft: Draft) -> int:
    return sum(
        g.message_count for g in draft.groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)
    )


def _shown(draft: Draft, groups: Sequence[Group]) -> list[int]:
    """The message indices a summary of ``groups`` is made from: their members (an earlier
    summary goes as ``previous_summary``), and the carried user messages among them, which
    stay in place but tell the summarizer what was asked."""
    indices = sorted(i for g in groups if g.kind is not GroupKind.SUMMARY for i in g.members)
    if not indices:
        return indices
    low, high = indices[0], indices[-1]
    carried = [
        i
        for g in draft.groups
        if g.kind is GroupKind.USER and draft.is_pinned(g) and low < g.first < high
        for i in g.members
    ]
    return sorted({*indices, *carried})


def _as_dict(message: Message) -> dict[str, Any]:
    return cast(dict[str, Any], message) if isinstance(message, dict) else dict(message)


def _nothing() -> StrategyOutcome:
    return StrategyOutcome(changed=False, notes=("nothing to summarize before the kept turns",))


def _unavailable(folded: Sequence[Group]) -> StrategyOutcome:
    count = sum(g.message_count for g in folded)
    return StrategyOutcome(
        changed=False,
        notes=(f"summarizer not available: skipped ({count} message(s) left to later strategies)",),
    )


def _failed(reason: str, message: str, count: int) -> StrategyOutcome:
    return StrategyOutcome(
        changed=False,
        notes=(f"{count} message(s) left unsummarized",) if count else (),
        failed=reason,
        failure_message=message,
    )
