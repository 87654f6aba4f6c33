"""How the summarization strategy chooses what to fold: which groups a summary may take in,
where a cut may fall, and whether a fold would reach the strategy's target (see "Stopping at
the target" in :mod:`..summarization`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from typing import Protocol

from ...chat_messages import Message
from ...draft import Draft, GroupState
from ...triggers import Always, Condition, Metrics
from ...view import Group, GroupKind
from .summary_record import CheckItems


class Summarizing(Protocol):
    """What the fold (here and in :mod:`.summary_event`) reads of the summarization strategy."""

    @property
    def name(self) -> str: ...

    @property
    def minimum_preserved(self) -> int: ...

    @property
    def max_rounds(self) -> int: ...

    @property
    def target(self) -> Condition: ...

    def summary_message(self, text: str) -> Message: ...

    def summary_bound(self, draft: Draft) -> int: ...

    def summary_estimate(self, folded_tokens: int, bound: int | None = None) -> int: ...

    def check_items(self, draft: Draft, folded: Sequence[Group]) -> CheckItems: ...


TURN_ANCHORS = frozenset({GroupKind.USER})
"""A turn-shape stretch is worth a call only with a user message in it (a carried one counts):
an earlier summary and the rest of a truncated turn after it are not (a summary is pinned, so
that rest sits after it, and would be folded again on the next run)."""


class TargetStop:
    """Whether folding a stretch would bring the draft to the strategy's target.

    The draft after the fold is projected without touching it: the stretch's tokens, messages,
    groups, tool-call groups and whole turns leave, one checkpoint (the empty wrapper plus the
    strategy's ``summary_estimate``) arrives.  The target is reached when it no longer fires on
    that projection.  ``overflow_messages`` is projected as "all of them", so
    an over-budget ``messages_to_refine`` target counts as not reached (fold further).

    The target is the one a normal run has, in force mode too (``X-Compaction: force`` asks for
    the event a normal run makes, not for a weaker one): a target left implicit is the
    trigger's, not the ``always`` a forced strategy compacts towards, so a forced fold is the
    one the trigger makes (and, on a request under the trigger, the one that reaches the target
    from there).
    """

    def __init__(self, strategy: Summarizing, draft: Draft) -> None:
        self.strategy = strategy
        self.draft = draft
        self.target = strategy.target
        self.base = draft.metrics()
        self.overhead = draft.measure(strategy.summary_message("")).token_count
        self.bound = strategy.summary_bound(draft)
        # Folding can meet the target (it is not ``always``): when no cut reaches it, the
        # deepest one is taken, since the pipeline would otherwise drop what the summary left
        # verbatim to get there.
        self.reachable = not isinstance(self.target, Always)
        self.turn_live: dict[int, int] = {}
        for group in draft.groups:
            if (
                group.turn
                and draft.state(group) is not GroupState.DROPPED
                and counts_as_turn(draft, group)
            ):
                self.turn_live[group.turn] = self.turn_live.get(group.turn, 0) + 1

    def reached(self, folded: Sequence[Group]) -> bool:
        """Whether folding exactly ``folded`` reaches the target."""
        tally = Tally(self)
        for group in folded:
            tally.add(group)
        return tally.reached()

    def with_carried(self, folded: Sequence[Group], cut: int) -> list[Group]:
        """``folded``, and when that misses the target, the carried user messages before message
        ``cut`` (pinned, compaction_proxy/compaction/carry.py), oldest first, until the fold
        reaches it (all of them when it never does).

        The carried messages count inside the event's target: when they cannot all stay, the
        carry's share shrinks, oldest first, before the target is missed, so an event lands
        where one without them would and events do not come closer together for them. The
        summarizer sees them anyway (:func:`shown_indices`)."""
        folded = list(folded)
        if not folded or not self.reachable:
            return folded
        tally = Tally(self)
        for group in folded:
            tally.add(group)
        if tally.reached():
            return folded
        draft = self.draft
        taken: list[Group] = []
        for group in draft.groups:
            if group.first >= cut:
                break
            if is_carried(draft, group):
                taken.append(group)
                tally.add(group)
                if tally.reached():
                    break
        return sorted([*folded, *taken], key=lambda g: g.index)

    def carried_instead(self) -> list[Group]:
        """The fewest carried user messages, oldest first, whose release alone reaches the
        target, with no summary made (empty: none does, or the draft holds no summary yet, so
        what they said is in no summary and only the carry keeps it).

        Carried messages must not multiply summaries: a summary event whose call is needed only
        because of them would come again a few requests later, each time they fill the room
        again. Their turns were folded into the summary the draft holds (its summarizer was
        shown them), so the verbatim copies go, oldest first, before a call is paid for."""
        draft = self.draft
        if not self.reachable or not any(
            g.kind is GroupKind.SUMMARY and draft.is_kept(g) for g in draft.groups
        ):
            return []
        tally = Tally(self, summary=False)
        if tally.reached():
            return []  # at the target already: nothing to release
        taken: list[Group] = []
        for group in draft.groups:
            if is_carried(draft, group):
                taken.append(group)
                tally.add(group)
                if tally.reached():
                    return taken
        return []

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
        tally = Tally(self)
        worth = anchor = False
        taken = 0
        for number, cut in enumerate(cuts):
            while taken < len(non_system) and positions[taken] < cut:
                group = non_system[taken]
                taken += 1
                if draft.is_fixed(group):
                    continue
                anchor = anchor or group.kind in TURN_ANCHORS
                if not foldable(draft, group):
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
            folded = [g for g in stretch if foldable(self.draft, g)]
            if all(g.kind is GroupKind.SUMMARY for g in folded):
                continue
            if anchored and not any(g.kind in TURN_ANCHORS for g in stretch):
                continue
            if self.reached(folded):
                return number
        return None


class Tally:
    """What a growing fold takes away, summed as groups join it (see :class:`TargetStop`);
    ``summary``: one checkpoint arrives in its place (False: the groups only leave)."""

    def __init__(self, stop: TargetStop, *, summary: bool = True) -> None:
        self.stop = stop
        self.summary = summary
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
        if group.turn and counts_as_turn(self.stop.draft, group):
            seen = self.per_turn.get(group.turn, 0) + 1
            self.per_turn[group.turn] = seen
            # A turn is gone once every live group of it is folded (counted once, when the
            # fold first covers them all).
            if seen == max(1, self.stop.turn_live.get(group.turn, 0)):
                self.gone_turns += 1

    def reached(self) -> bool:
        stop = self.stop
        draft, base = stop.draft, stop.base
        # No checkpoint arrives for a fold of nothing (or when only releasing groups).
        summary = self.summary and self.groups > 0
        added = stop.overhead + stop.strategy.summary_estimate(self.tokens, stop.bound)
        if not summary:
            added = 0
        remaining = base.messages
        projected: Metrics = replace(
            base,
            tokens=draft.calibration.apply(draft.prompt_tokens - self.tokens + added),
            messages=base.messages - self.messages + summary,
            groups=base.groups - self.groups + summary,
            turns=base.turns - self.gone_turns,
            tool_call_groups=base.tool_call_groups - self.tool_calls,
            overflow_messages=lambda: remaining,
        )
        return not stop.target.fires(projected)


def _ascending(values: Sequence[int]) -> bool:
    return all(a <= b for a, b in pairwise(values))


def fold_steps_before(draft: Draft, non_system: list[Group], cut: int) -> list[Group]:
    """What a step-shape cut at message ``cut`` folds (the task is protected, so never)."""
    folded = [g for g in non_system if g.first < cut and foldable(draft, g)]
    if all(g.kind is GroupKind.SUMMARY for g in folded):
        return []  # only an earlier summary (or nothing) before the kept steps
    return folded


def foldable(draft: Draft, group: Group) -> bool:
    """A group a summary may take in: not protected by the invariants, and not pinned unless
    it is an earlier summary (a carried user message stays where it is, verbatim)."""
    if draft.is_fixed(group):
        return False
    return not draft.is_pinned(group) or group.kind is GroupKind.SUMMARY


def is_carried(draft: Draft, group: Group) -> bool:
    """A user message carried verbatim beside the summaries (pinned for the run, not protected
    by the invariants, still kept)."""
    return (
        group.kind is GroupKind.USER
        and draft.is_pinned(group)
        and not draft.is_fixed(group)
        and draft.is_kept(group)
    )


def counts_as_turn(draft: Draft, group: Group) -> bool:
    """Whether ``group`` keeps its turn alive: a carried user message does not (it is not a
    turn, compaction_proxy/compaction/carry.py)."""
    return not (group.kind is GroupKind.USER and draft.is_pinned(group))


def is_turn_boundary(group: Group) -> bool:
    return group.kind is GroupKind.USER


def is_group_boundary(group: Group) -> bool:
    return group.kind is not GroupKind.SYSTEM and group.kind is not GroupKind.SUMMARY


def position_at_or_before(candidates: Sequence[Group], position: int) -> int | None:
    found: int | None = None
    for index, group in enumerate(candidates):
        if group.first > position:
            break
        found = index
    return found


def tail_tokens(draft: Draft, candidates: Sequence[Group]) -> list[int]:
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


def non_system_messages(draft: Draft) -> int:
    return sum(
        g.message_count for g in draft.groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)
    )


def shown_indices(draft: Draft, groups: Sequence[Group]) -> list[int]:
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
