"""Recording a summary's check on the strategy's outcome, so it reaches the report.

A summary strategy calls :func:`record_summary_check` with the summary it is about to store
and the folded span's exact strings and rules (:class:`CheckItems`); the check rides on the
:class:`~..base.StrategyOutcome` to the strategy's :class:`~...report.StrategyReport`, and
:attr:`~...report.CompactionReport.summary_checks` collects every one of the run (the edge turns
them into ``X-Compaction-Summary-Kept``, a metric and the dashboard).  Each contradiction
becomes a warning on the outcome, which reaches the report's warnings (and
``X-Compaction-Warning``) the way every strategy warning does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from ...summary_check import SummaryCheck, check_summary
from ..base import StrategyOutcome

RULE_CHARS = 120
"""A contradicted rule is quoted in its warning up to this many characters."""


class CheckItems(NamedTuple):
    """What a summary is checked against: ``(section, exact string)`` pairs and rules."""

    strings: Sequence[tuple[str, str]] = ()
    rules: Sequence[str] = ()


NO_ITEMS = CheckItems()


def contradiction_warning(rule: str) -> str:
    """The report's warning for a summary that may contradict ``rule`` (one line, cut)."""
    text = " ".join(rule.split())
    if len(text) > RULE_CHARS:
        text = text[: RULE_CHARS - 3].rstrip() + "..."
    return f'summary may contradict a rule: "{text}"'


def with_summary_check(outcome: StrategyOutcome, check: SummaryCheck) -> StrategyOutcome:
    """``outcome`` carrying ``check``, each contradiction a warning."""
    warnings = tuple(contradiction_warning(rule) for rule in check.contradictions)
    return dataclasses.replace(
        outcome,
        summary_checks=(*outcome.summary_checks, check),
        warnings=(*outcome.warnings, *warnings),
    )


def record_summary_check(
    outcome: StrategyOutcome, summary: str, items: CheckItems
) -> StrategyOutcome:
    """``outcome`` with the check of ``summary`` against ``items`` recorded; unchanged when
    there was nothing to check (no header or metric for a span without strings or rules)."""
    if not items.strings and not items.rules:
        return outcome
    return with_summary_check(outcome, check_summary(summary, items.strings, items.rules))
