"""Configuration models for the compaction core (pydantic v2).

``compaction_proxy/config/`` embeds :class:`CompactionSettings` under ``compaction:`` (and, per
model, under ``models.<pattern>.compaction``) and :class:`SummarizationSettings` under
``summarization:``; these models are the only validation there is.

* ``compaction.pipeline`` is a list of entries discriminated by ``strategy`` with the Agent
  Framework's parameter names (snake_case).  Every entry takes an optional ``trigger`` and
  ``target`` in either form (``{tokens_exceed: 2000}`` or ``{type: token_ratio, value: 0.8}``,
  see :mod:`.triggers`) and ``minimum_preserved``.  All strategy names validate here even if
  their implementation is not registered; building the pipeline reports that.
* ``summarization`` is LibreChat's block with its own camelCase key names, defaults and
  validation ranges, so a LibreChat user can paste theirs.  ``softTrim`` and ``hardClear`` are
  honoured (LibreChat silently drops them).

Unknown keys are errors everywhere; pydantic's error ``loc`` names the key path (the edge's
``ConfigError`` turns it into ``models.gpt-4o.compaction.pipeline.0.keep: ...``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .carry import DEFAULT_CARRY_SHARE
from .triggers import Condition, TokenRatio, parse_condition, parse_target

DEFAULT_MIN_SAVING = 0.02
"""``compaction.min_saving``: 2 % of the budget (see
compaction_proxy/compaction/strategies/churn.py)."""


def _trigger(value: object) -> Condition:
    return parse_condition(value, path="trigger")


def _target(value: object) -> Condition:
    return parse_target(value, path="target")


def _dump(condition: Condition) -> object:
    return condition.to_config()


TriggerField = Annotated[Condition, PlainValidator(_trigger), PlainSerializer(_dump)]
"""A trigger in either config form, parsed into a :class:`~.triggers.Condition`."""
TargetField = Annotated[Condition, PlainValidator(_target), PlainSerializer(_dump)]


def _prepare(value: object) -> Condition | None:
    if value is False or value is None:
        return None
    return parse_condition(value, path="prepare")


def _dump_prepare(condition: Condition | None) -> object:
    """In the block's own (LibreChat) form where it has one: ``{type, value}``."""
    if condition is None:
        return False
    config = condition.to_config()
    if isinstance(config, dict) and len(config) == 1:
        ((kind, value),) = config.items()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {"type": kind, "value": value}
    return config


PrepareField = Annotated[Condition | None, PlainValidator(_prepare), PlainSerializer(_dump_prepare)]
"""``summarization.prepare``: a trigger in either form, or ``false`` (off)."""
"""A target (continue while it fires); ``tokens_below`` is rejected."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class _CamelModel(BaseModel):
    """LibreChat-shaped blocks: camelCase keys (snake_case accepted too)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        arbitrary_types_allowed=True,
    )


# ------------------------------------------------------------------ LibreChat pruning block


class SoftTrimSettings(_CamelModel):
    """Soft trim: keep ``headChars`` + marker + ``tailChars`` of results over ``maxChars``."""

    max_chars: int = Field(default=4000, ge=0)
    head_chars: int = Field(default=1500, ge=0)
    tail_chars: int = Field(default=1500, ge=0)


class HardClearSettings(_CamelModel):
    """Hard clear: replace old results with ``placeholder`` (``tool_call_id`` kept)."""

    enabled: bool = True
    placeholder: str = "[Old tool result content cleared]"


class ContextPruningParams(_CamelModel):
    """LibreChat's ``contextPruning`` keys, defaults and ranges.

    ``enabled`` defaults to true (LibreChat: false, because there pruning and summarization
    exclude each other; here pruning runs first and makes summaries rarer and cheaper).
    """

    enabled: bool = True
    keep_last_assistants: int = Field(default=3, ge=0, le=10)
    soft_trim_ratio: float = Field(default=0.3, ge=0, le=1)
    hard_clear_ratio: float = Field(default=0.5, ge=0, le=1)
    min_prunable_tool_chars: int = Field(default=50_000, ge=0)
    soft_trim: SoftTrimSettings = SoftTrimSettings()
    hard_clear: HardClearSettings = HardClearSettings()


SummaryPlacement = Literal["user", "system", "assistant"]
"""The role a summary checkpoint is written with (see "Checkpoints" in docs/architecture.md)."""


class RetainRecentSettings(_CamelModel):
    """How much recent history a summary leaves verbatim (whole turns only)."""

    turns: int = Field(default=2, ge=0, le=20)
    tokens: int | None = Field(default=None, gt=0)


ReusePrefix = Literal["auto", "always", "never"]
"""``summarization.reusePrefix``: ``auto`` reuses the request's prefix when the summarizer is
the request's own upstream and model and the stretch holds no binary content; ``always``
whenever the prefix fits the summarizer's window; ``never``: the plain-text transcript."""


DryRunSummaries = Literal["call", "skip"]
"""``summarization.dryRun``: ``call`` lets a dry run call the summarizer (its summary is shared
with the real request that follows); ``skip`` keeps every dry run off the network, as the
``dry-run-local`` header value does for one request."""


class SummarizationSettings(_CamelModel):
    """LibreChat's ``summarization`` block (camelCase keys, LibreChat's defaults).

    ``reserveRatio`` also sets the budget's safety reserve (applied once).  ``trigger``, when
    set, replaces the default pipeline's ``token_ratio: 0.8``.  ``placement`` (our addition):
    the role of the summary checkpoint, ``user`` (default), ``assistant`` or ``system`` (gives
    summarized user and tool text system authority: only when the operator asks for it).
    """

    enabled: bool = True
    provider: str | None = None
    model: str | None = None
    parameters: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    prompt: str | None = None
    update_prompt: str | None = None
    max_summary_tokens: int | None = Field(default=None, gt=0)
    reserve_ratio: float = Field(default=0.05, ge=0, lt=1)
    trigger: TriggerField | None = None
    retain_recent: RetainRecentSettings = RetainRecentSettings()
    placement: SummaryPlacement = "user"
    # Our addition: seconds one summarizer call may take before the request falls back.
    timeout: float = Field(default=60.0, gt=0, le=600)
    context_pruning: ContextPruningParams = ContextPruningParams()
    # Our addition: send the summary call as the forwarded request's own prefix (its messages
    # and tools, byte for byte) plus one instruction, so the upstream's prompt cache serves it.
    reuse_prefix: ReusePrefix = "auto"
    # Our addition: a second, lower threshold. A request that crosses it goes upstream as it
    # is while the summary its trigger will need is made in the background; when the trigger
    # fires, that prepared summary is used and the request does not wait. ``false``: off.
    # 0.7: two thirds of the way from the landing point (0.5) to the trigger (0.8). Lower, a
    # summary is prepared right after every event and small windows pay one call per event.
    prepare: PrepareField = TokenRatio(0.7)
    # Unused prepared summaries expire after this long (a conversation that stopped growing).
    prepare_ttl: int = Field(default=1800, ge=10, le=86_400)
    # Background summaries in flight per process; the oldest is dropped for a new one.
    prepare_max_in_flight: int = Field(default=4, ge=1, le=256)
    # Our addition: whether `X-Compaction: dry-run` may call the summarizer (a paid call whose
    # summary the real request then reuses) or must stay off the network like `dry-run-local`.
    dry_run: DryRunSummaries = "call"


# ------------------------------------------------------------------ pipeline entries


class StrategyEntryBase(_Model):
    """Fields every pipeline entry accepts."""

    trigger: TriggerField | None = None
    target: TargetField | None = None
    minimum_preserved: int | None = Field(default=None, ge=0)


class _ContextPruningTag(StrategyEntryBase):
    strategy: Literal["context_pruning"]


class ContextPruningEntry(ContextPruningParams, _ContextPruningTag):
    """LibreChat-style pruning of old tool results (snake_case or camelCase keys).

    The parameters are LibreChat's ``contextPruning`` block (:class:`ContextPruningParams`), so
    the entry and ``summarization.contextPruning`` accept the same keys, defaults and ranges.
    ``enabled: false`` keeps the entry but never fires it (LibreChat's block pasted as is).
    Like the other entries, it is written back with snake_case keys.
    """

    # the parameters' camelCase aliases and strict keys, but written back with snake_case keys
    model_config = ConfigDict(serialize_by_alias=False)


class ToolResultCompactionEntry(StrategyEntryBase):
    """Collapse old tool-call groups into one ``[Tool results: ...]`` message."""

    strategy: Literal["tool_result_compaction"]
    keep_last_tool_call_groups: int = Field(default=1, ge=0)
    max_summary_chars: int = Field(default=4096, gt=0)


class SelectiveToolCallsEntry(StrategyEntryBase):
    """Drop old tool-call groups entirely, keeping the newest N."""

    strategy: Literal["selective_tool_calls"]
    keep_last_tool_call_groups: int = Field(default=1, ge=0)


class ClearToolUsesEntry(StrategyEntryBase):
    """Anthropic-style clearing of old tool results."""

    strategy: Literal["clear_tool_uses"]
    keep: int = Field(default=3, ge=0)
    exclude_tools: tuple[str, ...] = ()
    clear_at_least: int = Field(default=0, ge=0)
    clear_tool_inputs: bool = False
    placeholder: str = "[Old tool result content cleared]"


class SummarizationEntry(StrategyEntryBase):
    """Fold older history into a summary checkpoint.

    Two selection shapes (see :mod:`.strategies.summarization`): the Agent Framework's, chosen
    by writing ``target_count`` and/or ``threshold`` (defaults 4 and 2 as in the Agent
    Framework; ``threshold: null`` means 0), or LibreChat's ``retain_recent: {turns, tokens}``
    (the default, ``turns: 2``).  ``placement``: ``user`` (default), ``assistant`` or
    ``system``.  Prompts and the summarizer model are set in the ``summarization`` block.
    """

    strategy: Literal["summarization"]
    target_count: int | None = Field(default=None, ge=1)
    threshold: int | None = Field(default=None, ge=0)
    retain_recent: RetainRecentSettings | None = None
    placement: SummaryPlacement = "user"

    @property
    def uses_group_shape(self) -> bool:
        """True when ``target_count`` or ``threshold`` was written (Agent Framework shape)."""
        return bool({"target_count", "threshold"} & self.model_fields_set)

    @model_validator(mode="after")
    def _check(self) -> SummarizationEntry:
        if self.uses_group_shape and self.retain_recent is not None:
            raise ValueError(
                "set target_count/threshold (Agent Framework shape) or retain_recent "
                "(LibreChat shape), not both"
            )
        return self


class SlidingWindowEntry(StrategyEntryBase):
    """Keep the last N turns (``keep_last_turns``) or groups (``keep_last_groups``)."""

    strategy: Literal["sliding_window"]
    keep_last_groups: int | None = Field(default=None, gt=0)
    keep_last_turns: int | None = Field(default=None, gt=0)
    preserve_system: bool = True

    @model_validator(mode="after")
    def _check(self) -> SlidingWindowEntry:
        if self.keep_last_groups is not None and self.keep_last_turns is not None:
            raise ValueError("set keep_last_groups or keep_last_turns, not both")
        if self.keep_last_groups is None and self.keep_last_turns is None and not self.trigger:
            raise ValueError(
                "sliding_window needs keep_last_groups, keep_last_turns or a "
                "trigger such as {turns_exceed: 4}"
            )
        if not self.preserve_system:
            raise ValueError("preserve_system must be true: system messages are never removed")
        return self


class TruncationEntry(StrategyEntryBase):
    """Drop oldest groups; Agent Framework's ``max_n``/``compact_to`` or trigger/target."""

    strategy: Literal["truncation"]
    max_n: int | None = Field(default=None, gt=0)
    compact_to: int | None = Field(default=None, gt=0)
    metric: Literal["tokens", "messages"] = "tokens"
    preserve_system: bool = True
    preserve_first_user_group: bool = False

    @model_validator(mode="after")
    def _check(self) -> TruncationEntry:
        if self.compact_to is not None and (self.max_n is None or self.compact_to > self.max_n):
            raise ValueError("compact_to requires max_n and must satisfy compact_to <= max_n")
        if not self.preserve_system:
            raise ValueError("preserve_system must be true: system messages are never removed")
        return self


class PipelineEntry(StrategyEntryBase):
    """A nested pipeline: children in order, in one of the Agent Framework's two compositions.

    Without ``token_budget``: the plain pipeline (.NET ``PipelineCompactionStrategy``): fires
    always and runs every child by its own trigger; ``early_stop``, ``stop_when`` and
    ``fallback`` are refused there.  With ``token_budget: N``: the token-budget composition
    (Python ``TokenBudgetComposedStrategy``): fire above N tokens, stop as soon as it fits
    (``early_stop``, default true; ``stop_when`` another stop condition), then an oldest-first
    ``fallback`` (default true).
    """

    strategy: Literal["pipeline"]
    strategies: list[StrategyEntry]
    stop_when: TargetField | None = None
    early_stop: bool | None = None
    token_budget: int | None = Field(default=None, ge=0)
    fallback: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> PipelineEntry:
        if self.token_budget is None:
            mixed = [
                key
                for key, value in (
                    ("early_stop", self.early_stop),
                    ("stop_when", self.stop_when),
                    ("fallback", self.fallback),
                )
                if value not in (None, False)
            ]
            if mixed:
                raise ValueError(
                    f"{' and '.join(mixed)} {'belongs' if len(mixed) == 1 else 'belong'} to a "
                    "token_budget pipeline (the Agent "
                    "Framework's TokenBudgetComposedStrategy): set token_budget, or leave them "
                    "out for a plain pipeline (PipelineCompactionStrategy: every entry by its "
                    "own trigger)"
                )
        return self


StrategyEntry = Annotated[
    ContextPruningEntry
    | ToolResultCompactionEntry
    | SelectiveToolCallsEntry
    | ClearToolUsesEntry
    | SummarizationEntry
    | SlidingWindowEntry
    | TruncationEntry
    | PipelineEntry,
    Field(discriminator="strategy"),
]
"""One ``compaction.pipeline`` entry, discriminated by ``strategy``."""

STRATEGY_NAMES = (
    "context_pruning",
    "tool_result_compaction",
    "selective_tool_calls",
    "clear_tool_uses",
    "summarization",
    "sliding_window",
    "truncation",
    "pipeline",
)

PipelineEntry.model_rebuild()


# ------------------------------------------------------------------ the compaction block


class CalibrationSettings(_Model):
    """Bounds of the usage-based calibration ratio used in trigger decisions."""

    enabled: bool = True
    min_ratio: float = Field(default=0.5, gt=0)
    max_ratio: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> CalibrationSettings:
        if self.min_ratio > self.max_ratio:
            raise ValueError("min_ratio must be <= max_ratio")
        return self


class ImageSettings(_Model):
    """Image pricing constants (see :mod:`.images`)."""

    base_tokens: int = Field(default=85, ge=0)
    tile_tokens: int = Field(default=170, ge=0)
    unknown_size_tokens: int = Field(default=765, ge=0)


class TokenizerSettings(_Model):
    """Where encodings come from and how counts are cached."""

    encodings_dir: str | None = None
    # Fetch missing encodings once, in the background, at start-up (the edge does it; until
    # they arrive, and when there is no network, counts use the estimator).
    download: bool = True
    default_encoding: str = "o200k_base"
    cache_size: int = Field(default=65_536, ge=0)
    images: ImageSettings = ImageSettings()


class CompactionSettings(_Model):
    """The ``compaction:`` block.

    ``pipeline``: explicit entries; when absent the default pipeline is derived from the
    ``summarization`` block (:func:`compaction_proxy.compaction.factory.default_pipeline_entries`).
    The composition (see :mod:`.strategies.composite`): ``early_stop`` (``None``: false for an
    explicit pipeline, which is then a plain pipeline, every entry by its own trigger; true for
    the derived default pipeline, a token-budget composition); ``stop_when``, the token-budget
    composition's budget (default ``over_budget``; the default pipeline's: its target
    ``token_ratio: 0.5``); ``hysteresis`` (``None``: on for the default pipeline only), once an
    entry acted the later ones run towards ``stop_when`` whatever their own trigger says.
    ``stop_when`` and ``hysteresis`` need ``early_stop`` (a plain pipeline has neither).
    ``fallback_truncation``: the proxy's own guarantee that the request fits, whatever the
    composition. ``carry_user_messages`` and ``min_saving`` apply to every pipeline, configured
    or default (see :mod:`.carry` and :mod:`.churn`).
    """

    enabled: bool = True
    pipeline: list[StrategyEntry] | None = None
    stop_when: TargetField | None = None
    early_stop: bool | None = None
    hysteresis: bool | None = None
    fallback_truncation: bool = True
    # Our addition: when old turns are folded (summarized, or dropped by a sliding window or a
    # truncation), their user messages stay verbatim, newest first, while together they fit
    # this share of the budget (compaction_proxy/compaction/carry.py); 0: none are carried.
    carry_user_messages: float = Field(default=DEFAULT_CARRY_SHARE, ge=0, le=0.5)
    # Our addition: a strategy whose work saves less than this share of the budget is undone,
    # so the forwarded prefix (and the upstream's prompt cache) stays; 0: every change is kept.
    min_saving: float = Field(default=DEFAULT_MIN_SAVING, ge=0, lt=1)
    calibration: CalibrationSettings = CalibrationSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()

    @model_validator(mode="after")
    def _check(self) -> CompactionSettings:
        if self.pipeline is not None and self.early_stop is not True:
            mixed = [
                key
                for key, value in (("stop_when", self.stop_when), ("hysteresis", self.hysteresis))
                if value not in (None, False)
            ]
            if mixed:
                raise ValueError(
                    f"{' and '.join(mixed)} {'belongs' if len(mixed) == 1 else 'belong'} to a "
                    "token-budget composition: add "
                    "early_stop: true (skip the remaining entries once stop_when no longer "
                    "fires), or leave them out for a plain pipeline (every entry by its own "
                    "trigger)"
                )
        if self.hysteresis and self.early_stop is False:
            raise ValueError("hysteresis needs early_stop: it runs the entries towards stop_when")
        return self


def entry_to_config(entry: BaseModel) -> dict[str, Any]:
    """An entry as config (conditions in our form), e.g. for ``check-config`` output."""
    return entry.model_dump(mode="json", exclude_none=True, by_alias=False)
