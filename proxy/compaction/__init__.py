"""The pure compaction core (DESIGN sections 3-6).

No FastAPI, no httpx, no storage: the edge hands in messages, tools, model facts, settings and
a tokenizer, and gets back the messages to forward plus a report.  Public API::

    result = compact(messages, model="gpt-4o", pipeline=build_pipeline(settings, summ),
                     tokenizer=provider, facts=catalog, tools=body.get("tools"),
                     max_completion_tokens=body.get("max_completion_tokens"),
                     max_tokens=body.get("max_tokens"), reserve_ratio=summ.reserve_ratio,
                     calibration=Calibration(ratio), mode=Mode.NORMAL)
    if result.changed: forward(result.messages) else: forward(original bytes)
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
from .factory import build_pipeline, default_pipeline_entries
from .images import ImagePricing
from .pipeline import (
    CompactionResult,
    Mode,
    Pipeline,
    PipelineStrategy,
    compact,
    run_strategy,
)
from .report import CompactionReport, StrategyReport
from .settings import (
    CompactionSettings,
    ModelFactsSettings,
    SummarizationSettings,
)
from .strategies.base import Strategy, StrategyContext, StrategyOutcome
from .strategies.registry import (
    StrategyNotAvailable,
    StrategyRegistry,
    default_registry,
)
from .strategies.sliding_window import SlidingWindowStrategy
from .strategies.truncation import TruncationStrategy
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
    "CompactionReport",
    "CompactionResult",
    "CompactionSettings",
    "Condition",
    "ConditionError",
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
    "SlidingWindowStrategy",
    "Strategy",
    "StrategyContext",
    "StrategyNotAvailable",
    "StrategyOutcome",
    "StrategyRegistry",
    "StrategyReport",
    "SummarizationSettings",
    "SummaryMarker",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerProvider",
    "TruncationStrategy",
    "ValidationIssue",
    "build_pipeline",
    "build_view",
    "compact",
    "compute_budget",
    "default_pipeline_entries",
    "default_registry",
    "parse_condition",
    "parse_target",
    "run_strategy",
    "validate_messages",
]
