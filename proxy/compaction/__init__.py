"""The pure compaction core (DESIGN sections 3-6).

No FastAPI, no httpx, no storage: the edge hands in messages, tools, model facts, settings and
a tokenizer, and gets back the messages to forward plus a report.  Public API::

    result = compact(messages, model="gpt-4o", pipeline=build_pipeline(settings, summ),
                     tokenizer=provider, facts=catalog, tools=body.get("tools"),
                     max_completion_tokens=body.get("max_completion_tokens"),
                     max_tokens=body.get("max_tokens"), reserve_ratio=summ.reserve_ratio,
                     calibration=Calibration(ratio), mode=Mode.NORMAL)
    if result.changed: forward(result.messages) else: forward(original bytes)

With a summarizer (the edge's :class:`Summarizer`), ``await compact_async(..., summarizer=s)``
takes the same arguments; ``result.report.failures`` lists strategies that failed (no
checkpoint should be stored then).
"""

from .budget import (
    BUILTIN_MODELS,
    Budget,
    Calibration,
    FactsOverride,
    ModelCatalog,
    ModelFacts,
    compute_budget,
)
from .draft import ChangeCounters, Draft, GroupState, ProtectedGroupError
from .encodings import EncodingLoader, EncodingUnavailable
from .factory import (
    CompactionConfigError,
    build_pipeline,
    compaction_settings_from_mapping,
    default_pipeline_entries,
    pipeline_from_mapping,
    summarization_settings_from_mapping,
)
from .images import ImagePricing
from .pipeline import (
    CompactionResult,
    Mode,
    Pipeline,
    PipelineStrategy,
    compact,
    compact_async,
    run_strategy,
    run_strategy_async,
    summary_marker_for,
)
from .report import CompactionReport, StrategyFailure, StrategyReport
from .settings import (
    CompactionSettings,
    ModelFactsSettings,
    SummarizationSettings,
)
from .strategies.base import Strategy, StrategyContext, StrategyOutcome
from .strategies.clear_tool_uses import ClearToolUsesStrategy
from .strategies.context_pruning import ContextPruningStrategy
from .strategies.registry import (
    StrategyNotAvailable,
    StrategyRegistry,
    default_registry,
)
from .strategies.selective_tool_calls import SelectiveToolCallsStrategy
from .strategies.sliding_window import SlidingWindowStrategy
from .strategies.summarization import SummarizationStrategy
from .strategies.tool_result_compaction import ToolResultCompactionStrategy
from .strategies.truncation import TruncationStrategy
from .summarizer import Summarizer, SummaryError, SummaryRequest
from .tokenizer_provider import TokenizerProvider
from .tokens import CharacterEstimatorTokenizer, TiktokenTokenizer, Tokenizer
from .triggers import Condition, ConditionError, Metrics, parse_condition, parse_target
from .validation import ValidationIssue, validate_messages
from .view import (
    ConversationView,
    Group,
    GroupKind,
    MessageStats,
    SummaryMarker,
    build_view,
)

__all__ = [
    "BUILTIN_MODELS",
    "Budget",
    "Calibration",
    "ChangeCounters",
    "CharacterEstimatorTokenizer",
    "ClearToolUsesStrategy",
    "CompactionConfigError",
    "CompactionReport",
    "CompactionResult",
    "CompactionSettings",
    "Condition",
    "ConditionError",
    "ContextPruningStrategy",
    "ConversationView",
    "Draft",
    "EncodingLoader",
    "EncodingUnavailable",
    "FactsOverride",
    "Group",
    "GroupKind",
    "GroupState",
    "ImagePricing",
    "MessageStats",
    "Metrics",
    "Mode",
    "ModelCatalog",
    "ModelFacts",
    "ModelFactsSettings",
    "Pipeline",
    "PipelineStrategy",
    "ProtectedGroupError",
    "SelectiveToolCallsStrategy",
    "SlidingWindowStrategy",
    "Strategy",
    "StrategyContext",
    "StrategyFailure",
    "StrategyNotAvailable",
    "StrategyOutcome",
    "StrategyRegistry",
    "StrategyReport",
    "SummarizationSettings",
    "SummarizationStrategy",
    "Summarizer",
    "SummaryError",
    "SummaryMarker",
    "SummaryRequest",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerProvider",
    "ToolResultCompactionStrategy",
    "TruncationStrategy",
    "ValidationIssue",
    "build_pipeline",
    "build_view",
    "compact",
    "compact_async",
    "compaction_settings_from_mapping",
    "compute_budget",
    "default_pipeline_entries",
    "default_registry",
    "parse_condition",
    "parse_target",
    "pipeline_from_mapping",
    "run_strategy",
    "run_strategy_async",
    "summarization_settings_from_mapping",
    "summary_marker_for",
    "validate_messages",
]
