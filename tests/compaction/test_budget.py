from __future__ import annotations

import pytest

from compaction_proxy.compaction import (
    Calibration,
    FactsOverride,
    ModelCatalog,
    ModelFacts,
    compute_budget,
)


@pytest.mark.parametrize(
    ("model", "window", "encoding"),
    [
        ("gpt-4o", 128_000, "o200k_base"),
        ("gpt-4o-2024-08-06", 128_000, "o200k_base"),
        ("gpt-4o-mini-2024-07-18", 128_000, "o200k_base"),
        ("gpt-4.1", 1_047_576, "o200k_base"),
        ("gpt-4.1-mini-2025-04-14", 1_047_576, "o200k_base"),
        ("gpt-4.1-nano", 1_047_576, "o200k_base"),
        ("o1", 200_000, "o200k_base"),
        ("o1-2024-12-17", 200_000, "o200k_base"),
        ("o3", 200_000, "o200k_base"),
        ("o3-mini-2025-01-31", 200_000, "o200k_base"),
        ("o4-mini", 200_000, "o200k_base"),
        ("gpt-5", 400_000, "o200k_base"),
        ("gpt-5-mini", 400_000, "o200k_base"),
        ("gpt-5-nano-2025-08-07", 400_000, "o200k_base"),
        ("gpt-4-turbo-2024-04-09", 128_000, "cl100k_base"),
        ("gpt-4-1106-preview", 128_000, "cl100k_base"),
        ("gpt-4", 8_192, "cl100k_base"),
        ("gpt-4-0613", 8_192, "cl100k_base"),
        ("gpt-3.5-turbo", 16_385, "cl100k_base"),
        ("gpt-3.5-turbo-0125", 16_385, "cl100k_base"),
        ("openai/gpt-4o", 128_000, "o200k_base"),
    ],
)
def test_builtin_table(model: str, window: int, encoding: str) -> None:
    facts = ModelCatalog().facts_for(model)
    assert facts.context_window == window
    assert facts.encoding == encoding


def test_unknown_model_gets_defaults() -> None:
    catalog = ModelCatalog(
        default_context_window=32_000,
        default_max_output_tokens=1000,
        default_encoding="cl100k_base",
    )
    assert catalog.facts_for("llama-3-70b") == ModelFacts(32_000, 1000, "cl100k_base")
    # "gpt-4.1x" must not fall back to "gpt-4" by prefix
    assert ModelCatalog().facts_for("gpt-4.15").context_window == 128_000


def test_overrides_by_name_and_glob_merge_over_builtins() -> None:
    catalog = ModelCatalog(
        {
            "gpt-4o": FactsOverride(context_window=64_000),
            "llama-*": FactsOverride(context_window=8_000, encoding="cl100k_base"),
            "exact": ModelFacts(1000, 100, "cl100k_base"),
        }
    )
    assert catalog.facts_for("gpt-4o") == ModelFacts(64_000, 16_384, "o200k_base")
    assert catalog.facts_for("gpt-4o-mini").context_window == 128_000
    assert catalog.facts_for("llama-3") == ModelFacts(8_000, None, "cl100k_base")
    assert catalog.facts_for("exact") == ModelFacts(1000, 100, "cl100k_base")


def test_budget_arithmetic_applies_reserve_once() -> None:
    facts = ModelFacts(128_000, 16_384)
    budget = compute_budget(facts, reserve_ratio=0.05)
    assert (budget.output_reserve, budget.safety_reserve) == (16_384, 6_400)
    assert budget.limit == 128_000 - 16_384 - 6_400
    assert compute_budget(facts, max_tokens=1000, reserve_ratio=0).limit == 127_000
    assert (
        compute_budget(facts, max_completion_tokens=2000, max_tokens=1000, reserve_ratio=0).limit
        == 126_000
    )
    assert compute_budget(ModelFacts(1000, 100), max_tokens=5000).limit == 0
    with pytest.raises(ValueError):
        compute_budget(facts, reserve_ratio=1.0)


def test_calibration_is_bounded() -> None:
    assert Calibration(1.3).apply(1000) == 1300
    assert Calibration(5.0).effective == 2.0
    assert Calibration(0.1).effective == 0.5
    assert Calibration(5.0, maximum=3.0).effective == 3.0
    assert Calibration.observed(1100, 1000).effective == pytest.approx(1.1)
    assert Calibration.observed(0, 1000).effective == 1.0
    with pytest.raises(ValueError):
        Calibration(1.0, minimum=2.0, maximum=1.0)


def test_known_windows_tell_a_known_window_from_the_default_guess() -> None:
    catalog = ModelCatalog(
        {
            "local-*": FactsOverride(context_window=16_384),
            "gpt-4o": FactsOverride(max_output_tokens=1_000),  # no window of its own
        },
        default_context_window=99_999,
    )
    assert catalog.known_windows("local-llama") == (16_384, None)
    assert catalog.known_windows("gpt-4o") == (None, 128_000)
    assert catalog.known_windows("openai/gpt-4o-2024-08-06") == (None, 128_000)
    assert catalog.known_windows("mystery-model") == (None, None)
    assert catalog.facts_for("mystery-model").context_window == 99_999  # the guess


# ---------------------------------------------------------------- one output-reserve rule


@pytest.mark.parametrize(
    ("window", "reserve"), [(4_096, 1_024), (8_192, 2_048), (16_384, 4_096), (131_072, 4_096)]
)
def test_default_reserve_is_a_quarter_of_the_window_at_most_4096(window: int, reserve: int) -> None:
    budget = compute_budget(ModelFacts(window, None), reserve_ratio=0.05)
    assert (budget.output_reserve, budget.output_source) == (reserve, "default")


def test_a_declared_8k_window_without_max_output_reserves_the_default() -> None:
    """The output reserve does not depend on where the window came from: a declared 8,192
    window with no `max_output_tokens` used to reserve 4,096 (budget 3,687) while the same
    window learned from a refusal reserved 2,048."""
    declared = ModelCatalog({"acc-8k": FactsOverride(context_window=8_192)}).facts_for("acc-8k")
    budget = compute_budget(declared, reserve_ratio=0.05, window_source="config")
    assert (budget.output_reserve, budget.safety_reserve, budget.limit) == (2_048, 409, 5_735)
    learned = ModelCatalog().facts_for("acc-8k")  # unknown model, window from elsewhere
    same = compute_budget(
        ModelFacts(8_192, learned.max_output_tokens), reserve_ratio=0.05, window_source="learned"
    )
    assert same.limit == budget.limit
    assert same.sources() == {
        "window_source": "learned",
        "output_source": "default",
        "reserve_ratio": 0.05,
    }


def test_the_models_output_figure_then_the_requests_limit_win() -> None:
    facts = ModelFacts(128_000, 16_384)
    assert compute_budget(facts).output_source == "model"
    assert compute_budget(facts).output_reserve == 16_384
    # a window far below the model's own: at most half of it
    assert compute_budget(ModelFacts(8_192, 16_384)).output_reserve == 4_096
    asked = compute_budget(ModelFacts(8_192, None), max_tokens=500)
    assert (asked.output_reserve, asked.output_source) == (500, "request")
    assert compute_budget(facts, max_completion_tokens=0).output_reserve == 0


def test_window_source_from_the_catalog() -> None:
    catalog = ModelCatalog({"local-*": FactsOverride(context_window=16_384)})
    assert catalog.window_source("local-x") == "config"
    assert catalog.window_source("gpt-4o") == "builtin"
    assert catalog.window_source("mystery") == "default"
