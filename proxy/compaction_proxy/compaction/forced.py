"""What a forced run (``X-Compaction: force``) says when it did less than the event it asked for.

Force asks for the event a normal run makes at the trigger, never a weaker one: summarization
folds towards the target a normal run has
(:class:`.strategies._support.summary_selection.TargetStop`).  A forced run can still end without a
summary while it drops groups (a forced sliding window before summarization leaves it nothing to
fold; no summarizer is at hand), and then the response must say so rather than let the drop pass for
the event.
"""

from __future__ import annotations

from collections.abc import Sequence

from .draft import Draft
from .report import StrategyReport


def forced_without_summary(steps: Sequence[StrategyReport], draft: Draft) -> list[str]:
    """The warning for a forced run whose summarization made no summary while groups were
    dropped (``steps``: every strategy's report, nested ones flattened); none when no
    summarization ran, when it acted, or when it failed (a failure has its own warning,
    :func:`~.pipeline.failure_warnings`)."""
    summaries = [r for r in steps if r.name == "summarization" and not r.children]
    if not summaries or any(r.changed or r.failed for r in summaries):
        return []
    dropped = draft.counters.groups_dropped
    if not dropped:
        return []
    why = "; ".join(n for r in summaries for n in r.notes) or "it did not run"
    return [
        f"X-Compaction: force made no summary ({why}); {dropped} group(s) were dropped without one"
    ]
