"""The built-in strategies, registered by name into the process's registry.

The ``strategies`` package imports this module, so :data:`.registry.STRATEGIES` holds the
built-ins whenever any strategy module is imported; :func:`default_registry` makes a fresh
registry with them, for a caller (a test) that registers strategies of its own.
"""

from __future__ import annotations

from .clear_tool_uses import ClearToolUsesParams, ClearToolUsesStrategy
from .composite import PipelineParams, PipelineStrategy
from .context_pruning import ContextPruningParams, ContextPruningStrategy
from .ledger_step import LedgerParams, LedgerStep
from .registry import STRATEGIES, StrategyRegistry
from .selective_tool_calls import SelectiveToolCallsParams, SelectiveToolCallsStrategy
from .sliding_window import SlidingWindowParams, SlidingWindowStrategy
from .summarization import SummarizationParams, SummarizationStrategy
from .tool_result_compaction import ToolResultCompactionParams, ToolResultCompactionStrategy
from .truncation import TruncationParams, TruncationStrategy


def register_builtin_strategies(registry: StrategyRegistry) -> StrategyRegistry:
    """Register every built-in strategy (in the order error messages list them)."""
    registry.register("context_pruning", ContextPruningParams, ContextPruningStrategy)
    registry.register(
        "tool_result_compaction", ToolResultCompactionParams, ToolResultCompactionStrategy
    )
    registry.register("selective_tool_calls", SelectiveToolCallsParams, SelectiveToolCallsStrategy)
    registry.register("clear_tool_uses", ClearToolUsesParams, ClearToolUsesStrategy)
    registry.register("summarization", SummarizationParams, SummarizationStrategy)
    registry.register("sliding_window", SlidingWindowParams, SlidingWindowStrategy)
    registry.register("truncation", TruncationParams, TruncationStrategy)
    registry.register("ledger", LedgerParams, LedgerStep)
    registry.register("pipeline", PipelineParams, PipelineStrategy)
    return registry


def default_registry() -> StrategyRegistry:
    """A fresh registry holding the built-in strategies."""
    return register_builtin_strategies(StrategyRegistry())


register_builtin_strategies(STRATEGIES)
