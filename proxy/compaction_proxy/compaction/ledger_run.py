"""The ledger's part of one pipeline run (see "The ledger" in docs/compaction.md).

:func:`start_ledger` gives the draft a :class:`~.ledger.state.DraftLedger` that starts from the
ledger message the request carries (parsed back), so every drop, replacement and edit of the
run adds what it folds, counted inside the targets the strategies check.  :func:`place_ledger`
puts the block in the output once nothing more is folded: in place of the ledger message when
the request had one (it keeps its position, and its bytes when nothing changed), else right
after the proxy's summary, else where a summary would go (after the system messages; after the
task when the conversation is one turn, an agent loop's).  A run that folds nothing forwards
the request's ledger message as it came, so the cached prefix does not move.
"""

from __future__ import annotations

from collections.abc import Sequence

from .draft import Draft
from .ledger.state import DraftLedger
from .strategies.base import Strategy
from .view import GroupKind

__all__ = ["ledger_role", "ledger_warnings", "place_ledger", "start_ledger"]


def ledger_role(strategies: Sequence[Strategy]) -> str:
    """The role of a new ledger message: the summary placement's (``user`` unless every
    summarizing strategy places its checkpoints in another role)."""
    roles = frozenset().union(*(s.summary_roles for s in strategies))
    return "user" if not roles or "user" in roles else sorted(roles)[0]


def _ledger_index(draft: Draft) -> int | None:
    """Where the draft's current view holds a ledger message (the newest, if several)."""
    found = [g.first for g in draft.groups if g.kind is GroupKind.LEDGER]
    return found[-1] if found else None


def start_ledger(draft: Draft, share: float, role: str) -> DraftLedger:
    """Give ``draft`` its ledger (``share`` of its budget at most; see the module docstring)."""
    index = _ledger_index(draft)
    existing = None
    if index is not None:
        existing = (draft.message(index), draft.message_stats(index).token_count)
    recall_of = draft.recall_id if draft.recall else None
    ledger = DraftLedger(
        draft.tokenizer,
        share=share,
        budget=draft.budget.limit,
        role=role,
        existing=existing,
        recall_of=recall_of,
    )
    draft.ledger = ledger
    return ledger


def place_ledger(draft: Draft) -> DraftLedger | None:
    """Put the run's ledger in ``draft``'s output (see the module docstring); from then on the
    message counts itself.  Returns the run's ledger (``None``: the run kept none)."""
    ledger = draft.ledger
    if ledger is None:
        return None
    if not ledger.changed:
        draft.ledger = None
        return ledger
    draft.commit()
    message = ledger.message()
    draft.ledger = None
    index = _ledger_index(draft)
    if index is not None:
        if message is None:
            message = ledger.empty_message()
        if message is not draft.message(index):
            draft.rewrite_ledger(index, message)
    elif message is not None:
        draft.insert(_position(draft), [message])
    return ledger


def _position(draft: Draft) -> int:
    """Where a new ledger goes: after the newest kept summary, else where a summary would."""
    view = draft.view
    summaries = [g for g in draft.groups if g.kind is GroupKind.SUMMARY and draft.is_kept(g)]
    if summaries:
        return min(summaries[-1].last + 1, view.insert_limit)
    first_other = next(
        (g for g in draft.groups if g.kind not in (GroupKind.SYSTEM, GroupKind.LEDGER)), None
    )
    if first_other is not None and first_other.first == view.tail_start:
        # One turn (an agent loop): the task stays first, then what its folded steps left.
        return min(view.tail_start + 1, view.insert_limit)
    return min(view.leading_system_end, view.tail_start)


def ledger_warnings(ledger: DraftLedger | None, share: float) -> list[str]:
    """What the report says the ledger left out (by its share; released for the budget)."""
    if ledger is None:
        return []
    out: list[str] = []
    if ledger.left_out:
        out.append(
            f"ledger: {ledger.left_out} item(s) left out to keep it within {share:g} of the "
            "budget (artifacts and statements, least-referenced and oldest first; their "
            "originals were folded like the rest: with recall on, recall finds them)"
        )
    if ledger.released:
        out.append(
            f"ledger: {ledger.released} item(s) released: the budget could not be met otherwise"
        )
    return out
