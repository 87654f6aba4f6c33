"""Tool-result compaction: collapse old tool-call groups into one short assistant message.

Agent Framework (Python ``ToolResultCompactionStrategy``, agent-framework-core 1.23)
semantics: every kept ``tool_call`` group except the newest ``keep_last_tool_call_groups``
(default 1; 0 collapses all) becomes ONE assistant message, placed where the group's first
message was::

    [Tool results: get_weather: sunny; get_time: 9am]

* one label per answered result, in message order: ``f"{name}: {result}".strip()``, or just
  the result when the call's name is unknown (an orphan result the group absorbed);
* a result's text is its string content, or its text parts joined by ``"\\n"`` (the Agent
  Framework's rule for MCP text items);
* a group without any result gives ``[Tool results: no results]``;
* the whole text is capped at ``max_summary_chars`` (4096); a summary that fits is the Agent
  Framework's text exactly.  (The Agent Framework cuts an over-long text once at the end: its
  head, right-stripped, then ``... [truncated]]``.  Ours cuts differently, see below.)

The summary is an ordinary, valid OpenAI assistant message (``content`` a string, no
``tool_calls``), so it forms an ``assistant_text`` group and is never collapsed again: a
second run changes nothing (idempotent).

Our additions (see "Triggers and targets" in compaction_proxy/compaction/README.md): a trigger, a
target and a
``minimum_preserved``
floor.  By default the strategy behaves like the Agent Framework's: it fires always and
collapses everything but the newest N groups (``trigger``/``target`` default to ``always``).
With a configured trigger and no target it collapses oldest first until the trigger no longer
fires; with a target, until the target no longer fires.  ``minimum_preserved`` (default 0,
the Python anchor has none; .NET uses 16) keeps the newest N non-system groups of any kind
untouched.

Deliberate differences from the Agent Framework (see also the conformance test):

* a result longer than its room keeps its head AND its tail, around
  ``"\\n... [truncated: middle removed] ...\\n"``: 3/5 of the characters it may keep at the
  head (never fewer than the ``name: `` prefix, so the summary still says which tool it was),
  2/5 at the tail, the head right-stripped and the tail left-stripped (the marker in the
  wording of ``context_pruning``'s soft trim, which, like the last resort, keeps both ends for
  the same reason).  The Agent Framework keeps the head alone, but shell, test and compiler
  output put their verdict at the end (a failing test's summary line, the ``echo`` at the end
  of a command, a compiler's last error); in the default pipeline the collapse runs before
  summarization, so a head-only cut hides every such verdict from the summarizer for good.  So
  a single result over the cap no longer comes out exactly as the Agent Framework's: its head
  is shorter by the tail and the marker.  Only a room too small for the name, the marker and
  one character of tail keeps the head alone and ends ``... [truncated]`` (the Agent
  Framework's cut, which a single result then matches exactly again);
* the cap is shared fairly between the results of a group (parallel calls), never spent on
  the first alone: when the labels together exceed it, each label is given an equal share of
  the room (what is left after the prefix, the suffix and the ``"; "`` separators), a label
  shorter than its share is kept whole and what it leaves unused is shared among the longer
  ones (max-min fairness); a label longer than its share is cut to it, head and tail, as
  above.  The Agent Framework cuts the joined text once at the end, so a large first result
  pushes every later result out of the message before any summarizer sees it.  Only when the
  cap cannot give every cut label the end marker plus one character (hundreds of parallel
  results in 4096 characters, or a tiny ``max_summary_chars``) is the joined text cut once,
  as the Agent Framework does, but keeping its head and its tail too (the last result's
  verdict), with the first tool's name in the head;
* the newest step is never collapsed (see "Groups and invariants" in
compaction_proxy/compaction/README.md), even
  with
  ``keep_last_tool_call_groups: 0``; the Agent Framework collapses any tool-call group except
  the newest N;
* the summary message is a plain assistant message without the Agent Framework's
  ``_summary_of_*`` back-links (they are not OpenAI fields); the originals are gone, not
  excluded-but-stored;
* text that the assistant wrote *alongside* its ``tool_calls`` is not kept in the summary (as in
  the Agent Framework, which only lists results);
* grouping follows our view: ``developer`` messages are system messages (never touched),
  while the Agent Framework groups them as ``assistant_text``; an orphan result run that does
  not follow a tool call joins its neighbour's group, where the Agent Framework makes it a
  ``tool_call`` group of its own (and would collapse it);
* a result whose content is ``null`` renders as ``""`` (the Agent Framework renders
  ``str(None)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pydantic import Field

from ..chat_messages import Message, role_of, text_only
from ..draft import Draft
from ..triggers import Condition
from ..view import Group
from ._support.old_tool_groups import OldToolGroupsParams, OldToolGroupsStrategy
from ._support.tool_results import answered_results

SUMMARY_PREFIX = "[Tool results: "
SUMMARY_SUFFIX = "]"
SEPARATOR = "; "
TRUNCATION_MARKER = "... [truncated]"
"""The Agent Framework's marker: the text was cut here and nothing of it follows."""
MIDDLE_MARKER = "\n... [truncated: middle removed] ...\n"
"""Between the head and the tail of a cut label (soft-trim's wording: the middle is gone, what
follows is the end of the result)."""
HEAD_FIFTHS = 3
"""A cut label keeps 3/5 of its room at the head, 2/5 at the tail."""
DEFAULT_MAX_SUMMARY_CHARS = 4096


class ToolResultCompactionParams(OldToolGroupsParams):
    """``strategy: tool_result_compaction``: collapse old tool-call groups into one
    ``[Tool results: ...]`` message of at most ``max_summary_chars``."""

    max_summary_chars: int = Field(default=DEFAULT_MAX_SUMMARY_CHARS, gt=0)


class Label(NamedTuple):
    """One result's entry in the summary: ``text`` (``"name: result"``, stripped) and how many
    of its first characters name the tool (``"name: "``), which every cut keeps."""

    text: str
    head: int = 0


def summary_text(labels: Sequence[Label | str], max_chars: int = DEFAULT_MAX_SUMMARY_CHARS) -> str:
    """``[Tool results: a; b]`` capped at ``max_chars``, the cap shared fairly between the
    labels and each cut one keeping its head and its tail (see the module docstring).  A plain
    string is a label without a tool name."""
    entries = [label if isinstance(label, Label) else Label(label) for label in labels]
    body = SEPARATOR.join(label.text for label in entries) if entries else "no results"
    text = f"{SUMMARY_PREFIX}{body}{SUMMARY_SUFFIX}"
    if len(text) <= max_chars:
        return text
    room = max_chars - len(SUMMARY_PREFIX) - len(SUMMARY_SUFFIX)
    if entries:
        shares = fair_shares(
            [len(label.text) for label in entries], room - len(SEPARATOR) * (len(entries) - 1)
        )
        if all(
            share >= len(label.text) or share > len(TRUNCATION_MARKER)
            for label, share in zip(entries, shares, strict=True)
        ):
            kept = (
                label.text if share >= len(label.text) else cut_label(label, share)
                for label, share in zip(entries, shares, strict=True)
            )
            return f"{SUMMARY_PREFIX}{SEPARATOR.join(kept)}{SUMMARY_SUFFIX}"
    # Too many results for the cap to mark every cut (or no labels at all): one cut of the
    # joined text, its head (the first tool's name in it) and its tail.
    first = entries[0].head if entries else 0
    return f"{SUMMARY_PREFIX}{cut_label(Label(body, first), room)}{SUMMARY_SUFFIX}"


def fair_shares(lengths: list[int], room: int) -> list[int]:
    """How many characters of ``room`` each label of ``lengths`` may use (max-min fair).

    Labels are visited shortest first: one that fits an equal share of what is left is kept
    whole, and what it leaves unused goes to the rest.  The labels that do not fit split the
    remainder equally, the odd characters going to the earliest of them in message order, so the
    result depends on the lengths alone (deterministic).  A share of at least a label's length
    means "whole".
    """
    shares = list(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    left = max(room, 0)
    for position, index in enumerate(order):
        if lengths[index] * (len(order) - position) <= left:
            left -= lengths[index]
            continue
        cut = sorted(order[position:])
        base, extra = divmod(left, len(cut))
        for rank, cut_index in enumerate(cut):
            shares[cut_index] = base + (1 if rank < extra else 0)
        break
    return shares


def cut_label(label: Label, share: int) -> str:
    """``label`` cut to at most ``share`` characters (when it is longer).

    Head + :data:`MIDDLE_MARKER` + tail, 3/5 of the kept characters at the head (never fewer
    than the tool's name) and the rest at the tail, where shell and test output put their
    verdict.  A share too small for the name, the marker and one character of tail keeps the
    head alone and ends :data:`TRUNCATION_MARKER` (the Agent Framework's cut), and one too small
    for even that keeps the marker alone.
    """
    text = label.text
    keep = share - len(MIDDLE_MARKER)
    name = min(label.head, len(text))
    if keep > name:
        head = min(max(name, keep * HEAD_FIFTHS // 5), keep - 1)
        tail = text[len(text) - (keep - head) :]
        return text[:head].rstrip() + MIDDLE_MARKER + tail.lstrip()
    return text[: max(share - len(TRUNCATION_MARKER), 0)].rstrip() + TRUNCATION_MARKER


def group_labels(draft: Draft, group: Group) -> list[Label]:
    """One label per tool/function result of ``group`` (answered or orphan), in order."""
    answered = {r.index: r.name for r in answered_results(draft, group)}
    labels: list[Label] = []
    for index in group.members:
        message = draft.message(index)
        if role_of(message) not in ("tool", "function"):
            continue
        name = answered.get(index, "")
        result = text_only(message)
        if name:
            labels.append(Label(f"{name}: {result}".strip(), len(name) + 2))
        else:
            labels.append(Label(result.strip()))
    return labels


def summary_message(draft: Draft, group: Group, max_chars: int) -> Message:
    """The assistant message that replaces ``group``."""
    return {"role": "assistant", "content": summary_text(group_labels(draft, group), max_chars)}


class ToolResultCompactionStrategy(OldToolGroupsStrategy):
    """Collapse old tool-call groups into ``[Tool results: ...]`` (see the module docstring)."""

    name = "tool_result_compaction"
    verb = "collapsed"

    def __init__(
        self,
        *,
        keep_last_tool_call_groups: int = 1,
        max_summary_chars: int = DEFAULT_MAX_SUMMARY_CHARS,
        trigger: Condition | None = None,
        target: Condition | None = None,
        minimum_preserved: int = 0,
    ) -> None:
        super().__init__(
            keep_last_tool_call_groups=keep_last_tool_call_groups,
            trigger=trigger,
            target=target,
            minimum_preserved=minimum_preserved,
        )
        if max_summary_chars <= 0:
            raise ValueError("max_summary_chars must be > 0")
        self.max_summary_chars = max_summary_chars

    def act(self, draft: Draft, group: Group) -> None:
        draft.replace(group, [summary_message(draft, group, self.max_summary_chars)])
