"""Summaries and checkpoints at the edge: the summarizer LLM call, its prompts and input
guards (this package), and the checkpoint stores (:mod:`compaction_proxy.checkpoints`).

The compaction core sees only the ``Summarizer`` protocol and ``CheckpointStore``; everything
here that talks HTTP, SQLite or Redis stays outside ``compaction_proxy.compaction``
(docs/architecture.md, "Layers and what each may import").
"""

from .contract import Summarizer, SummaryError, SummaryRequest
from .prompts import CHECKPOINT_PROMPT, PROMPT_VERSION, UPDATE_PROMPT, PromptSet
from .summarizer import HttpSummarizer, SummarizerStats, SummaryCallRecord
from .transcript import TranscriptOptions

__all__ = [
    "CHECKPOINT_PROMPT",
    "PROMPT_VERSION",
    "UPDATE_PROMPT",
    "HttpSummarizer",
    "PromptSet",
    "Summarizer",
    "SummarizerStats",
    "SummaryCallRecord",
    "SummaryError",
    "SummaryRequest",
    "TranscriptOptions",
]
