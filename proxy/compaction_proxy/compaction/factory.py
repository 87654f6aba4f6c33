"""Build a :class:`~.pipeline.Pipeline` from settings, including the default pipeline.

An explicit ``compaction.pipeline`` is a plain pipeline (the Agent Framework's
``PipelineCompactionStrategy``: every entry by its own trigger, in order), or with
``early_stop: true`` a token-budget composition (``TokenBudgetComposedStrategy``: skip the rest
once ``stop_when`` holds); see :mod:`.strategies.composite`.  Either way the proxy's own
fallback (``fallback_truncation``) and last resort follow.  It is read in the Agent Framework's
terms, so it gets neither of the proxy's two additions, carried user messages
(``carry_user_messages``) and the minimum saving (``min_saving``), unless the block writes them
(:meth:`~.settings.CompactionSettings.carry_share`): a ported pipeline behaves as the Agent
Framework's.  The default pipeline below has both, and the ledger (``compaction.ledger``): an
explicit pipeline has it only when the block enables it or names ``- strategy: ledger``.

With no ``compaction.pipeline`` configured, the pipeline is derived from the ``summarization``
block (a pasted LibreChat block too).  It is a token-budget composition whose budget is its
target: fire at ``token_ratio: 0.8`` (or the block's ``trigger``), compact towards
``token_ratio: 0.5`` in one go (the hysteresis of ``Pipeline.hysteresis``: once one entry acted,
the later ones run towards 0.5 whatever their own trigger says) and skip the rest once 0.5
holds (early stop; see "Triggers and targets" in compaction_proxy/compaction/README.md):

1. ``context_pruning`` (from ``summarization.contextPruning``, unless ``enabled: false`` is
   written explicitly);
2. ``tool_result_compaction`` (keep the newest tool-call group; each collapsed group capped
   at a share of the budget, :mod:`.strategies._support.scaled_collapse`);
3. ``summarization`` when ``summarization.enabled`` (the block's ``retainRecent`` and
   ``placement``, same trigger and target).  It needs a summarizer at run time
   (:func:`~.pipeline.compact_async`); without one (the synchronous ``compact``, a CLI without
   network) it is skipped with a note and truncation still guarantees the budget;
4. ``truncation``.

Every entry is built by the strategy registry in use (the process's by default, holding the
built-ins and what ``compaction.plugins`` registered; :mod:`.strategies.registry`), so a
strategy registered under a built-in name replaces it in the default pipeline too.

Per-model overrides: ``models.<pattern>.compaction`` is a whole ``compaction`` block that
*replaces* the top-level one for matching models; the edge builds one pipeline per block at
start-up with :func:`build_pipeline`.  Validation is the settings models' alone.
"""

from __future__ import annotations

from typing import Any

from .pipeline import Pipeline
from .settings import CompactionSettings, SummarizationSettings
from .strategies._support.scaled_collapse import ScaledToolResultCompaction
from .strategies.base import Strategy
from .strategies.ledger_step import LedgerStep
from .strategies.params import StrategyParams
from .strategies.registry import STRATEGIES, StrategyRegistry
from .strategies.tool_result_compaction import ToolResultCompactionStrategy
from .triggers import Condition, TokenRatio

DEFAULT_TRIGGER_RATIO = 0.8
DEFAULT_TARGET_RATIO = 0.5


def default_target() -> Condition:
    """The default pipeline's target (and early-stop condition): below 50 % of the budget."""
    return TokenRatio(DEFAULT_TARGET_RATIO)


def default_pipeline_entries(
    summarization: SummarizationSettings, registry: StrategyRegistry | None = None
) -> list[StrategyParams]:
    """The entries of the default pipeline (see the module docstring), validated by the
    registry in use like written ones (a strategy registered under a built-in name takes
    them)."""
    trigger = summarization.trigger or TokenRatio(DEFAULT_TRIGGER_RATIO)
    common: dict[str, Any] = {"trigger": trigger, "target": default_target()}
    entries: list[dict[str, Any]] = []
    pruning = summarization.context_pruning
    if pruning.enabled:
        entries.append({"strategy": "context_pruning", **common, **dict(pruning)})
    collapse = {"strategy": "tool_result_compaction", "keep_last_tool_call_groups": 1}
    entries.append({**collapse, **common})
    if summarization.enabled:
        entries.append(
            {
                "strategy": "summarization",
                **common,
                "retain_recent": summarization.retain_recent,
                "placement": summarization.placement,
            }
        )
    entries.append({"strategy": "truncation", **common})
    registry = registry if registry is not None else STRATEGIES
    return [registry.parse(entry) for entry in entries]


def _scaled(strategy: Strategy) -> Strategy:
    """The built-in collapse of the default pipeline, with its cap scaled to the budget
    (:mod:`.strategies._support.scaled_collapse`); any other strategy as it is."""
    if type(strategy) is not ToolResultCompactionStrategy:
        return strategy
    return ScaledToolResultCompaction(
        keep_last_tool_call_groups=strategy.keep_last_tool_call_groups,
        max_summary_chars=strategy.max_summary_chars,
        trigger=strategy._trigger,
        target=strategy._target,
        minimum_preserved=strategy.minimum_preserved,
    )


def build_pipeline(
    compaction: CompactionSettings,
    summarization: SummarizationSettings | None = None,
    *,
    registry: StrategyRegistry | None = None,
) -> Pipeline:
    """The pipeline for these settings (explicit entries, else the default pipeline), built by
    ``registry`` (default: the process's, :data:`~.strategies.registry.STRATEGIES`)."""
    registry = registry if registry is not None else STRATEGIES
    if compaction.pipeline is not None:
        # A plain pipeline unless early_stop makes it a token-budget composition.
        built = tuple(registry.build(entry) for entry in compaction.pipeline)
        steps = [s for s in built if isinstance(s, LedgerStep)]
        strategies = tuple(s for s in built if not isinstance(s, LedgerStep))
        early_stop = bool(compaction.early_stop)
        return Pipeline(
            strategies,
            stop_when=compaction.stop_when,
            early_stop=early_stop,
            fallback=compaction.fallback_truncation,
            hysteresis=early_stop and bool(compaction.hysteresis),
            carry_user_share=compaction.carry_share(),
            min_saving=compaction.saving_share(),
            ledger_share=compaction.ledger_share(bool(steps), steps[0].share if steps else None),
        )
    entries = default_pipeline_entries(summarization or SummarizationSettings(), registry)
    strategies = tuple(_scaled(registry.build(e)) for e in entries)
    early_stop = compaction.early_stop is not False
    return Pipeline(
        strategies,
        stop_when=compaction.stop_when or default_target(),
        early_stop=early_stop,
        fallback=compaction.fallback_truncation,
        hysteresis=early_stop and compaction.hysteresis is not False,
        carry_user_share=compaction.carry_share(),
        min_saving=compaction.saving_share(),
        ledger_share=compaction.ledger_share(),
    )
