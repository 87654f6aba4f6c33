"""Configuration models for the compaction core (pydantic v2).

``compaction_proxy/config/`` embeds :class:`CompactionSettings` under ``compaction:`` (and, per
model, under ``models.<pattern>.compaction``) and :class:`SummarizationSettings` under
``summarization:``; these models are the only validation there is.

* ``compaction.pipeline`` is a list of entries, each validated by the parameter model that its
  ``strategy`` names in the strategy registry (:mod:`.strategies.registry`; the models sit
  beside their strategies, with the Agent Framework's parameter names).  Every entry takes an
  optional ``trigger`` and ``target`` in either form (``{tokens_exceed: 2000}`` or ``{type:
  token_ratio, value: 0.8}``, see :mod:`.triggers`) and ``minimum_preserved``.
  ``compaction.plugins`` registers strategies of the user's own before the entries are read.
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
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .budget import DEFAULT_RESERVE_SHARE
from .carry import DEFAULT_CARRY_SHARE
from .fields import CamelModel, StrictModel, TargetField, TriggerField, error_at, parse_duration
from .strategies.context_pruning import ContextPruningSettings
from .strategies.ledger_step import DEFAULT_LEDGER_SHARE
from .strategies.registry import PluginError, StrategyEntry, registry_for
from .strategies.summarization import Placement, RetainRecentSettings
from .triggers import Condition, TokenRatio, parse_condition

DEFAULT_MIN_SAVING = 0.02
"""``compaction.min_saving``: 2 % of the budget (see
compaction_proxy/compaction/strategies/_support/churn.py)."""


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


ReusePrefix = Literal["auto", "always", "never"]
"""``summarization.reusePrefix``: ``auto`` reuses the request's prefix when the summarizer is
the request's own upstream and model and the stretch holds no binary content; ``always``
whenever the prefix fits the summarizer's window; ``never``: the plain-text transcript."""


DryRunSummaries = Literal["call", "skip"]
"""``summarization.dryRun``: ``call`` lets a dry run call the summarizer (its summary is shared
with the real request that follows); ``skip`` keeps every dry run off the network, as the
``dry-run-local`` header value does for one request."""


class SummarizationSettings(CamelModel):
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
    placement: Placement = "user"
    # Our addition: seconds one summarizer call may take before the request falls back.
    timeout: float = Field(default=60.0, gt=0, le=600)
    context_pruning: ContextPruningSettings = ContextPruningSettings()
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


# ------------------------------------------------------------------ the compaction block


class CalibrationSettings(StrictModel):
    """Bounds of the usage-based calibration ratio used in trigger decisions."""

    enabled: bool = True
    min_ratio: float = Field(default=0.5, gt=0)
    max_ratio: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> CalibrationSettings:
        if self.min_ratio > self.max_ratio:
            raise ValueError("min_ratio must be <= max_ratio")
        return self


class ImageSettings(StrictModel):
    """Image pricing constants (see :mod:`.images`)."""

    base_tokens: int = Field(default=85, ge=0)
    tile_tokens: int = Field(default=170, ge=0)
    unknown_size_tokens: int = Field(default=765, ge=0)


class TokenizerSettings(StrictModel):
    """Where encodings come from and how counts are cached."""

    encodings_dir: str | None = None
    # Fetch missing encodings once, in the background, at start-up (the edge does it; until
    # they arrive, and when there is no network, counts use the estimator).
    download: bool = True
    default_encoding: str = "o200k_base"
    cache_size: int = Field(default=65_536, ge=0)
    images: ImageSettings = ImageSettings()


class RecallSettings(StrictModel):
    """``compaction.recall``: what compaction removes is archived and the model may ask for it
    back (docs/recall.md). Off by default; when on, every removed or rewritten message is kept
    in the checkpoint store under a short id its placeholder or summary names, and an agent's
    request (one that declares tools) is offered the ``compaction_recall`` tool, which the proxy
    answers itself.

    ``max_rounds``: hidden recall rounds per request (the upstream calls a recall costs beyond
    the client's one); ``max_tokens``: the most one recall answer returns (longer originals are
    paged); ``ttl``: how long archived originals are kept; ``max_archive_mb``: the archive one
    conversation may name (its oldest entries fall out of reach first); ``time_budget``:
    seconds the hidden rounds of one request may take before the model is asked to answer
    without more recall.
    """

    enabled: bool = False
    max_rounds: int = Field(default=3, ge=1, le=10)
    max_tokens: int = Field(default=4000, ge=100, le=100_000)
    ttl: str | int = "7d"
    max_archive_mb: float = Field(default=16.0, gt=0, le=1024)
    time_budget: float = Field(default=60.0, gt=0, le=600)

    @field_validator("ttl")
    @classmethod
    def _ttl_parses(cls, value: str | int) -> str | int:
        if parse_duration(value) < 1:
            raise ValueError("must be at least one second")
        return value

    @property
    def ttl_seconds(self) -> int:
        return parse_duration(self.ttl)

    @property
    def max_archive_bytes(self) -> int:
        return int(self.max_archive_mb * 1024 * 1024)


class LedgerSettings(StrictModel):
    """``compaction.ledger``: the exact strings of what compaction folds, kept beside the
    summary (compaction_proxy/compaction/ledger/; "The ledger" in docs/compaction.md).

    ``enabled``: ``None`` (the default) means on in the default pipeline (and LibreChat's
    block, which is the default pipeline) and off in an explicit ``compaction.pipeline`` unless
    it names ``- strategy: ledger``; ``true``/``false`` decide for either.  ``share``: the most
    of the budget the block may take (rules are never left out by it; they go last, when the
    budget cannot be met otherwise)."""

    enabled: bool | None = None
    share: float = Field(default=DEFAULT_LEDGER_SHARE, gt=0, le=0.9)


class CompactionSettings(StrictModel):
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
    composition. ``carry_user_messages`` and ``min_saving`` (see :mod:`.carry` and
    :mod:`.strategies._support.churn`) are the proxy's own additions: the default pipeline has them
    (:data:`~.carry.DEFAULT_CARRY_SHARE`, :data:`DEFAULT_MIN_SAVING`) unless the block sets them;
    an explicit ``pipeline`` is read in the Agent Framework's terms and has them only where the
    block writes them (:meth:`carry_share`, :meth:`saving_share`). ``output_reserve_share`` and
    ``lower_output_limit`` bound the output reserve and lower the forwarded output limit
    (:mod:`.budget`); a ``models.<pattern>`` entry's own keys of those names win.

    ``plugins``: ``"module:function"`` references, each called once with the strategy registry
    to register strategies of the user's own (:mod:`.strategies.registry`).  Declared before
    ``pipeline``: pydantic validates fields in order, so they are loaded when the entries that
    name their strategies are read.
    """

    enabled: bool = True
    plugins: tuple[str, ...] = ()
    pipeline: list[StrategyEntry] | None = None
    stop_when: TargetField | None = None
    early_stop: bool | None = None
    hysteresis: bool | None = None
    fallback_truncation: bool = True
    # Our addition: when old turns are folded (summarized, or dropped by a sliding window or a
    # truncation), their user messages stay verbatim, newest first, while together they fit
    # this share of the budget (compaction_proxy/compaction/carry.py); 0: none are carried.
    # None: the default pipeline's own (DEFAULT_CARRY_SHARE); an explicit pipeline's, 0.
    carry_user_messages: float | None = Field(default=None, ge=0, le=0.5)
    # Our addition: a strategy whose work saves less than this share of the budget is undone,
    # so the forwarded prefix (and the upstream's prompt cache) stays; 0: every change is kept.
    # None: the default pipeline's own (DEFAULT_MIN_SAVING); an explicit pipeline's, 0.
    min_saving: float | None = Field(default=None, ge=0, lt=1)
    # Our addition: a request's own output limit (max_tokens, max_completion_tokens,
    # max_output_tokens) reserves at most this share of the window in the budget
    # (compaction_proxy/compaction/budget.py); 1: the whole limit, as asked.
    output_reserve_share: float = Field(default=DEFAULT_RESERVE_SHARE, gt=0, le=1)
    # Our addition: when the compacted prompt plus the asked output limit would not fit the
    # window, forward the limit lowered so they do (never raised); off: forward it as asked.
    lower_output_limit: bool = True
    calibration: CalibrationSettings = CalibrationSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    # Our addition: removed content archived, and a recall tool the proxy answers (docs/recall.md).
    recall: RecallSettings = RecallSettings()
    # Our addition: what compaction folds leaves its exact strings (paths, commands, errors,
    # numbers, the user's rules) in one ledger message (docs/compaction.md, "The ledger").
    ledger: LedgerSettings = LedgerSettings()

    def carry_share(self) -> float:
        """``carry_user_messages`` as the pipeline applies it: as written, else the default
        pipeline's share, and none for an explicit pipeline (the Agent Framework carries
        nothing)."""
        if self.carry_user_messages is not None:
            return self.carry_user_messages
        return DEFAULT_CARRY_SHARE if self.pipeline is None else 0.0

    def ledger_share(self, named: bool = False, step_share: float | None = None) -> float | None:
        """The ledger's share as the pipeline applies it (``None``: no ledger): ``enabled``
        as written; else on for the default pipeline and for an explicit one that names
        ``- strategy: ledger`` (``named``; ``step_share``: its own ``share``, else this
        block's).  A ported Agent Framework pipeline without the entry has none."""
        if self.ledger.enabled is False:
            return None
        if self.ledger.enabled or self.pipeline is None or named:
            return step_share if step_share is not None else self.ledger.share
        return None

    def saving_share(self) -> float:
        """``min_saving`` as the pipeline applies it: as written, else the default pipeline's
        minimum, and none for an explicit pipeline (the Agent Framework keeps every change)."""
        if self.min_saving is not None:
            return self.min_saving
        return DEFAULT_MIN_SAVING if self.pipeline is None else 0.0

    @field_validator("plugins")
    @classmethod
    def _load_plugins(cls, plugins: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        registry = registry_for(info.context)
        for index, reference in enumerate(plugins):
            try:
                registry.load_plugin(reference)
            except PluginError as exc:
                raise error_at((index,), "plugin", str(exc), reference) from None
        return plugins

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


def preload_plugins(block: object, context: object = None) -> None:
    """Load a ``compaction`` block's ``plugins`` ahead of its validation, for a document whose
    other parts (``models.<pattern>.compaction``) are validated first and may name their
    strategies.  A reference that fails is left for the block's own validation, which reports
    it with its key path."""
    plugins = block.get("plugins") if isinstance(block, dict) else None
    if not isinstance(plugins, list | tuple):
        return
    registry = registry_for(context)
    for reference in plugins:
        try:
            registry.load_plugin(reference)
        except PluginError:
            continue
