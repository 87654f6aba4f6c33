"""The summarizer contract, owned by the compaction core; re-exported for this package."""

from compaction_proxy.compaction.summarizer import Summarizer, SummaryError, SummaryRequest

__all__ = ["Summarizer", "SummaryError", "SummaryRequest"]
