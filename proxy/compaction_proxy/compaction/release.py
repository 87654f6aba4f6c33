"""Step 4 of the pipeline: pins released, in a fixed order, when the budget cannot be met
otherwise (see :mod:`.pipeline` and "The ledger" in docs/compaction.md).

Still over budget after the strategies and the fallback: the carried user messages go (oldest
first); then the ledger's artifacts and statements; then the last resort trims the largest tool
results; then the summaries (each one that goes is reported as not forwarded); then the
ledger's pinned items (the statements the user flagged, then the rules), the last thing that
goes.  Then the ledger's released items that fit in what the release left are put back (the
most valued first): an item goes whole, so the last one to go often freed more than needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .chat_messages import Message
from .draft import Draft
from .report import StrategyFailure, StrategyReport
from .strategies._support.last_resort import OversizedResultTrim
from .strategies.base import StrategyContext
from .strategies.composite import FallbackTruncation, run_strategy_async
from .view import GroupKind

__all__ = ["Released", "release_pins"]


@dataclass(slots=True)
class Released:
    """What the release did: the fallback's report (merged), the last resort's, and the
    summaries made and not forwarded."""

    fallback: StrategyReport | None
    last_resort: StrategyReport | None = None
    unforwarded: list[StrategyFailure] = field(default_factory=list)


async def release_pins(
    draft: Draft, fallback: bool, fallback_report: StrategyReport | None
) -> Released:
    """Release pins in the module docstring's order while ``draft`` is over budget
    (``fallback``: the pipeline's fallback truncation is on; without it nothing is dropped)."""
    out = Released(fallback_report)
    if fallback and draft.over_budget() and draft.unpin(GroupKind.USER):
        released = await run_strategy_async(FallbackTruncation(), draft, StrategyContext())
        out.fallback = _merged(out.fallback, released, "carried user messages released")
    if fallback and draft.ledger is not None and draft.over_budget():
        draft.ledger.release(draft.over_budget, pinned=False)
    trim = OversizedResultTrim()
    if trim.should_run(draft, StrategyContext()):
        out.last_resort = await run_strategy_async(trim, draft, StrategyContext())
    if fallback and draft.over_budget():
        summaries = [
            (draft.message(g.first), g.token_count) for g in draft.unpin(GroupKind.SUMMARY)
        ]
        if summaries:
            released = await run_strategy_async(FallbackTruncation(), draft, StrategyContext())
            out.fallback = _merged(out.fallback, released, "summaries released")
            out.unforwarded = _gone(draft, summaries)
    if fallback and draft.ledger is not None and draft.over_budget():
        draft.ledger.release(draft.over_budget, pinned=True)
    if draft.ledger is not None and draft.ledger.released:
        draft.ledger.refill(draft.over_budget)
    return out


def _merged(first: StrategyReport | None, then: StrategyReport, note: str) -> StrategyReport:
    """One fallback report for the fallback and the run after a release of pins."""
    then = replace(then, notes=(note, *then.notes))
    if first is None:
        return then
    return replace(
        first,
        fired=True,
        changed=first.changed or then.changed,
        tokens_after=then.tokens_after,
        groups_affected=first.groups_affected + then.groups_affected,
        messages_affected=first.messages_affected + then.messages_affected,
        notes=(*first.notes, *then.notes),
        warnings=(*first.warnings, *then.warnings),
    )


def _gone(draft: Draft, summaries: Sequence[tuple[Message, int]]) -> list[StrategyFailure]:
    """The released summaries the fallback dropped: paid for and not forwarded."""
    present = {id(m) for m in draft.project()}
    return [
        StrategyFailure(
            "summarization",
            "discarded",
            f"a summary of {tokens} tokens was made and not forwarded: the system messages, "
            "the newest user message and the newest step leave no room for it",
        )
        for message, tokens in summaries
        if id(message) not in present
    ]
