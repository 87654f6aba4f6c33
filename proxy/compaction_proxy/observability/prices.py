"""USD per 1M input tokens by model name or glob, for the money the dashboard says was saved.

``dashboard.prices`` entries come before the built-in list; within each set the exact name
wins, then the longest glob (so ``gpt-4o-mini*`` beats ``gpt-4o-*``). A model without a price
still counts its tokens saved, just no money.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

__all__ = ["DEFAULT_PRICES", "Prices"]

# USD per 1M input tokens (OpenAI's standard, non-cached list prices).
DEFAULT_PRICES: dict[str, float] = {
    "gpt-5": 1.25,
    "gpt-5-*": 1.25,
    "gpt-5-mini*": 0.25,
    "gpt-5-nano*": 0.05,
    "gpt-4.1": 2.00,
    "gpt-4.1-*": 2.00,
    "gpt-4.1-mini*": 0.40,
    "gpt-4.1-nano*": 0.10,
    "gpt-4o": 2.50,
    "gpt-4o-*": 2.50,
    "gpt-4o-mini*": 0.15,
    "gpt-4-turbo*": 10.00,
    "gpt-3.5-turbo*": 0.50,
    "o1": 15.00,
    "o1-*": 15.00,
    "o1-mini*": 1.10,
    "o3": 2.00,
    "o3-*": 2.00,
    "o3-mini*": 1.10,
    "o4-mini*": 1.10,
}

_CACHED_MODELS = 4096
"""Model names whose price is remembered: a lookup is a glob scan, done per request."""


class Prices:
    """USD per 1M input tokens by model name or glob (``dashboard.prices`` over the defaults)."""

    def __init__(
        self, configured: Mapping[str, float] | None = None, *, defaults: bool = True
    ) -> None:
        order: list[tuple[str, float]] = []
        for table in (configured or {}, DEFAULT_PRICES if defaults else {}):
            exact = [(p, v) for p, v in table.items() if not _is_glob(p)]
            globs = sorted(
                ((p, v) for p, v in table.items() if _is_glob(p)), key=lambda item: -len(item[0])
            )
            order.extend(exact + globs)
        self._order = order
        self._cache: dict[str, float | None] = {}

    def per_million(self, model: str | None) -> float | None:
        """The price of ``model``, or None when no entry matches."""
        if not model:
            return None
        if model in self._cache:
            return self._cache[model]
        price = None
        # A provider prefix ("openai/gpt-4o") is tried as given, then without it.
        candidates = [model, model.rsplit("/", 1)[-1]] if "/" in model else [model]
        for candidate in candidates:
            for pattern, value in self._order:
                if candidate == pattern or fnmatch.fnmatchcase(candidate, pattern):
                    price = value
                    break
            if price is not None:
                break
        if len(self._cache) < _CACHED_MODELS:
            self._cache[model] = price
        return price

    def usd(self, model: str | None, tokens: int) -> float | None:
        """What ``tokens`` input tokens of ``model`` cost, or None when it has no price."""
        price = self.per_million(model)
        return None if price is None else tokens * price / 1_000_000


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")
