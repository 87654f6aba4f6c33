"""Pins for one run: summaries, and the user messages carried verbatim beside them.

A summary may drop what a user said ("keep X as it is"); the user's own words do not.  So at the
start of a run the newest user messages are pinned, newest first, while together they fit
:data:`DEFAULT_CARRY_SHARE` of the budget (``compaction.carry_user_messages``; the default
pipeline's, an explicit pipeline carries only when its block says so): when their
turns are folded (summarized, or dropped by a sliding window or a truncation) the user messages
stay where they were, verbatim, and only the rest of each turn goes.  The way Codex carries
recent user messages across its compactions, with a budget share instead of a fixed size.  The
newest user message is protected anyway; a share of 0 carries nothing.

Summary checkpoints are pinned too, whoever made them: a later strategy (truncation, a sliding
window, the fallback) never drops what the summarizer was paid for; only the summarization
strategy folds one into its next summary.  The pipeline releases pins only when the budget
cannot be met otherwise, carried user messages (oldest first) before summaries, and the report
names a summary that did not reach the model (:attr:`~.report.CompactionReport.unforwarded`).
"""

from __future__ import annotations

import math

from .chat_messages import Message
from .draft import Draft
from .view import GroupKind

DEFAULT_CARRY_SHARE = 0.15
"""Share of the budget the carried user messages may take (the configuration's default)."""


def pin_summaries(draft: Draft) -> None:
    """Pin every summary checkpoint of the draft's view."""
    draft.pin(
        [
            draft.message(m)
            for g in draft.groups
            if g.kind is GroupKind.SUMMARY and not draft.is_fixed(g)
            for m in g.members
        ]
    )


def carry_user_messages(draft: Draft, share: float) -> int:
    """Pin the newest user messages that fit ``share`` of the budget; returns their tokens."""
    if share <= 0:
        return 0
    limit = math.floor(share * draft.budget.limit)
    total = 0
    chosen: list[Message] = []
    for group in reversed(draft.groups):
        if group.kind is not GroupKind.USER or draft.is_fixed(group):
            continue
        tokens = draft.group_tokens(group)
        if total + tokens > limit:
            break
        total += tokens
        chosen.extend(draft.message(m) for m in group.members)
    draft.pin(chosen)
    return total
