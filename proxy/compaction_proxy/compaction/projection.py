"""How a draft's decisions become messages again.

A :class:`~.draft.Draft` records decisions instead of building lists: per group a state (kept,
dropped, replaced by new messages), per message an edited copy, and messages inserted before a
position. These functions turn the records into output and know nothing else of the draft:
:func:`project` renders them in the original relative order, :func:`edited_view` applies edits
alone to a view whose grouping they leave valid, and :func:`grouping_key` says whether an edit
leaves the grouping valid (it changed nothing the grouping reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from .changes import GroupState
from .chat_messages import Message, has_tool_calls, legacy_function_name, role_of, tool_call_ids
from .view import ConversationView, MessageStats, SummaryMarker

Edits = Mapping[int, tuple[Message, MessageStats]]
"""Message index -> its edited copy and that copy's stats."""
Replacements = Mapping[int, tuple[list[Message], list[MessageStats]]]
"""Group index -> the messages (and stats) that stand in the group's place."""
Inserts = Mapping[int, list[tuple[Message, MessageStats]]]
"""Message index (or the message count, for the end) -> messages inserted before it."""


def project(
    view: ConversationView,
    state: Sequence[GroupState],
    edits: Edits,
    replacements: Replacements,
    inserts: Inserts,
) -> tuple[list[Message], list[MessageStats]]:
    """The output messages and their stats: original relative order, a replaced group's
    messages at the group's first position, inserted messages before their position."""
    out: list[Message] = []
    stats: list[MessageStats] = []
    for index, message in enumerate(view.messages):
        for new_message, new_stats in inserts.get(index, ()):
            out.append(new_message)
            stats.append(new_stats)
        group_index = view.group_of[index]
        group_state = state[group_index]
        if group_state is GroupState.KEPT:
            edit = edits.get(index)
            if edit is None:
                out.append(message)
                stats.append(view.stats[index])
            else:
                out.append(edit[0])
                stats.append(edit[1])
        elif group_state is GroupState.REPLACED and view.groups[group_index].first == index:
            new_messages, new_stats_list = replacements[group_index]
            out.extend(new_messages)
            stats.extend(new_stats_list)
    for new_message, new_stats in inserts.get(len(view.messages), ()):
        out.append(new_message)
        stats.append(new_stats)
    return out, stats


def edited_view(view: ConversationView, edits: Edits) -> ConversationView:
    """``view`` with ``edits`` applied, its grouping reused and the edited groups' totals
    recomputed (valid only when no edit changed its message's :func:`grouping_key`)."""
    messages = list(view.messages)
    stats = list(view.stats)
    touched: set[int] = set()
    for index, (message, message_stats) in edits.items():
        messages[index] = message
        stats[index] = message_stats
        touched.add(view.group_of[index])
    groups = list(view.groups)
    for group_index in touched:
        group = groups[group_index]
        groups[group_index] = replace(
            group,
            byte_count=sum(stats[i].byte_count for i in group.members),
            token_count=sum(stats[i].token_count for i in group.members),
        )
    return replace(view, messages=tuple(messages), stats=tuple(stats), groups=tuple(groups))


def grouping_key(message: Message, marker: SummaryMarker | None) -> tuple[object, ...]:
    """Everything :func:`~.view.build_view` reads from a message to group it."""
    return (
        role_of(message),
        tuple(tool_call_ids(message)),
        message.get("tool_call_id"),
        message.get("name"),
        legacy_function_name(message),
        has_tool_calls(message),
        marker is not None and marker.matches(message),
    )
