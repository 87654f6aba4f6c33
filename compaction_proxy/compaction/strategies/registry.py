"""Name -> builder registry turning settings entries into strategy objects.

Every strategy name validates in :mod:`..settings`; only registered names can be built.  A
configured pipeline naming an unregistered strategy fails at start-up with
:class:`StrategyNotAvailable`, never silently.  A new strategy's builder goes here (in
:func:`register_builtin_strategies`) or on a registry instance::

    registry = default_registry()
    registry.register("context_pruning", build_context_pruning)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..errors import CompactionProxyError
from ..settings import (
    ClearToolUsesEntry,
    ContextPruningEntry,
    PipelineEntry,
    RetainRecentSettings,
    SelectiveToolCallsEntry,
    SlidingWindowEntry,
    SummarizationEntry,
    ToolResultCompactionEntry,
    TruncationEntry,
)
from ..triggers import Never
from .base import Strategy
from .clear_tool_uses import ClearToolUsesStrategy
from .composite import PipelineStrategy
from .context_pruning import ContextPruningStrategy
from .selective_tool_calls import SelectiveToolCallsStrategy
from .sliding_window import SlidingWindowStrategy
from .summarization import SummarizationStrategy
from .tool_result_compaction import ToolResultCompactionStrategy
from .truncation import TruncationStrategy


class StrategyNotAvailable(CompactionProxyError, LookupError):
    """A configured strategy has no registered builder (yet)."""


@dataclass(frozen=True)
class BuildContext:
    """What builders may need besides their entry (the registry, for nested pipelines)."""

    registry: StrategyRegistry


StrategyBuilder = Callable[[Any, BuildContext], Strategy]
"""``(entry, ctx) -> Strategy``; ``entry`` is the strategy's settings model."""


class StrategyRegistry:
    """Maps ``strategy:`` names to builders."""

    def __init__(self) -> None:
        self._builders: dict[str, StrategyBuilder] = {}

    def register(self, name: str, builder: StrategyBuilder, *, replace: bool = False) -> None:
        """Register ``builder`` for ``name`` (``replace=True`` to override an existing one)."""
        if name in self._builders and not replace:
            raise ValueError(f"strategy {name!r} is already registered")
        self._builders[name] = builder

    def available(self, name: str) -> bool:
        """True when ``name`` can be built."""
        return name in self._builders

    @property
    def names(self) -> tuple[str, ...]:
        """Registered names."""
        return tuple(self._builders)

    def build(self, entry: BaseModel) -> Strategy:
        """Build the strategy for one settings entry."""
        name = str(getattr(entry, "strategy", ""))
        builder = self._builders.get(name)
        if builder is None:
            raise StrategyNotAvailable(
                f"strategy {name!r} not available yet "
                f"(available: {', '.join(self.names) or 'none'})"
            )
        return builder(entry, BuildContext(self))


def _floor(entry: Any, default: int) -> int:
    value = entry.minimum_preserved
    return default if value is None else int(value)


def build_truncation(entry: TruncationEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: truncation``."""
    return TruncationStrategy(
        max_n=entry.max_n,
        compact_to=entry.compact_to,
        metric=entry.metric,
        preserve_system=entry.preserve_system,
        preserve_first_user_group=entry.preserve_first_user_group,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 1),
    )


def build_sliding_window(entry: SlidingWindowEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: sliding_window``."""
    return SlidingWindowStrategy(
        keep_last_groups=entry.keep_last_groups,
        keep_last_turns=entry.keep_last_turns,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 1),
    )


def build_context_pruning(entry: ContextPruningEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: context_pruning`` (``enabled: false``: never fires)."""
    return ContextPruningStrategy(
        keep_last_assistants=entry.keep_last_assistants,
        soft_trim_ratio=entry.soft_trim_ratio,
        hard_clear_ratio=entry.hard_clear_ratio,
        min_prunable_tool_chars=entry.min_prunable_tool_chars,
        soft_trim_max_chars=entry.soft_trim.max_chars,
        soft_trim_head_chars=entry.soft_trim.head_chars,
        soft_trim_tail_chars=entry.soft_trim.tail_chars,
        hard_clear_enabled=entry.hard_clear.enabled,
        placeholder=entry.hard_clear.placeholder,
        trigger=entry.trigger if entry.enabled else Never(),
        target=entry.target,
        minimum_preserved=_floor(entry, 0),
    )


def build_tool_result_compaction(entry: ToolResultCompactionEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: tool_result_compaction``."""
    return ToolResultCompactionStrategy(
        keep_last_tool_call_groups=entry.keep_last_tool_call_groups,
        max_summary_chars=entry.max_summary_chars,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 0),
    )


def build_selective_tool_calls(entry: SelectiveToolCallsEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: selective_tool_calls``."""
    return SelectiveToolCallsStrategy(
        keep_last_tool_call_groups=entry.keep_last_tool_call_groups,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 0),
    )


def build_clear_tool_uses(entry: ClearToolUsesEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: clear_tool_uses``."""
    return ClearToolUsesStrategy(
        keep=entry.keep,
        exclude_tools=entry.exclude_tools,
        clear_at_least=entry.clear_at_least,
        clear_tool_inputs=entry.clear_tool_inputs,
        placeholder=entry.placeholder,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 0),
    )


AF_DEFAULT_TARGET_COUNT = 4
AF_DEFAULT_THRESHOLD = 2


def build_summarization(entry: SummarizationEntry, ctx: BuildContext) -> Strategy:
    """Builder for ``strategy: summarization`` (either selection shape)."""
    retain = entry.retain_recent or RetainRecentSettings()
    target_count: int | None = None
    threshold = 0
    if entry.uses_group_shape:
        target_count = entry.target_count or AF_DEFAULT_TARGET_COUNT
        if "threshold" in entry.model_fields_set:
            threshold = entry.threshold or 0
        else:
            threshold = AF_DEFAULT_THRESHOLD
    return SummarizationStrategy(
        retain_turns=retain.turns,
        retain_tokens=retain.tokens,
        target_count=target_count,
        threshold=threshold,
        placement=entry.placement,
        trigger=entry.trigger,
        target=entry.target,
        minimum_preserved=_floor(entry, 0),
    )


def build_pipeline_entry(entry: PipelineEntry, ctx: BuildContext) -> Strategy:
    """Builder for a nested ``strategy: pipeline``: plain, or with ``token_budget`` the
    token-budget composition (the settings model refuses a mix of the two)."""
    return PipelineStrategy(
        [ctx.registry.build(child) for child in entry.strategies],
        stop_when=entry.stop_when,
        early_stop=entry.early_stop,
        trigger=entry.trigger,
        token_budget=entry.token_budget,
        fallback=entry.fallback,
    )


def register_builtin_strategies(registry: StrategyRegistry) -> StrategyRegistry:
    """Register every built-in strategy."""
    registry.register("context_pruning", build_context_pruning)
    registry.register("tool_result_compaction", build_tool_result_compaction)
    registry.register("selective_tool_calls", build_selective_tool_calls)
    registry.register("clear_tool_uses", build_clear_tool_uses)
    registry.register("truncation", build_truncation)
    registry.register("sliding_window", build_sliding_window)
    registry.register("summarization", build_summarization)
    registry.register("pipeline", build_pipeline_entry)
    return registry


def default_registry() -> StrategyRegistry:
    """A fresh registry holding the built-in strategies."""
    return register_builtin_strategies(StrategyRegistry())
