"""The conversation view: the client's messages annotated with atomic groups and turns.

Compaction never edits the message list directly.  It reads this view, which says which
messages must live or die together (a tool call and every result answering it), which turn each
group belongs to and what each group costs in bytes and tokens.  The view holds the client's
dicts by reference and never mutates them, so unknown fields survive by construction.

Grouping rules (see "Groups and invariants" in compaction_proxy/compaction/README.md):

* ``system`` and ``developer`` messages: one ``system`` group each, turn ``None``.
* ``user``: one group, starts a new turn (turns count from 1; groups before the first user
  message are in turn 0).
* ``assistant`` with a non-empty ``tool_calls`` list or a legacy ``function_call``: opens a
  ``tool_call`` group.  Every ``tool`` message whose ``tool_call_id`` answers one of its calls
  joins it, wherever it sits, so a group's members may be non-contiguous.  A ``function``
  message answers the latest unanswered ``function_call`` with the same name.  When the same
  call id is declared twice before being answered, the newest declaration wins.
* Any other assistant message (and any unknown role): ``assistant_text``.
* A tool/function message that answers nothing is an *orphan*: it is left exactly as sent and
  joins the group of the message before it (or, right after a system message or at the start,
  forms an ``assistant_text`` group of its own), so it shares its neighbour's fate.
* A message the proxy inserted as a checkpoint (recognised by :class:`SummaryMarker`) is a
  ``summary`` group.
* The proxy's ledger message (its exact wrapper, :func:`~.ledger.render.is_ledger`, in a role
  the summary marker allows, never the newest user message) is a ``ledger`` group, turn
  ``None``: fixed like a system group for every strategy (see "The ledger" in
  docs/compaction.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from .canonical import canonical_bytes
from .chat_messages import (
    SYSTEM_ROLES,
    Message,
    has_tool_calls,
    legacy_function_name,
    role_of,
    tool_call_ids,
)
from .ledger.render import is_ledger
from .marks import strip_mark
from .tokens import Tokenizer


class GroupKind(StrEnum):
    """What an atomic group is; strategies select their work by kind."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT_TEXT = "assistant_text"
    TOOL_CALL = "tool_call"
    SUMMARY = "summary"
    LEDGER = "ledger"


SUMMARY_PREFIX = "<summary>"
"""Default opening of a checkpoint message written by the proxy."""

CHECKPOINT_NOTE = (
    "You wrote the checkpoint above earlier in this conversation, when older messages were "
    "condensed to keep the context small. Treat it as your own notes: carry on from where the "
    "work stands, do not redo finished steps, and do not mention or reply to the checkpoint "
    "itself."
)
"""What follows every summary the proxy writes, telling the model how to read it."""

SUMMARY_SUFFIX = f"\n</summary>\n\n{CHECKPOINT_NOTE}"
"""The exact end of a checkpoint the proxy wrote (see :meth:`SummaryMarker.is_ours`)."""


@dataclass(frozen=True, slots=True)
class SummaryMarker:
    """Recognises the summary checkpoints the proxy itself inserted.

    The marker lives in the content (not in an extra dict key) because the projected messages
    go upstream as they are and an unknown key could be rejected there.  To keep a client's
    message from being mistaken for a checkpoint, only the roles listed here qualify and the
    newest user message never does (it is protected).  System-role summaries
    are off by default: a client's system prompt that happens to start with the prefix must
    stay a system message (invariant 1); the summary placement ``system`` opts in.
    """

    prefix: str = SUMMARY_PREFIX
    roles: frozenset[str] = frozenset({"user", "assistant"})

    def matches(self, message: Message) -> bool:
        """True when ``message`` carries the checkpoint marker."""
        content = message.get("content")
        return (
            isinstance(content, str)
            and content.startswith(self.prefix)
            and role_of(message) in self.roles
        )

    def is_ours(self, message: Message) -> bool:
        """True only for a checkpoint in the proxy's exact wrapper (marker and closing note,
        then at most the span mark recall puts after it, compaction_proxy/compaction/marks.py).

        The marker alone could be a client's pasted text; the closing note makes it certain,
        which matters where a wrong guess would break an invariant: the newest user message.
        """
        content = message.get("content")
        return (
            self.matches(message)
            and isinstance(content, str)
            and strip_mark(content).endswith(SUMMARY_SUFFIX)
        )


DEFAULT_SUMMARY_MARKER = SummaryMarker()


@dataclass(frozen=True, slots=True)
class MessageStats:
    """Cost of one message: canonical JSON byte length and token count."""

    byte_count: int
    token_count: int


@dataclass(frozen=True, slots=True)
class Group:
    """One atomic group of the view.

    ``members`` are message indices in ascending order; they may be non-contiguous when a tool
    result answers a call made before some unrelated message.
    """

    index: int
    kind: GroupKind
    members: tuple[int, ...]
    turn: int | None
    byte_count: int
    token_count: int

    @property
    def message_count(self) -> int:
        """Number of messages in the group."""
        return len(self.members)

    @property
    def first(self) -> int:
        """Index of the group's first message (where a replacement is placed)."""
        return self.members[0]

    @property
    def last(self) -> int:
        """Index of the group's last message."""
        return self.members[-1]


@dataclass(frozen=True, slots=True)
class ConversationView:
    """Messages plus their grouping; immutable, built once per state by :func:`build_view`.

    What is protected (invariant 4) is deliberately small, because in an agent loop the newest
    turn *is* the conversation: one task message, then hundreds of tool steps.  Protected are
    the newest user message (``tail_start``, the task) and the newest step (``step``: the
    group of the last non-system message, i.e. the last assistant message and the results the
    model must answer now).  The steps between them are ordinary groups that every strategy
    may compact.  Without any user message ``tail_start`` is the newest non-system group's
    first message, which is then also the newest step, so nothing empties the conversation.

    ``insert_limit`` is the last position where a synthetic message (a summary) may go: right
    after the newest user message at most, never between the newest step's messages.
    """

    messages: tuple[Message, ...]
    stats: tuple[MessageStats, ...]
    groups: tuple[Group, ...]
    group_of: tuple[int, ...]
    tail_start: int
    turn_count: int
    protected: frozenset[int] = frozenset()
    """Indices of the non-system groups no strategy may touch (the task and the newest step)."""
    step: int | None = None
    """Index of the newest step's group (``None`` when the newest message is the user's)."""

    @property
    def token_count(self) -> int:
        """Sum of the message token counts (without tools schema and reply priming)."""
        return sum(group.token_count for group in self.groups)

    def is_protected(self, group: Group) -> bool:
        """True when no strategy may drop, replace or edit ``group``.

        System groups (invariant 1), the newest user message and the newest step (invariant
        4).  Older steps of the newest turn are not protected (see the class docstring).
        """
        return group.kind in _FIXED or group.index in self.protected

    @property
    def insert_limit(self) -> int:
        """The largest position :meth:`~.draft.Draft.insert` accepts (see the class docstring)."""
        if self.step is not None:
            # The step's first message after the task: a step whose call came before the task
            # (a late result) still leaves room for "progress so far" right after the task.
            return next(m for m in self.groups[self.step].members if m > self.tail_start)
        return self.tail_start

    def in_newest_turn(self, group: Group) -> bool:
        """True for a group that starts after the newest user message (a step of that turn)."""
        return group.first > self.tail_start

    @property
    def leading_system_end(self) -> int:
        """Index of the first message outside the leading run of system groups.

        Synthetic messages (summaries) are inserted here, right after the system prompt.
        """
        for index, group_index in enumerate(self.group_of):
            if self.groups[group_index].kind is not GroupKind.SYSTEM:
                return index
        return len(self.messages)


_FIXED = frozenset({GroupKind.SYSTEM, GroupKind.LEDGER})
"""Kinds no strategy touches: the system prompt and the proxy's ledger."""


def build_view(
    messages: Sequence[Message],
    tokenizer: Tokenizer,
    *,
    summary_marker: SummaryMarker | None = DEFAULT_SUMMARY_MARKER,
    known_stats: Sequence[MessageStats | None] | None = None,
) -> ConversationView:
    """Group ``messages`` and count them.

    ``known_stats`` lets a caller that already measured some messages (the draft, after a
    strategy ran) skip serializing them again; ``None`` entries are measured here.  Each
    message is serialized once and counted through the tokenizer's cache, so a new turn of a
    known conversation only pays for its new messages.
    """
    msgs = tuple(messages)
    stats = _measure(msgs, tokenizer, known_stats)
    last_user = _last_user_index(msgs, summary_marker)
    members, kinds, turns, group_of, turn_count = _group(msgs, last_user, summary_marker)
    groups = tuple(
        _new_group(g, kinds[g], member_list, turns[g], stats)
        for g, member_list in enumerate(members)
    )
    tail_start = _tail_start(last_user, groups, len(msgs))
    protected, step = _protected(msgs, groups, group_of, tail_start)
    return ConversationView(
        messages=msgs,
        stats=stats,
        groups=groups,
        group_of=tuple(group_of),
        tail_start=tail_start,
        turn_count=turn_count,
        protected=protected,
        step=step,
    )


NO_TURN: int | None = None
"""The turn of a group outside the turns (the system prompt, the ledger)."""

_LEDGER_ROLES = frozenset({"user", "assistant"})
"""Roles a ledger message may have without a summary marker (with one: the marker's)."""

_Grouping = tuple[list[list[int]], list[GroupKind], list[int | None], list[int], int]
"""Per group its member indices, kind and turn; per message its group; the turn count."""


def _group(
    msgs: tuple[Message, ...], last_user: int | None, summary_marker: SummaryMarker | None
) -> _Grouping:
    """Assign every message to its group (a tool call with its results) in one pass."""
    # role_of, has_tool_calls, tool_call_ids, SummaryMarker.matches... inlined: a hot loop.
    marker_prefix: str | None = None
    marker_roles: frozenset[str] = frozenset()
    generic_marker: SummaryMarker | None = None
    if summary_marker is not None:
        if type(summary_marker) is SummaryMarker:
            marker_prefix = summary_marker.prefix
            marker_roles = summary_marker.roles
        else:
            generic_marker = summary_marker
    ledger_roles = marker_roles or _LEDGER_ROLES  # a ledger's roles: the summaries'
    members: list[list[int]] = []
    kinds: list[GroupKind] = []
    turns: list[int | None] = []
    group_of: list[int] = [0] * len(msgs)
    pending_calls: dict[str, int] = {}
    pending_functions: dict[str, list[int]] = {}
    turn = 0
    system_kind = GroupKind.SYSTEM
    user_kind = GroupKind.USER
    summary_kind = GroupKind.SUMMARY
    tool_kind = GroupKind.TOOL_CALL
    text_kind = GroupKind.ASSISTANT_TEXT

    for index, message in enumerate(msgs):
        role = message.get("role")
        if type(role) is not str and not isinstance(role, str):
            role = ""
        if role in ledger_roles and index != last_user and is_ledger(message.get("content")):
            kind, group_turn = GroupKind.LEDGER, NO_TURN
        elif index != last_user and (
            (
                marker_prefix is not None
                and role in marker_roles
                and isinstance(content := message.get("content"), str)
                and content.startswith(marker_prefix)
            )
            or (generic_marker is not None and generic_marker.matches(message))
        ):
            kind, group_turn = summary_kind, turn
        elif role in SYSTEM_ROLES:
            kind, group_turn = system_kind, None
        elif role == "user":
            turn += 1
            kind, group_turn = user_kind, turn
        elif role == "assistant":
            if has_tool_calls(message):
                group = len(members)
                members.append([index])
                kinds.append(tool_kind)
                turns.append(turn)
                group_of[index] = group
                for call_id in tool_call_ids(message):
                    pending_calls[call_id] = group
                name = legacy_function_name(message)
                if name is not None:
                    pending_functions.setdefault(name, []).append(group)
                continue
            kind, group_turn = text_kind, turn
        elif role == "tool" or role == "function":
            answered = _answered_group(message, role, pending_calls, pending_functions)
            if answered is None and index > 0 and kinds[group_of[index - 1]] is not system_kind:
                answered = group_of[index - 1]  # orphan: shares its neighbour's fate
            if answered is not None:
                members[answered].append(index)
                group_of[index] = answered
                continue
            kind, group_turn = text_kind, turn
        else:
            kind, group_turn = text_kind, turn
        group_of[index] = len(members)
        members.append([index])
        kinds.append(kind)
        turns.append(group_turn)
    return members, kinds, turns, group_of, turn


def _protected(
    msgs: tuple[Message, ...],
    groups: tuple[Group, ...],
    group_of: list[int],
    tail_start: int,
) -> tuple[frozenset[int], int | None]:
    """The groups of the newest user message and of the newest step (invariant 4)."""
    chosen: set[int] = set()
    if tail_start < len(msgs):
        chosen.add(group_of[tail_start])
    step: int | None = None
    for index in range(len(msgs) - 1, -1, -1):
        group = groups[group_of[index]]
        if group.kind in _FIXED:
            continue
        if group.index not in chosen:
            step = group.index
            chosen.add(step)
        break
    return frozenset(g for g in chosen if groups[g].kind not in _FIXED), step


def _new_group(
    index: int,
    kind: GroupKind,
    member_list: list[int],
    turn: int | None,
    stats: tuple[MessageStats, ...],
) -> Group:
    if len(member_list) == 1:
        stat = stats[member_list[0]]
        byte_count, token_count = stat.byte_count, stat.token_count
    else:
        byte_count = token_count = 0
        for i in member_list:
            stat = stats[i]
            byte_count += stat.byte_count
            token_count += stat.token_count
    return Group(index, kind, tuple(member_list), turn, byte_count, token_count)


def _measure(
    msgs: tuple[Message, ...],
    tokenizer: Tokenizer,
    known: Sequence[MessageStats | None] | None,
) -> tuple[MessageStats, ...]:
    out: list[MessageStats | None]
    if known is None:
        out = [None] * len(msgs)
    else:
        out = list(known[: len(msgs)])
        out.extend([None] * (len(msgs) - len(out)))
    todo = [index for index, stat in enumerate(out) if stat is None]
    if todo:
        todo_msgs = [msgs[index] for index in todo]
        datas = [canonical_bytes(message) for message in todo_msgs]
        batch = getattr(tokenizer, "count_message_batch", None)
        if batch is not None:
            counts: list[int] = batch(todo_msgs, datas)
        else:
            counts = [tokenizer.count_message(m, d) for m, d in zip(todo_msgs, datas, strict=True)]
        for index, data, count in zip(todo, datas, counts, strict=True):
            out[index] = MessageStats(len(data), count)
    return tuple(out)  # type: ignore[arg-type]  # every None was filled


def _last_user_index(msgs: tuple[Message, ...], marker: SummaryMarker | None = None) -> int | None:
    """The newest user message, skipping the proxy's own user-role checkpoints.

    A "progress so far" summary sits right after the task message in an agent loop, and with
    no user message at all a summary is the only user-role message, so the newest user-role
    message can be ours; the client's is the newest one that is not.  Only a checkpoint in the
    proxy's exact wrapper is skipped: a client message that merely starts like one is still
    the client's newest message, and stays protected.
    """
    for index in range(len(msgs) - 1, -1, -1):
        message = msgs[index]
        if (
            message.get("role") == "user"
            and (marker is None or not marker.is_ours(message))
            and not is_ledger(message.get("content"))
        ):
            return index
    return None


def _answered_group(
    message: Message,
    role: str,
    pending_calls: dict[str, int],
    pending_functions: dict[str, list[int]],
) -> int | None:
    """The group a tool/function result answers, consuming the pending declaration."""
    if role == "tool":
        call_id = message.get("tool_call_id")
        return pending_calls.pop(call_id, None) if isinstance(call_id, str) else None
    name = message.get("name")
    stack = pending_functions.get(name) if isinstance(name, str) else None
    return stack.pop() if stack else None


def _tail_start(last_user: int | None, groups: tuple[Group, ...], size: int) -> int:
    if last_user is not None:
        return last_user
    for group in reversed(groups):
        if group.kind not in _FIXED:
            return group.first
    return size
