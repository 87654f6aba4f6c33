"""A draft's running totals, kept per decision so a strategy re-checks its target in O(1).

:class:`Totals` holds what the :class:`~.draft.Draft`'s projection would contain (tokens,
messages, groups, tool-call groups, live turns) and each group's current tokens and messages.
A decision moves them by what it changed, from stats the draft already has: only new or
changed messages are ever counted.  A turn is live while one of its groups that counts as a
turn is not dropped; a carried (pinned) user message alone does not keep its turn alive: once
the rest of the turn is folded, the turn is gone (``turns_exceed``, sliding windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .budget import Calibration
from .changes import GroupState
from .view import ConversationView, Group, GroupKind, MessageStats

__all__ = ["Totals"]


def counts_as_turn(group: Group, pinned: Sequence[bool]) -> bool:
    """Whether ``group`` keeps its turn alive (see the module docstring)."""
    return bool(group.turn) and not (group.kind is GroupKind.USER and pinned[group.index])


class Totals:
    """The totals of a draft over ``view`` whose groups are in ``state`` (``pinned``: per
    group, whether it is pinned)."""

    __slots__ = (
        "group_count",
        "group_messages",
        "group_tokens",
        "group_tool",
        "live_turns",
        "message_count",
        "message_tokens",
        "tool_call_groups",
        "turn_live",
    )

    def __init__(
        self, view: ConversationView, state: Sequence[GroupState], pinned: Sequence[bool]
    ) -> None:
        groups = view.groups
        self.group_tokens = [g.token_count for g in groups]
        self.group_messages = [g.message_count for g in groups]
        self.group_tool = [g.kind is GroupKind.TOOL_CALL for g in groups]
        self.message_tokens = sum(s.token_count for s in view.stats)
        self.message_count = len(view.messages)
        self.group_count = len(groups)
        self.tool_call_groups = sum(self.group_tool)
        self.turn_live: dict[int, int] = {}
        self.live_turns = 0
        self.count_turns(groups, state, pinned)

    def count_turns(
        self, groups: Sequence[Group], state: Sequence[GroupState], pinned: Sequence[bool]
    ) -> None:
        """Live groups per turn, from the current decisions (and pins)."""
        turn_live: dict[int, int] = {}
        for group in groups:
            if group.turn and state[group.index] is not GroupState.DROPPED:
                live = turn_live.get(group.turn, 0)
                turn_live[group.turn] = live + counts_as_turn(group, pinned)
        self.turn_live = turn_live
        self.live_turns = sum(1 for n in turn_live.values() if n > 0)

    def remove(self, group: Group, pinned: Sequence[bool]) -> None:
        """``group`` leaves the output (dropped, or replaced: see :meth:`add_replacement`)."""
        index = group.index
        self.message_tokens -= self.group_tokens[index]
        self.message_count -= self.group_messages[index]
        self.group_count -= 1
        if self.group_tool[index]:
            self.tool_call_groups -= 1
        if group.turn and counts_as_turn(group, pinned):
            live = self.turn_live[group.turn] - 1
            self.turn_live[group.turn] = live
            if live == 0:
                self.live_turns -= 1

    def add_replacement(self, group: Group, stats: Sequence[MessageStats], tools: bool) -> None:
        """The removed ``group`` comes back as one group of messages with ``stats`` (``tools``:
        one of them calls tools); it keeps its turn alive."""
        self.message_tokens += sum(s.token_count for s in stats)
        self.message_count += len(stats)
        self.group_count += 1
        if tools:
            self.tool_call_groups += 1
        if group.turn:
            if self.turn_live[group.turn] == 0:
                self.live_turns += 1
            self.turn_live[group.turn] += 1

    def add_inserted(self, stats: Sequence[MessageStats], tool_calls: int) -> None:
        """Inserted messages with ``stats``, one group each (``tool_calls`` of them call
        tools)."""
        self.message_tokens += sum(s.token_count for s in stats)
        self.message_count += len(stats)
        self.group_count += len(stats)
        self.tool_call_groups += tool_calls

    def edited(self, group_index: int, delta: int) -> None:
        """A message of group ``group_index`` changed by ``delta`` tokens."""
        self.group_tokens[group_index] += delta
        self.message_tokens += delta

    def overflow_messages(
        self, removable: Iterable[Group], tokens: int, calibration: Calibration, limit: int
    ) -> int:
        """Messages an oldest-first drop of the ``removable`` groups needs to bring the raw
        prompt ``tokens`` within ``limit`` once calibrated (all of theirs when it cannot)."""
        count = 0
        for group in removable:
            if calibration.apply(tokens) <= limit:
                break
            tokens -= self.group_tokens[group.index]
            count += self.group_messages[group.index]
        return count
