"""One tokenizer per encoding, with an observable fallback.

The edge asks for the tokenizer of a model's encoding on every request.  When the encoding
file cannot be found offline we must not fail the request: the provider hands out the
character estimator instead, logs ONE warning per missing encoding, and counts the degraded
requests so the edge can publish a metric.
"""

from __future__ import annotations

import logging
import threading

from .encodings import EncodingLoader, EncodingUnavailable
from .images import ImagePricing
from .tokens import CharacterEstimatorTokenizer, TiktokenTokenizer, Tokenizer

logger = logging.getLogger(__name__)


class TokenizerProvider:
    """Builds and caches tokenizers by encoding name; falls back to the estimator."""

    def __init__(
        self,
        loader: EncodingLoader | None = None,
        *,
        cache_size: int = 65_536,
        image_pricing: ImagePricing | None = None,
    ) -> None:
        self.loader = loader or EncodingLoader()
        self._cache_size = cache_size
        self._image_pricing = image_pricing
        self._tokenizers: dict[str, Tokenizer] = {}
        self._missing: set[str] = set()
        self._lock = threading.Lock()
        self.fallback_uses = 0
        """Requests served by the estimator because an encoding was missing (a metric)."""

    @property
    def fallback_active(self) -> bool:
        """True once any encoding could not be loaded (the proxy is counting approximately)."""
        return bool(self._missing)

    @property
    def missing_encodings(self) -> frozenset[str]:
        """Encodings that fell back to the estimator."""
        return frozenset(self._missing)

    def get(self, encoding: str) -> Tokenizer:
        """The tokenizer for ``encoding`` (the estimator if its file is unavailable)."""
        with self._lock:
            tokenizer = self._tokenizers.get(encoding)
            if tokenizer is None:
                tokenizer = self._build(encoding)
                self._tokenizers[encoding] = tokenizer
            if encoding in self._missing:
                self.fallback_uses += 1
            return tokenizer

    def _build(self, encoding: str) -> Tokenizer:
        try:
            return TiktokenTokenizer(
                self.loader.load(encoding),
                cache_size=self._cache_size,
                image_pricing=self._image_pricing,
            )
        except EncodingUnavailable as exc:
            self._missing.add(encoding)
            logger.warning(
                "tiktoken encoding %r unavailable offline (%s); counting with the "
                "4-characters-a-token estimator. Searched: %s",
                encoding,
                exc,
                ", ".join(str(d) for d in self.loader.search_dirs()),
            )
            return CharacterEstimatorTokenizer(
                cache_size=self._cache_size, image_pricing=self._image_pricing
            )

    def refresh(self, encoding: str) -> bool:
        """Look for ``encoding``'s file again (it may have been downloaded meanwhile) and, if
        it is there now, count exactly from then on instead of estimating."""
        try:
            built = self.loader.load(encoding)
        except EncodingUnavailable:
            return False
        tokenizer = TiktokenTokenizer(
            built, cache_size=self._cache_size, image_pricing=self._image_pricing
        )
        with self._lock:
            self._tokenizers[encoding] = tokenizer
            self._missing.discard(encoding)
        logger.info("tiktoken encoding %r loaded; exact counts from now on", encoding)
        return True
