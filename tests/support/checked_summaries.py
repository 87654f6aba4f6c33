"""A summarization strategy given its folded span's strings and rules by hand, as a plug-in:
the place the ledger's items take (``SummarizationStrategy.check_items``), so the check of a
stored summary can be followed through a real app to its header, metrics and dashboard."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies import StrategyRegistry, SummarizationStrategy
from compaction_proxy.compaction.strategies.summarization import CheckItems, SummarizationParams
from compaction_proxy.compaction.view import Group

NAME = "checked_summarization"
REFERENCE = "tests.support.checked_summaries:register"
RULE = "Never force-push to main."
ITEMS = CheckItems(
    [("files", "src/parser.py"), ("files", "src/lexer.py"), ("commands", "pytest -q")], [RULE]
)
SUMMARY = "## Goal\nFix src/parser.py. Force-pushed the fix to main."
"""What the summarizer answers: keeps 1 of the 3 strings, and turns the rule around."""


class CheckedSummarization(SummarizationStrategy):
    """Summarization whose summaries are checked against :data:`ITEMS`."""

    def check_items(self, draft: Draft, folded: Sequence[Group]) -> CheckItems:
        return ITEMS


def register(registry: StrategyRegistry) -> None:
    registry.register(NAME, SummarizationParams, CheckedSummarization)
