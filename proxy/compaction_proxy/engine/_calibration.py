"""Per-model calibration: how far the proxy's token count is from the upstream's own.

tiktoken miscounts models that are not OpenAI's behind OpenAI-compatible APIs (another
tokenizer, another chat template), so the triggers compare a calibrated count:
``our count * ratio``. The ratio is learnt from ``usage.prompt_tokens`` of replies.

Why weighted by tokens: the difference between two counts has a fixed part (reply priming,
a template's preamble) and a part that grows with the prompt. On a 10-token "hi" the fixed
part is the whole story (9 upstream tokens for our 13 is 0.69); on a 100k-token prompt it is
noise. The ratio only matters for requests near the budget, so it must be the ratio of large
requests. An unweighted running average let a run of small chats pull it to 0.67, and an
over-window request then went through with no warning. Here each observation counts in
proportion to its size (a ratio of sums, ``Σ reported / Σ counted``), observations under
:data:`MIN_TOKENS` are ignored, and older observations fade by tokens seen since, not by
requests: a thousand small chats cannot wash out what one large request taught.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HALF_LIFE_TOKENS", "MAX_MODELS", "MIN_TOKENS", "CalibrationBook"]

MIN_TOKENS = 1_000
"""Observations of smaller prompts (by our count) are ignored: the fixed part dominates them."""

HALF_LIFE_TOKENS = 200_000
"""An observation's weight halves with every this many tokens observed after it, so a changed
ratio (another model deployed under the same name) is learnt within a few large requests."""

MAX_MODELS = 1_024
"""Models remembered; the model name comes from clients, so the book is bounded."""


@dataclass(slots=True)
class _Sums:
    reported: float  # decayed Σ ratio_i * counted_i
    counted: float  # decayed Σ counted_i


class CalibrationBook:
    """Token-weighted ratios ``upstream prompt_tokens / our count``, one per model."""

    __slots__ = ("_half_life", "_min_tokens", "_sums")

    def __init__(
        self, *, min_tokens: int = MIN_TOKENS, half_life_tokens: int = HALF_LIFE_TOKENS
    ) -> None:
        if min_tokens < 1 or half_life_tokens < 1:
            raise ValueError("min_tokens and half_life_tokens must be positive")
        self._min_tokens = min_tokens
        self._half_life = half_life_tokens
        self._sums: dict[str, _Sums] = {}

    def observe(
        self, model: str, reported: int, counted: int, *, minimum: float, maximum: float
    ) -> bool:
        """One reply's figures; False when it was ignored (too small, unusable, book full).

        The observation's ratio is clamped to ``[minimum, maximum]`` before it is weighed, so
        one absurd reply (a proxy in between answering with another prompt's usage) moves the
        ratio by at most its share of the weight.
        """
        if reported <= 0 or counted < self._min_tokens:
            return False
        ratio = min(maximum, max(minimum, reported / counted))
        sums = self._sums.get(model)
        if sums is None:
            if len(self._sums) >= MAX_MODELS:
                return False
            self._sums[model] = _Sums(ratio * counted, float(counted))
            return True
        keep = 0.5 ** (counted / self._half_life)
        sums.reported = sums.reported * keep + ratio * counted
        sums.counted = sums.counted * keep + counted
        return True

    def ratio(self, model: str) -> float:
        """The learnt ratio for ``model``; 1.0 (trust our count) before any observation."""
        sums = self._sums.get(model)
        if sums is None or sums.counted <= 0:
            return 1.0
        return sums.reported / sums.counted

    def __len__(self) -> int:
        return len(self._sums)
