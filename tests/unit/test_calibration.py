"""The calibration ratio is weighted by request size and ignores requests too small to matter
(compaction_proxy/engine/_calibration.py), and what it learns moves the triggers
(compaction_proxy/engine/_compactor.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction import Mode
from compaction_proxy.config import Settings
from compaction_proxy.engine import Compactor
from compaction_proxy.engine._calibration import (
    HALF_LIFE_TOKENS,
    MAX_MODELS,
    MIN_TOKENS,
    CalibrationBook,
)

BOUNDS = {"minimum": 0.5, "maximum": 2.0}


def test_nothing_learnt_means_trust_our_count() -> None:
    assert CalibrationBook().ratio("m") == 1.0


def test_the_first_usable_observation_is_the_ratio() -> None:
    book = CalibrationBook()
    assert book.observe("m", 15_000, 10_000, **BOUNDS)
    assert book.ratio("m") == pytest.approx(1.5)


def test_requests_under_the_floor_are_ignored() -> None:
    book = CalibrationBook()
    assert not book.observe("m", 6, 9, **BOUNDS)  # "hi": 0.67
    assert not book.observe("m", MIN_TOKENS - 2, MIN_TOKENS - 1, **BOUNDS)
    assert book.ratio("m") == 1.0 and len(book) == 0
    assert book.observe("m", 2 * MIN_TOKENS, MIN_TOKENS, **BOUNDS)
    assert book.ratio("m") == pytest.approx(2.0)


def test_unusable_figures_are_ignored() -> None:
    book = CalibrationBook()
    assert not book.observe("m", 0, 50_000, **BOUNDS)
    assert not book.observe("m", -5, 50_000, **BOUNDS)
    assert not book.observe("m", 5_000, 0, **BOUNDS)
    assert book.ratio("m") == 1.0


def test_weighted_by_size_not_by_count() -> None:
    """One 100k request at 1.3 and fifty 2k requests at 0.9 weigh the same (100k tokens
    each side): 1.1, where an unweighted average of the fifty-one would be 0.91."""
    exact = CalibrationBook(half_life_tokens=10**12)  # no fading
    exact.observe("m", 130_000, 100_000, **BOUNDS)
    for _ in range(50):
        exact.observe("m", 1_800, 2_000, **BOUNDS)
    assert exact.ratio("m") == pytest.approx(1.1)
    # With fading, the newer tokens weigh a little more, whichever came first.
    book = CalibrationBook()
    book.observe("m", 130_000, 100_000, **BOUNDS)
    for _ in range(50):
        book.observe("m", 1_800, 2_000, **BOUNDS)
    assert 1.05 < book.ratio("m") < 1.1
    other = CalibrationBook()
    for _ in range(50):
        other.observe("m", 1_800, 2_000, **BOUNDS)
    other.observe("m", 130_000, 100_000, **BOUNDS)
    assert 1.1 < other.ratio("m") < 1.3


def test_a_ratio_of_sums_when_nothing_has_faded() -> None:
    book = CalibrationBook(half_life_tokens=10**12)  # no fading: exactly Σ reported / Σ counted
    for reported, counted in [(12_000, 10_000), (3_000, 2_000), (50_000, 50_000)]:
        book.observe("m", reported, counted, **BOUNDS)
    assert book.ratio("m") == pytest.approx(65_000 / 62_000)


def test_each_observation_is_clamped_before_it_is_weighed() -> None:
    book = CalibrationBook(half_life_tokens=10**12)
    book.observe("m", 10_000, 10_000, **BOUNDS)
    book.observe("m", 10_000_000, 10_000, **BOUNDS)  # 1000x, clamped to 2.0
    assert book.ratio("m") == pytest.approx(1.5)


def test_old_observations_fade_by_tokens_seen_since() -> None:
    """A model replaced behind the same name: its new ratio is learnt within a few large
    requests, and after one half-life of new tokens the old one weighs half as much."""
    book = CalibrationBook()
    book.observe("m", 100_000, 100_000, **BOUNDS)
    book.observe("m", 2 * HALF_LIFE_TOKENS, HALF_LIFE_TOKENS, **BOUNDS)
    # old weight 100k * 0.5, new weight 200k... of ratio 2.0: (50k*1 + 200k*2) / 250k
    assert book.ratio("m") == pytest.approx((50_000 + 2 * HALF_LIFE_TOKENS) / 250_000)
    for _ in range(6):
        book.observe("m", 160_000, 80_000, **BOUNDS)
    assert book.ratio("m") > 1.95


def test_models_are_separate_and_bounded() -> None:
    book = CalibrationBook()
    book.observe("a", 20_000, 10_000, **BOUNDS)
    book.observe("b", 5_000, 10_000, **BOUNDS)
    assert book.ratio("a") == pytest.approx(2.0) and book.ratio("b") == pytest.approx(0.5)
    for n in range(MAX_MODELS + 10):
        book.observe(f"model-{n}", 20_000, 10_000, **BOUNDS)
    assert len(book) == MAX_MODELS
    assert book.ratio(f"model-{MAX_MODELS + 5}") == 1.0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        CalibrationBook(min_tokens=0)
    with pytest.raises(ValueError):
        CalibrationBook(half_life_tokens=0)


# ------------------------------------------------------------------ through the compactor


def _settings(**calibration: Any) -> Settings:
    return Settings.model_validate(
        {
            "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
            "models": {"local-model": {"context_window": 8_000, "max_output_tokens": 500}},
            "compaction": {"calibration": calibration} if calibration else {},
        }
    )


def _body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "lorem ipsum " * 60})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "the newest question"})
    return {"model": "local-model", "messages": messages}


def test_small_chats_cannot_talk_the_ratio_down() -> None:
    """The issue's case: an upstream that counts 1.5x ours. Learnt from a few real requests,
    then hundreds of tiny chats at 0.67 (a fixed offset dominates them) must not pull the
    ratio down, or a request over the real window goes through uncompacted."""
    compactor = Compactor(_settings())
    try:
        big = _body(30)
        counted = compactor.run_sync(big, Mode.NORMAL).report.tokens_before
        assert counted > MIN_TOKENS
        for _ in range(3):
            compactor.calibrate("local-model", reported=int(counted * 1.5), counted=counted)
        for _ in range(500):
            compactor.calibrate("local-model", reported=6, counted=9)
        assert compactor.calibration_for("local-model").effective == pytest.approx(1.5)
        # ~70% of the budget by our count is ~105% by the upstream's: it must be compacted.
        budget = compactor.run_sync(big, Mode.NORMAL).report.budget
        turns = next(t for t in range(1, 200) if _tokens(compactor, _body(t)) > 0.7 * budget)
        near = compactor.run_sync(_body(turns), Mode.NORMAL)
        assert near.report.tokens_before < budget  # fits by our raw count...
        assert near.changed  # ...but not by the upstream's, so it was compacted
        assert near.report.calibration == pytest.approx(1.5)
    finally:
        compactor.close()


def test_disabled_calibration_learns_nothing() -> None:
    compactor = Compactor(_settings(enabled=False))
    try:
        compactor.calibrate("local-model", reported=30_000, counted=10_000)
        assert compactor.calibration_for("local-model").ratio == 1.0
    finally:
        compactor.close()


def _tokens(compactor: Compactor, body: dict[str, Any]) -> int:
    return compactor.run_sync(body, Mode.DRY_RUN).report.tokens_before
