"""Build a :class:`~.pipeline.Pipeline` from settings, including the default pipeline.

With no ``compaction.pipeline`` configured, the pipeline is derived from the ``summarization``
block: fire at ``token_ratio: 0.8`` (or the block's ``trigger``), compact towards
``token_ratio: 0.5`` (the hysteresis shape of DESIGN section 5):

1. ``context_pruning`` (from ``summarization.contextPruning``, unless ``enabled: false`` is
   written explicitly);
2. ``tool_result_compaction`` (keep the newest tool-call group);
3. -- SUMMARIZATION INSERTION POINT: ``summarization`` joins here, before truncation, when
   ``summarization.enabled`` (a later issue) --
4. ``truncation``.

Strategies of the *default* pipeline that are not registered yet are left out with one logged
notice; an explicitly configured pipeline naming one fails with
:class:`~.strategies.registry.StrategyNotAvailable`.
"""

from __future__ import annotations

import logging

from .pipeline import Pipeline
from .settings import (
    CompactionSettings,
    ContextPruningEntry,
    StrategyEntry,
    SummarizationSettings,
    ToolResultCompactionEntry,
    TruncationEntry,
)
from .strategies.registry import StrategyRegistry, default_registry
from .triggers import Condition, TokenRatio

logger = logging.getLogger(__name__)

DEFAULT_TRIGGER_RATIO = 0.8
DEFAULT_TARGET_RATIO = 0.5


def default_target() -> Condition:
    """The default pipeline's target (and early-stop condition): below 50 % of the budget."""
    return TokenRatio(DEFAULT_TARGET_RATIO)


def default_pipeline_entries(summarization: SummarizationSettings) -> list[StrategyEntry]:
    """The entries of the default pipeline (see the module docstring)."""
    trigger = summarization.trigger or TokenRatio(DEFAULT_TRIGGER_RATIO)
    target = default_target()
    entries: list[StrategyEntry] = []
    pruning = summarization.context_pruning
    if pruning.enabled or "enabled" not in pruning.model_fields_set:
        entries.append(
            ContextPruningEntry(
                strategy="context_pruning",
                trigger=trigger,
                target=target,
                keep_last_assistants=pruning.keep_last_assistants,
                soft_trim_ratio=pruning.soft_trim_ratio,
                hard_clear_ratio=pruning.hard_clear_ratio,
                min_prunable_tool_chars=pruning.min_prunable_tool_chars,
                soft_trim=pruning.soft_trim,
                hard_clear=pruning.hard_clear,
            )
        )
    entries.append(
        ToolResultCompactionEntry(
            strategy="tool_result_compaction",
            trigger=trigger,
            target=target,
            keep_last_tool_call_groups=1,
        )
    )
    # SUMMARIZATION INSERTION POINT: when summarization.enabled, append the summarization
    # entry built from the LibreChat block here (retainRecent, prompts, maxSummaryTokens).
    entries.append(TruncationEntry(strategy="truncation", trigger=trigger, target=target))
    return entries


def build_pipeline(
    compaction: CompactionSettings,
    summarization: SummarizationSettings | None = None,
    *,
    registry: StrategyRegistry | None = None,
) -> Pipeline:
    """The pipeline for these settings (explicit entries, else the default pipeline)."""
    registry = registry or default_registry()
    if compaction.pipeline is not None:
        strategies = tuple(registry.build(entry) for entry in compaction.pipeline)
        return Pipeline(
            strategies,
            stop_when=compaction.stop_when,
            early_stop=compaction.early_stop,
            fallback=compaction.fallback_truncation,
        )
    entries = default_pipeline_entries(summarization or SummarizationSettings())
    missing = [e.strategy for e in entries if not registry.available(e.strategy)]
    if missing:
        logger.warning(
            "default compaction pipeline: %s not available yet, left out", ", ".join(missing)
        )
    strategies = tuple(registry.build(e) for e in entries if registry.available(e.strategy))
    return Pipeline(
        strategies,
        stop_when=compaction.stop_when or default_target(),
        early_stop=compaction.early_stop,
        fallback=compaction.fallback_truncation,
    )
