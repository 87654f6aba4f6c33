"""The final outcome of each summary a request asked for: its summarizer HTTP calls,
reconciled with the failures its compaction report lists.

The two sources overlap without matching one to one. A call that failed is also a failure in
the report (count it once); a back-off never reached the HTTP summarizer (a failure without a
call); and an ``ok`` call whose summary the pipeline then rejected (``not_shorter``, or
``empty``/``error`` found after the call) must count once, under the rejection. Kept apart from
the counting so the rule can be read and tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compaction_proxy.compaction.report import StrategyFailure

__all__ = ["AFTER_OK_CALL", "final_outcomes"]

AFTER_OK_CALL = frozenset({"not_shorter", "empty", "error", "discarded"})
"""Outcomes the strategy may report after an HTTP call that itself succeeded (``discarded``:
the summary was made and then not forwarded, see ``CompactionReport.unforwarded``)."""


def final_outcomes(calls: Sequence[str], failures: Iterable[StrategyFailure]) -> list[str]:
    """One outcome per summary: ``calls`` (in order) with each failure matched to the call it
    explains, the last unmatched ``ok`` call taking a rejection, and unmatched failures (no
    call was made) appended."""
    outcomes = list(calls)
    matched = [False] * len(outcomes)
    for failure in failures:
        reason = failure.reason
        index = next((i for i, o in enumerate(outcomes) if not matched[i] and o == reason), None)
        if index is None and reason in AFTER_OK_CALL:
            index = next(
                (
                    i
                    for i in range(len(outcomes) - 1, -1, -1)
                    if not matched[i] and outcomes[i] == "ok"
                ),
                None,
            )
            if index is not None:
                outcomes[index] = reason
        if index is None:
            outcomes.append(reason)
            matched.append(True)
        else:
            matched[index] = True
    return outcomes
