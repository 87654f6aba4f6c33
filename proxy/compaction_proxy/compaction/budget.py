"""Model facts, the token budget, the output limit forwarded and the calibration ratio.

The budget is what the prompt may use: ``window - output_reserve - reserve_ratio * window``.
One rule gives the output reserve, whatever the window's source (declared in ``models:``,
learned from a refusal, published by the upstream, the built-in table or the default guess):

1. the request's ``max_completion_tokens`` (or ``max_tokens``) when it sends one, at most
   ``output_reserve_share`` of the window (source ``request``; ``share`` when the request
   asked more than the share and the share is what is reserved). A coding agent asks the same
   large limit on every request (Claude Code: 32,000), whatever the window: on a 32k local
   window a reserve of that size would leave the conversation nothing. The share (the core's
   default 1.0, the configuration's :data:`DEFAULT_RESERVE_SHARE`) bounds it; a request asking
   less than the share reserves what it asks, as before the bound existed;
2. else the model's ``max_output_tokens`` (a ``models:`` entry's, else the built-in table's),
   at most half the window, so a window far below the model's published one still leaves a
   prompt budget (source ``model``);
3. else :data:`DEFAULT_OUTPUT_SHARE` of the window, at most :data:`DEFAULT_OUTPUT_CAP` tokens
   (source ``default``): 2,048 for an 8,192 window, 4,096 from a 16k window on.

A bounded reserve means the prompt may grow until prompt + asked output is more than the
window, which vLLM, SGLang and Anthropic refuse (llama.cpp and OpenAI cut the answer at the
window instead). :meth:`Budget.output_limit` says what to forward instead: with
``lower_output`` on, the asked limit lowered to what the window leaves after the prompt and the
safety reserve, never raised and never below :data:`OUTPUT_FLOOR` (or the reserve, when that
is smaller). A prompt within the budget always leaves at least the reserve, so the lowered
limit lies between the reserve and the asked one.

``reserve_ratio`` (LibreChat's ``reserveRatio``) is the margin for counting error, applied once
to the window (LibreChat subtracts it twice).  :class:`Budget` keeps where each part came from,
for the report, the preview and ``compact``.  :func:`output_reserve` is the one place the
reserve is decided.

Facts come from a built-in table, matched by exact name, then glob, then the longest name
prefix that ends at a ``-`` (so dated variants such as ``gpt-4o-2024-08-06`` resolve, while
``gpt-4.1`` never matches ``gpt-4``).  Operator overrides by name or glob take precedence and
may set only some fields; unknown models get ``default_context_window``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any, Literal

O200K = "o200k_base"
CL100K = "cl100k_base"


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the budget needs to know about a model.

    ``max_output_tokens`` is the output reserve used when the request sets no limit; ``None``
    when nothing says it (an unknown model): the default reserve then applies (see the module
    docstring).

    ``output_reserve_share`` and ``lower_output``: the operator's choice for this model's
    output reserve and forwarded limit (``models.<name>``); ``None``: the run's
    (:class:`~.pipeline.CompactionRequest`'s, from the ``compaction`` block).
    """

    context_window: int
    max_output_tokens: int | None
    encoding: str = O200K
    output_reserve_share: float | None = None
    lower_output: bool | None = None


@dataclass(frozen=True, slots=True)
class FactsOverride:
    """A partial override from configuration; unset fields keep the underlying facts."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    encoding: str | None = None
    output_reserve_share: float | None = None
    lower_output: bool | None = None

    def apply(self, facts: ModelFacts) -> ModelFacts:
        """``facts`` with this override's set fields replaced."""
        return replace(
            facts,
            context_window=self.context_window or facts.context_window,
            max_output_tokens=(
                self.max_output_tokens
                if self.max_output_tokens is not None
                else facts.max_output_tokens
            ),
            encoding=self.encoding or facts.encoding,
            output_reserve_share=(
                self.output_reserve_share
                if self.output_reserve_share is not None
                else facts.output_reserve_share
            ),
            lower_output=self.lower_output if self.lower_output is not None else facts.lower_output,
        )


BUILTIN_MODELS: Mapping[str, ModelFacts] = {
    "gpt-4o": ModelFacts(128_000, 16_384, O200K),
    "gpt-4o-mini": ModelFacts(128_000, 16_384, O200K),
    "chatgpt-4o-latest": ModelFacts(128_000, 16_384, O200K),
    "gpt-4.1": ModelFacts(1_047_576, 32_768, O200K),
    "gpt-4.1-mini": ModelFacts(1_047_576, 32_768, O200K),
    "gpt-4.1-nano": ModelFacts(1_047_576, 32_768, O200K),
    "o1": ModelFacts(200_000, 100_000, O200K),
    "o1-mini": ModelFacts(128_000, 65_536, O200K),
    "o1-preview": ModelFacts(128_000, 32_768, O200K),
    "o3": ModelFacts(200_000, 100_000, O200K),
    "o3-mini": ModelFacts(200_000, 100_000, O200K),
    "o4-mini": ModelFacts(200_000, 100_000, O200K),
    "gpt-5": ModelFacts(400_000, 128_000, O200K),
    "gpt-5-mini": ModelFacts(400_000, 128_000, O200K),
    "gpt-5-nano": ModelFacts(400_000, 128_000, O200K),
    "gpt-4-turbo": ModelFacts(128_000, 4_096, CL100K),
    "gpt-4-*-preview": ModelFacts(128_000, 4_096, CL100K),
    "gpt-4-32k": ModelFacts(32_768, 4_096, CL100K),
    "gpt-4": ModelFacts(8_192, 4_096, CL100K),
    "gpt-3.5-turbo": ModelFacts(16_385, 4_096, CL100K),
    "gpt-3.5-turbo-instruct": ModelFacts(4_096, 1_024, CL100K),
    # Anthropic's models. "claude" is the family's default (200k) by the longest-prefix rule;
    # the globs, tried before any prefix, give the models with a 1M window: Opus and Sonnet
    # 4.6 on, every model of generation 5 on. Claude has no public tokenizer: counts use
    # o200k_base and the calibration from the upstream's usage corrects them.
    "claude-opus-4[.-][6-9]*": ModelFacts(1_000_000, 128_000, O200K),
    "claude-sonnet-4[.-][6-9]*": ModelFacts(1_000_000, 64_000, O200K),
    "claude-opus-[5-9]*": ModelFacts(1_000_000, 128_000, O200K),
    "claude-sonnet-[5-9]*": ModelFacts(1_000_000, 128_000, O200K),
    "claude-haiku-[5-9]*": ModelFacts(1_000_000, 128_000, O200K),
    "claude-fable-*": ModelFacts(1_000_000, 128_000, O200K),
    "claude-mythos-*": ModelFacts(1_000_000, 128_000, O200K),
    "claude": ModelFacts(200_000, None, O200K),
    "claude-opus-4": ModelFacts(200_000, 32_000, O200K),
    "claude-opus-4-5": ModelFacts(200_000, 64_000, O200K),
    "claude-sonnet-4": ModelFacts(200_000, 64_000, O200K),
    "claude-haiku-4-5": ModelFacts(200_000, 64_000, O200K),
    "claude-3-7-sonnet": ModelFacts(200_000, 64_000, O200K),
    "claude-3-5": ModelFacts(200_000, 8_192, O200K),
    "claude-3": ModelFacts(200_000, 4_096, O200K),
}
"""Context windows and default output reserves of common OpenAI and Anthropic models.

The reserve is the published maximum output, except for gpt-4 (8k window, where reserving
the full 8k would leave no prompt budget) and the gpt-4 family's 4k output limit. Anthropic's
1M-context beta (a request header, not a model) is the Messages format's
(compaction_proxy/wire/messages/_sizes.py).
"""

DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_OUTPUT_SHARE = 0.25
"""The default output reserve's share of the window (no request limit, no model figure)."""
DEFAULT_OUTPUT_CAP = 4_096
"""The default output reserve's upper end, in tokens."""
MODEL_OUTPUT_SHARE = 0.5
"""A model's ``max_output_tokens`` reserves at most this share of the window."""
DEFAULT_RESERVE_SHARE = 0.25
"""``compaction.output_reserve_share``: a request's asked output reserves at most this share
of the window. A quarter keeps three quarters of a 32k window for the conversation while
reserving 8,192 tokens of answer, more than a coding agent's turn needs; from a 128k window on
it reserves 32,000 and more, so the limits clients ask of hosted models are reserved whole."""
OUTPUT_FLOOR = 1_024
"""A lowered output limit is never below this (or the output reserve, when that is smaller):
an answer cut shorter is not worth the call, and a prompt that leaves less room is over its
budget anyway (the report warns), so the upstream's own verdict is better than a stub."""


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _lookup(model: str, table: Mapping[str, ModelFacts]) -> ModelFacts | None:
    facts = table.get(model)
    if facts is not None:
        return facts
    for pattern, candidate in table.items():
        if _is_glob(pattern) and fnmatchcase(model, pattern):
            return candidate
    best: tuple[int, ModelFacts] | None = None
    for name, candidate in table.items():
        if (
            not _is_glob(name)
            and model.startswith(name)
            and model[len(name)] == "-"
            and (best is None or len(name) > best[0])
        ):
            best = (len(name), candidate)
    return best[1] if best else None


class ModelCatalog:
    """Resolves :class:`ModelFacts` for a model name (overrides, built-ins, default).

    A provider prefix (``openai/gpt-4o``) is tried as given and then without the prefix.
    """

    def __init__(
        self,
        overrides: Mapping[str, FactsOverride | ModelFacts] | None = None,
        *,
        default_context_window: int = DEFAULT_CONTEXT_WINDOW,
        default_max_output_tokens: int | None = None,
        default_encoding: str = O200K,
        builtins: Mapping[str, ModelFacts] = BUILTIN_MODELS,
    ) -> None:
        self._overrides = dict(overrides or {})
        self._builtins = builtins
        self._memo: dict[str, ModelFacts] = {}
        self._known: dict[str, tuple[int | None, int | None]] = {}
        self._default = ModelFacts(
            default_context_window, default_max_output_tokens, default_encoding
        )

    def facts_for(self, model: str) -> ModelFacts:
        """The facts for ``model``: built-in (or default) facts with any override applied.

        Resolved once per model name (glob matching over every override and built-in is the
        slow part) and then served from a bounded memo.
        """
        cached = self._memo.get(model)
        if cached is not None:
            return cached
        facts = self._resolve(model)
        if len(self._memo) < 4096:
            self._memo[model] = facts
        return facts

    def known_windows(self, model: str) -> tuple[int | None, int | None]:
        """Where ``model``'s window is actually known: (an override's, the built-in table's).

        ``None`` where that source says nothing, so a caller can tell a known window from the
        default guess and put other sources (a window learned from the upstream) in between.
        Memoized like :meth:`facts_for`.
        """
        cached = self._known.get(model)
        if cached is not None:
            return cached
        names = _names(model)
        configured: int | None = None
        for name in names:
            override = self._find_override(name)
            if override is not None:
                configured = override.context_window or None
                break
        builtin = next(
            (facts.context_window for n in names if (facts := _lookup(n, self._builtins))),
            None,
        )
        if len(self._known) < 4096:
            self._known[model] = (configured, builtin)
        return configured, builtin

    def window_source(self, model: str) -> str:
        """Where :meth:`facts_for`'s window comes from: ``config``, ``builtin`` or
        ``default``."""
        configured, builtin = self.known_windows(model)
        if configured is not None:
            return "config"
        return "builtin" if builtin is not None else "default"

    def _resolve(self, model: str) -> ModelFacts:
        names = _names(model)
        base: ModelFacts | None = None
        for name in names:
            base = _lookup(name, self._builtins)
            if base is not None:
                break
        facts = base or self._default
        for name in names:
            override = self._find_override(name)
            if override is not None:
                if isinstance(override, ModelFacts):
                    return override
                return override.apply(facts)
        return facts

    def _find_override(self, model: str) -> FactsOverride | ModelFacts | None:
        override = self._overrides.get(model)
        if override is not None:
            return override
        for pattern, candidate in self._overrides.items():
            if _is_glob(pattern) and fnmatchcase(model, pattern):
                return candidate
        return None


def _names(model: str) -> list[str]:
    """The names ``model`` is looked up by: as given, then without a provider prefix."""
    return [model, model.rsplit("/", 1)[-1]] if "/" in model else [model]


OutputSource = Literal["request", "share", "model", "default"]
"""Where an output reserve came from (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class OutputLimit:
    """The output limit the request asked for and the one to forward (the report's
    ``output_limit``): equal unless it was lowered so that the prompt and the output fit the
    window (:meth:`Budget.output_limit`). ``fits``: whether the prompt and ``forwarded`` fit
    the window less its safety reserve."""

    asked: int
    forwarded: int
    fits: bool

    @property
    def lowered(self) -> bool:
        return self.forwarded < self.asked

    def to_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "forwarded": self.forwarded, "lowered": self.lowered}


@dataclass(frozen=True, slots=True)
class Budget:
    """The prompt budget for one request and how it was derived.

    ``window_source``: where the window came from (``config``, ``learned``, ``discovered``,
    ``builtin``, ``default``; ``given`` when the caller passed the facts themselves);
    ``output_source``: ``request``, ``share``, ``model`` or ``default``; ``reserve_ratio``:
    the share of the window kept as ``safety_reserve``. ``output_asked``: the request's own
    output limit (None: it set none); ``output_share``: the share of the window it may
    reserve; ``lower_output``: whether :meth:`output_limit` may lower it.
    """

    context_window: int
    output_reserve: int
    safety_reserve: int
    window_source: str = "given"
    output_source: OutputSource = "model"
    reserve_ratio: float = 0.0
    output_asked: int | None = None
    output_share: float = 1.0
    lower_output: bool = False

    @property
    def limit(self) -> int:
        """Tokens the prompt (messages + tools + priming) may use; never negative."""
        return max(0, self.context_window - self.output_reserve - self.safety_reserve)

    def sources(self) -> dict[str, Any]:
        """Where each part came from, JSON-ready (the report's ``budget`` entry); the share
        is named when it is what bounded the reserve."""
        out: dict[str, Any] = {
            "window_source": self.window_source,
            "output_source": self.output_source,
            "reserve_ratio": self.reserve_ratio,
        }
        if self.output_source == "share":
            out["output_share"] = self.output_share
        return out

    def output_room(self, prompt_tokens: int) -> int:
        """The output the window leaves after a prompt of ``prompt_tokens`` (calibrated) and
        the safety reserve, the margin for our counting error (it may be negative)."""
        return self.context_window - self.safety_reserve - prompt_tokens

    def output_limit(self, prompt_tokens: int) -> OutputLimit | None:
        """The output limit to forward with a prompt of ``prompt_tokens`` (calibrated); None
        when the request asked for none (nothing to lower: the upstream then stops at the
        window itself).

        Lowered only when ``lower_output`` is on and the asked limit does not fit what the
        window leaves (:meth:`output_room`); then to that room, never raised, never below
        ``min(OUTPUT_FLOOR, output_reserve)`` (nor below 1). Within the budget the room is at
        least the reserve, so the prompt and the forwarded limit fit the window.
        """
        asked = self.output_asked
        if asked is None:
            return None
        room = self.output_room(prompt_tokens)
        if asked <= room or not self.lower_output:
            return OutputLimit(asked, asked, asked <= room)
        floor = max(1, min(OUTPUT_FLOOR, self.output_reserve))
        forwarded = min(asked, max(room, floor))
        return OutputLimit(asked, forwarded, forwarded <= room)


def output_reserve(
    facts: ModelFacts,
    *,
    max_completion_tokens: int | None = None,
    max_tokens: int | None = None,
    share: float = 1.0,
) -> tuple[int, OutputSource]:
    """The output reserve and its source, by the one rule of the module docstring; ``share``:
    the share of the window a request's own limit may reserve."""
    window = facts.context_window
    requested = asked_output(max_completion_tokens, max_tokens)
    if requested is not None:
        bound = math.floor(window * share)
        if requested > bound:
            return bound, "share"
        return requested, "request"
    if facts.max_output_tokens is not None:
        return min(facts.max_output_tokens, math.floor(window * MODEL_OUTPUT_SHARE)), "model"
    return min(DEFAULT_OUTPUT_CAP, math.floor(window * DEFAULT_OUTPUT_SHARE)), "default"


def asked_output(max_completion_tokens: int | None, max_tokens: int | None) -> int | None:
    """The request's output limit: ``max_completion_tokens`` when set, else ``max_tokens``
    (as OpenAI and vLLM read them); None for neither (or a negative one)."""
    requested = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return requested if requested is not None and requested >= 0 else None


def compute_budget(
    facts: ModelFacts,
    *,
    max_completion_tokens: int | None = None,
    max_tokens: int | None = None,
    reserve_ratio: float = 0.05,
    window_source: str = "given",
    output_share: float = 1.0,
    lower_output: bool = False,
) -> Budget:
    """Budget = window - output reserve - reserve_ratio x window (the ratio applied once).

    ``output_share`` and ``lower_output``: the run's; the facts' own
    (``ModelFacts.output_reserve_share``, ``ModelFacts.lower_output``) win when set.
    """
    if not 0 <= reserve_ratio < 1:
        raise ValueError("reserve_ratio must be in [0, 1)")
    share = facts.output_reserve_share if facts.output_reserve_share is not None else output_share
    if not 0 < share <= 1:
        raise ValueError("output_reserve_share must be in (0, 1]")
    output, source = output_reserve(
        facts, max_completion_tokens=max_completion_tokens, max_tokens=max_tokens, share=share
    )
    return Budget(
        context_window=facts.context_window,
        output_reserve=output,
        safety_reserve=math.floor(reserve_ratio * facts.context_window),
        window_source=window_source,
        output_source=source,
        reserve_ratio=reserve_ratio,
        output_asked=asked_output(max_completion_tokens, max_tokens),
        output_share=share,
        lower_output=facts.lower_output if facts.lower_output is not None else lower_output,
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """A bounded ratio ``upstream prompt_tokens / our count`` applied in trigger decisions.

    tiktoken miscounts non-OpenAI models served behind OpenAI-compatible APIs; the edge
    measures the ratio from ``usage.prompt_tokens`` and passes it in.  It is clamped to
    ``[minimum, maximum]`` so one odd response cannot make compaction wild.

    ``offset``: tokens added after the ratio.  Background preparation compacts a conversation
    *before* it reaches its trigger, as if the growth still to come were already there, so the
    prepared result lands at the target by the time it is used (see "Prepared summaries" in
    compaction_proxy/engine/README.md).  Zero for every ordinary request.
    """

    ratio: float = 1.0
    minimum: float = 0.5
    maximum: float = 2.0
    offset: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.maximum:
            raise ValueError("calibration bounds must satisfy 0 < minimum <= maximum")
        if self.offset < 0:
            raise ValueError("calibration offset must be >= 0")

    @property
    def effective(self) -> float:
        """The ratio clamped to its bounds."""
        return min(self.maximum, max(self.minimum, self.ratio))

    def apply(self, tokens: int) -> int:
        """Calibrated count for trigger decisions (rounded up, to err on the safe side)."""
        return math.ceil(tokens * self.effective - 1e-9) + self.offset

    @classmethod
    def observed(
        cls, reported: int, counted: int, *, minimum: float = 0.5, maximum: float = 2.0
    ) -> Calibration:
        """A calibration from one observation; 1.0 when either side is unusable."""
        ratio = reported / counted if reported > 0 and counted > 0 else 1.0
        return cls(ratio=ratio, minimum=minimum, maximum=maximum)
