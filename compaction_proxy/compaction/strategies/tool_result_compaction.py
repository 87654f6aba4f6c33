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
* the whole text is capped at ``max_summary_chars`` (4096).  A group with one result is cut
  exactly as the Agent Framework cuts it: the label is cut, right-stripped and the text ends
  ``... [truncated]]``.

The summary is an ordinary, valid OpenAI assistant message (``content`` a string, no
``tool_calls``), so it forms an ``assistant_text`` group and is never collapsed again: a
second run changes nothing (idempotent).

Our additions (see "Triggers and targets" in docs/architecture.md): a trigger, a target and a
``minimum_preserved``
floor.  By default the strategy behaves like the Agent Framework's: it fires always and
collapses everything but the newest N groups (``trigger``/``target`` default to ``always``).
With a configured trigger and no target it collapses oldest first until the trigger no longer
fires; with a target, until the target no longer fires.  ``minimum_preserved`` (default 0,
the Python anchor has none; .NET uses 16) keeps the newest N non-system groups of any kind
untouched.

Deliberate differences from the Agent Framework (see also the conformance test):

* the cap is shared fairly between the results of a group (parallel calls), never spent on
  the first alone: when the labels together exceed it, each label is given an equal share of
  the room (what is left after the prefix, the suffix and the ``"; "`` separators), a label
  shorter than its share is kept whole and what it leaves unused is shared among the longer
  ones (max-min fairness); a label longer than its share keeps its head, right-stripped, and
  ends ``... [truncated]``.  The Agent Framework cuts the joined text once at the end, so a large
  first result pushes every later result out of the message before any summarizer sees it.  A
  single result, and every group that fits the cap, come out exactly as the Agent Framework's.
  Only when the cap cannot give every cut label its marker plus one character (hundreds of
  parallel results in 4096 characters, or a tiny ``max_summary_chars``) is the text cut once at
  the end, as the Agent Framework does;
* the newest step is never collapsed (see "Groups and invariants" in docs/architecture.md), even
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

from pydantic import Field

from ..draft import Draft
from ..messages import Message, content_text, role_of
from ..triggers import Condition
from ..view import Group
from ._tools import answered_results
from .old_tool_groups import OldToolGroupsParams, OldToolGroupsStrategy

SUMMARY_PREFIX = "[Tool results: "
SUMMARY_SUFFIX = "]"
SEPARATOR = "; "
TRUNCATION_MARKER = "... [truncated]"
DEFAULT_MAX_SUMMARY_CHARS = 4096


class ToolResultCompactionParams(OldToolGroupsParams):
    """``strategy: tool_result_compaction``: collapse old tool-call groups into one
    ``[Tool results: ...]`` message of at most ``max_summary_chars``."""

    max_summary_chars: int = Field(default=DEFAULT_MAX_SUMMARY_CHARS, gt=0)


def summary_text(labels: list[str], max_chars: int = DEFAULT_MAX_SUMMARY_CHARS) -> str:
    """``[Tool results: a; b]`` capped at ``max_chars``, the cap shared fairly between the
    labels (see the module docstring)."""
    body = SEPARATOR.join(labels) if labels else "no results"
    text = f"{SUMMARY_PREFIX}{body}{SUMMARY_SUFFIX}"
    if len(text) <= max_chars:
        return text
    if labels:
        room = (
            max_chars
            - len(SUMMARY_PREFIX)
            - len(SUMMARY_SUFFIX)
            - len(SEPARATOR) * (len(labels) - 1)
        )
        shares = fair_shares([len(label) for label in labels], room)
        if all(
            share >= len(label) or share > len(TRUNCATION_MARKER)
            for label, share in zip(labels, shares, strict=True)
        ):
            kept = (
                label if share >= len(label) else cut_label(label, share)
                for label, share in zip(labels, shares, strict=True)
            )
            return f"{SUMMARY_PREFIX}{SEPARATOR.join(kept)}{SUMMARY_SUFFIX}"
    # Too many results for the cap to mark every cut (or no labels at all): one cut at the
    # end, the Agent Framework's rule.
    room = max_chars - len(SUMMARY_PREFIX) - len(TRUNCATION_MARKER) - len(SUMMARY_SUFFIX)
    kept_body = body[:room].rstrip() if room > 0 else ""
    return f"{SUMMARY_PREFIX}{kept_body}{TRUNCATION_MARKER}{SUMMARY_SUFFIX}"


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


def cut_label(label: str, share: int) -> str:
    """The head of ``label`` and the cut marker, in at most ``share`` characters."""
    return label[: share - len(TRUNCATION_MARKER)].rstrip() + TRUNCATION_MARKER


def group_labels(draft: Draft, group: Group) -> list[str]:
    """One label per tool/function result of ``group`` (answered or orphan), in order."""
    answered = {r.index: r.name for r in answered_results(draft, group)}
    labels: list[str] = []
    for index in group.members:
        message = draft.message(index)
        if role_of(message) not in ("tool", "function"):
            continue
        name = answered.get(index, "")
        result = content_text(message)
        labels.append((f"{name}: {result}" if name else result).strip())
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
