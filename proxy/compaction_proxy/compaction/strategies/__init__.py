"""The compaction strategies, the interface they implement and the registry that builds them.

See :mod:`.base` for writing a new strategy (its parameter model: :mod:`.params`; registering
it: :mod:`.registry`) and "Strategies" in compaction_proxy/compaction/README.md for what each one
does and
where it deliberately differs from the Agent Framework and LibreChat.  Each module here is a
strategy a pipeline entry names, or that interface; what they are built from is in the private
:mod:`._support`.
"""

from .base import Strategy, StrategyContext, StrategyOutcome
from .builtin import default_registry
from .clear_tool_uses import ClearToolUsesStrategy
from .composite import FallbackTruncation, PipelineStrategy
from .context_pruning import ContextPruningStrategy
from .params import BuildContext, StrategyParams
from .registry import StrategyRegistry, UnknownStrategy
from .selective_tool_calls import SelectiveToolCallsStrategy
from .sliding_window import SlidingWindowStrategy
from .summarization import SummarizationStrategy
from .tool_result_compaction import ToolResultCompactionStrategy
from .truncation import TruncationStrategy

__all__ = [
    "BuildContext",
    "ClearToolUsesStrategy",
    "ContextPruningStrategy",
    "FallbackTruncation",
    "PipelineStrategy",
    "SelectiveToolCallsStrategy",
    "SlidingWindowStrategy",
    "Strategy",
    "StrategyContext",
    "StrategyOutcome",
    "StrategyParams",
    "StrategyRegistry",
    "SummarizationStrategy",
    "ToolResultCompactionStrategy",
    "TruncationStrategy",
    "UnknownStrategy",
    "default_registry",
]
