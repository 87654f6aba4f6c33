"""Build a :class:`~.pipeline.Pipeline` from settings, including the default pipeline.

With no ``compaction.pipeline`` configured, the pipeline is derived from the ``summarization``
block: fire at ``token_ratio: 0.8`` (or the block's ``trigger``), compact towards
``token_ratio: 0.5`` (the hysteresis shape of DESIGN section 5):

1. ``context_pruning`` (from ``summarization.contextPruning``, unless ``enabled: false`` is
   written explicitly);
2. ``tool_result_compaction`` (keep the newest tool-call group);
3. ``summarization`` when ``summarization.enabled`` (the block's ``retainRecent`` and
   ``placement``, same trigger and target).  It needs a summarizer at run time
   (:func:`~.pipeline.compact_async`); without one (the synchronous ``compact``, a CLI without
   network) it is skipped with a note and truncation still guarantees the budget;
4. ``truncation``.

Strategies of the *default* pipeline that are not registered yet are left out with one logged
notice; an explicitly configured pipeline naming one fails with
:class:`~.strategies.registry.StrategyNotAvailable`.

Per-model overrides: ``models.<pattern>.compaction`` is a raw, ``compaction``-shaped mapping
that *replaces* the top-level block for matching models.  :func:`pipeline_from_mapping` turns
such a mapping (or the top-level one) into a pipeline, and raises
:class:`CompactionConfigError` whose lines name the full key path
(``models.gpt-4o.compaction.pipeline.0.keep_last_tool_call_groups: ...``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .pipeline import Pipeline
from .settings import (
    STRATEGY_NAMES,
    CompactionSettings,
    ContextPruningEntry,
    StrategyEntry,
    SummarizationEntry,
    SummarizationSettings,
    ToolResultCompactionEntry,
    TruncationEntry,
)
from .strategies.registry import StrategyNotAvailable, StrategyRegistry, default_registry
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
    if pruning.enabled:
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
    if summarization.enabled:
        entries.append(
            SummarizationEntry(
                strategy="summarization",
                trigger=trigger,
                target=target,
                retain_recent=summarization.retain_recent,
                placement=summarization.placement,
            )
        )
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
        hysteresis=True,
    )


class CompactionConfigError(ValueError):
    """A ``compaction``/``summarization`` mapping is invalid; one line per problem.

    ``issues`` holds ``(key path, message)`` pairs; ``str()`` joins them as ``path: message``.
    """

    def __init__(self, issues: list[tuple[str, str]]) -> None:
        self.issues = issues
        super().__init__("\n".join(f"{path}: {message}" for path, message in issues))


def _issues(error: ValidationError, path: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in error.errors():
        parts: list[str] = [path] if path else []
        previous: object = None
        for part in item["loc"]:
            # pydantic adds the discriminator value after a list index: not a config key
            if isinstance(previous, int) and part in STRATEGY_NAMES:
                previous = part
                continue
            parts.append(str(part))
            previous = part
        message = str(item["msg"]).removeprefix("Value error, ")
        last = str(item["loc"][-1]) if item["loc"] else ""
        if last and message.startswith((f"{last}.", f"{last}:")) and ": " in message:
            # a condition's message starts with its own key path below ``last``
            own_path, message = message.split(": ", 1)
            parts[-1] = own_path
        out.append((".".join(parts) or "(top level)", message))
    return out


def compaction_settings_from_mapping(
    raw: Mapping[str, Any] | CompactionSettings | None, *, path: str = "compaction"
) -> CompactionSettings:
    """Validate a raw ``compaction`` mapping; errors name ``path`` plus the key path."""
    if isinstance(raw, CompactionSettings):
        return raw
    try:
        return CompactionSettings.model_validate(dict(raw or {}))
    except ValidationError as error:
        raise CompactionConfigError(_issues(error, path)) from None


def summarization_settings_from_mapping(
    raw: Mapping[str, Any] | SummarizationSettings | None, *, path: str = "summarization"
) -> SummarizationSettings:
    """Validate LibreChat's raw ``summarization`` block (camelCase keys)."""
    if isinstance(raw, SummarizationSettings):
        return raw
    try:
        return SummarizationSettings.model_validate(dict(raw or {}))
    except ValidationError as error:
        raise CompactionConfigError(_issues(error, path)) from None


def pipeline_from_mapping(
    raw: Mapping[str, Any] | CompactionSettings | None,
    summarization: Mapping[str, Any] | SummarizationSettings | None = None,
    *,
    path: str = "compaction",
    summarization_path: str = "summarization",
    registry: StrategyRegistry | None = None,
) -> Pipeline:
    """Validate and build the pipeline of a raw ``compaction`` mapping.

    The edge calls it once per ``models.<pattern>.compaction`` at start-up (``path`` set to
    that key) and caches the result.  ``summarization`` shapes the default pipeline when the
    mapping has no ``pipeline``.  Every failure -- schema, an unavailable strategy, a
    parameter a strategy rejects -- is a :class:`CompactionConfigError` naming the key path.
    """
    compaction = compaction_settings_from_mapping(raw, path=path)
    summ = summarization_settings_from_mapping(summarization, path=summarization_path)
    registry = registry or default_registry()
    if compaction.pipeline is not None:  # locate the entry a builder rejects
        for index, entry in enumerate(compaction.pipeline):
            try:
                registry.build(entry)
            except (StrategyNotAvailable, ValueError) as error:
                raise CompactionConfigError([(f"{path}.pipeline.{index}", str(error))]) from None
    try:
        return build_pipeline(compaction, summ, registry=registry)
    except (StrategyNotAvailable, ValueError) as error:
        raise CompactionConfigError([(path, str(error))]) from None
