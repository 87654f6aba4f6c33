"""The pure compaction core.

No FastAPI, no httpx, no storage: the edge hands in messages, tools, model facts, settings and
a tokenizer, and gets back the messages to forward plus a report.  Public API::

    request = CompactionRequest(
        body["messages"], model="gpt-4o", pipeline=build_pipeline(compaction, summarization),
        tokenizer=provider, facts=catalog, tools=body.get("tools"),
        max_completion_tokens=body.get("max_completion_tokens"),
        max_tokens=body.get("max_tokens"), reserve_ratio=summarization.reserve_ratio,
        calibration=Calibration(ratio), mode=Mode.NORMAL,
    )
    result = compact(request)
    if result.changed: forward(result.messages) else: forward(original bytes)

With a summarizer (the edge's :class:`Summarizer`), ``await compact_async(request,
summarizer=s)`` runs the same pipeline with summaries; ``result.report.failures`` lists
strategies that failed (no checkpoint should be stored then).

The strategies themselves (to compose a pipeline in code, or write a new one) are in
:mod:`compaction_proxy.compaction.strategies`; see "Groups and invariants", "Strategies" and
"Budget and tokens" in compaction_proxy/compaction/README.md for how the pieces fit.
"""

from .archive import RecallIds
from .budget import (
    Calibration,
    FactsOverride,
    ModelCatalog,
    ModelFacts,
    OutputLimit,
    compute_budget,
)
from .encodings import EncodingLoader
from .factory import build_pipeline
from .images import ImagePricing
from .pipeline import (
    CompactionRequest,
    CompactionResult,
    Mode,
    Pipeline,
    compact,
    compact_async,
    firing_point,
)
from .report import CompactionReport, StrategyReport
from .settings import CompactionSettings, RecallSettings, SummarizationSettings
from .summarizer_contract import Summarizer, SummaryError, SummaryRequest
from .tokenizer_provider import TokenizerProvider
from .tokens import CharacterEstimatorTokenizer, TiktokenTokenizer, Tokenizer
from .validation import validate_messages
from .view import ConversationView, build_view

__all__ = [
    "Calibration",
    "CharacterEstimatorTokenizer",
    "CompactionReport",
    "CompactionRequest",
    "CompactionResult",
    "CompactionSettings",
    "ConversationView",
    "EncodingLoader",
    "FactsOverride",
    "ImagePricing",
    "Mode",
    "ModelCatalog",
    "ModelFacts",
    "OutputLimit",
    "Pipeline",
    "RecallIds",
    "RecallSettings",
    "StrategyReport",
    "SummarizationSettings",
    "Summarizer",
    "SummaryError",
    "SummaryRequest",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerProvider",
    "build_pipeline",
    "build_view",
    "compact",
    "compact_async",
    "compute_budget",
    "firing_point",
    "validate_messages",
]
