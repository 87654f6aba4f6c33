"""One tokenizer per encoding, with an observable fallback.

The edge asks for the tokenizer of a model's encoding on every request.  When the encoding
file cannot be found offline we must not fail the request: the provider hands out the
character estimator instead, logs ONE warning per missing encoding, and counts the degraded
requests so the edge can publish a metric.  The builtin encodings ship with the install, so
in practice only an encoding named in the config that no file provides is estimated; the
state per encoding (:meth:`TokenizerProvider.states`) feeds ``/readyz`` and a gauge.

With the optional ``fast`` extra installed (bpe-openai), exact tokenizers count with its
faster counter where it agrees with tiktoken (:func:`.fast_bpe.exact_counter`); tiktoken stays
the reference and counts everything else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .encodings import BUNDLED_ENCODINGS, BUNDLED_PACKAGE, EncodingLoader, EncodingUnavailable
from .fast_bpe import Counter, exact_counter
from .images import ImagePricing
from .tokens import CharacterEstimatorTokenizer, TiktokenTokenizer, Tokenizer

if TYPE_CHECKING:
    from tiktoken import Encoding

logger = logging.getLogger(__name__)

_counters: dict[int, tuple[Encoding, Counter | None]] = {}
_counters_lock = threading.Lock()


def _counter_for(encoding: Encoding) -> Counter | None:
    """:func:`exact_counter` once per loaded encoding: its self-check counts a few thousand
    characters twice, which every new provider (a test, a benchmark's cold run) would repeat."""
    with _counters_lock:
        found = _counters.get(id(encoding))
        if found is not None and found[0] is encoding:
            return found[1]
    counter = exact_counter(encoding)
    with _counters_lock:
        # The entry holds the encoding, so its id cannot be reused while the entry lives;
        # encodings come from the configuration, a handful per process.
        _counters[id(encoding)] = (encoding, counter)
    return counter


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

    def states(self) -> dict[str, bool]:
        """Every encoding asked for so far -> whether it is estimated (True) or exact.

        Bounded: encodings come from the configuration (the models' facts and the default),
        never from a request's content.
        """
        with self._lock:
            return {name: name in self._missing for name in self._tokenizers}

    def prepare(self, encodings: Iterable[str]) -> None:
        """Build the tokenizers of ``encodings`` now (start-up): the first request then does
        not pay for loading a file, and a missing file is reported before traffic arrives.
        Not counted as estimator use: no request was counted."""
        for encoding in encodings:
            with self._lock:
                if encoding not in self._tokenizers:
                    self._tokenizers[encoding] = self._build(encoding)

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
            return self._exact(self.loader.load(encoding))
        except EncodingUnavailable as exc:
            self._missing.add(encoding)
            if encoding in BUNDLED_ENCODINGS:
                hint = (
                    f"the {BUNDLED_PACKAGE} package ships this file: the install is broken, "
                    "reinstall compaction-proxy"
                )
            else:
                hint = (
                    "put its .tiktoken file in compaction.tokenizer.encodings_dir, or name a "
                    f"builtin encoding ({', '.join(BUNDLED_ENCODINGS)})"
                )
            logger.warning(
                "tiktoken encoding %r unavailable offline (%s); counting with the "
                "4-characters-a-token estimator; %s. Searched: %s",
                encoding,
                exc,
                hint,
                ", ".join(str(d) for d in self.loader.search_dirs()),
            )
            return CharacterEstimatorTokenizer(
                cache_size=self._cache_size, image_pricing=self._image_pricing
            )

    def _exact(self, encoding: Encoding) -> TiktokenTokenizer:
        return TiktokenTokenizer(
            encoding,
            counter=_counter_for(encoding),
            cache_size=self._cache_size,
            image_pricing=self._image_pricing,
        )

    def refresh(self, encoding: str) -> bool:
        """Look for ``encoding``'s file again (it may have been downloaded meanwhile) and, if
        it is there now, count exactly from then on instead of estimating."""
        try:
            built = self.loader.load(encoding)
        except EncodingUnavailable:
            return False
        tokenizer = self._exact(built)
        with self._lock:
            self._tokenizers[encoding] = tokenizer
            self._missing.discard(encoding)
        logger.info("tiktoken encoding %r loaded; exact counts from now on", encoding)
        return True
