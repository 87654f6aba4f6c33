"""The bounded output reserve and the output limit forwarded (compaction/budget.py).

A coding agent asks the same large output limit on every request (Claude Code: 32,000); on a
32k window a reserve of that size leaves the conversation nothing, and vLLM, SGLang and
Anthropic refuse a request whose prompt plus limit exceeds the window. The reserve is bounded by
a share of the window, and the limit forwarded is lowered so the compacted prompt and the
output fit. The arithmetic is checked by example and, over generated windows, shares, limits and
prompts, by property; the pipeline's report carries the decision.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    Calibration,
    CompactionRequest,
    CompactionSettings,
    FactsOverride,
    ModelCatalog,
    ModelFacts,
    build_pipeline,
    compact,
    compute_budget,
)
from compaction_proxy.compaction.budget import DEFAULT_RESERVE_SHARE, OUTPUT_FLOOR, Budget

from .helpers import a, s, u
from .summarizer_fakes import TOK
from .test_properties import conversations

WINDOW_32K = 32_768


def test_an_agents_32000_on_a_32k_window_reserves_a_quarter() -> None:
    budget = compute_budget(
        ModelFacts(WINDOW_32K, None), max_tokens=32_000, output_share=DEFAULT_RESERVE_SHARE
    )
    assert (budget.output_reserve, budget.output_source) == (8_192, "share")
    assert budget.limit == WINDOW_32K - 8_192 - 1_638
    assert budget.output_asked == 32_000
    assert budget.sources() == {
        "window_source": "given",
        "output_source": "share",
        "reserve_ratio": 0.05,
        "output_share": 0.25,
    }


@pytest.mark.parametrize(
    ("window", "asked"), [(WINDOW_32K, 8_192), (WINDOW_32K, 500), (200_000, 32_000), (128_000, 0)]
)
def test_an_ask_within_the_share_reserves_what_it_asks(window: int, asked: int) -> None:
    """The rule before the bound existed: the request's own limit, source ``request``."""
    bounded = compute_budget(ModelFacts(window, None), max_tokens=asked, output_share=0.25)
    unbounded = compute_budget(ModelFacts(window, None), max_tokens=asked)
    assert (bounded.output_reserve, bounded.output_source) == (asked, "request")
    assert bounded.limit == unbounded.limit
    assert "output_share" not in bounded.sources()


def test_the_share_bounds_only_the_requests_own_limit() -> None:
    """Without a limit in the request, the model's figure and the default rule are as before."""
    model = compute_budget(ModelFacts(WINDOW_32K, 16_384), output_share=0.1)
    assert (model.output_reserve, model.output_source) == (16_384, "model")
    default = compute_budget(ModelFacts(WINDOW_32K, None), output_share=0.1)
    assert (default.output_reserve, default.output_source) == (4_096, "default")


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    budget = compute_budget(
        ModelFacts(WINDOW_32K, None), max_completion_tokens=1_000, max_tokens=30_000
    )
    assert (budget.output_asked, budget.output_reserve) == (1_000, 1_000)


def test_a_models_own_share_and_lowering_win_over_the_runs() -> None:
    catalog = ModelCatalog(
        {"local-*": FactsOverride(context_window=WINDOW_32K, output_reserve_share=0.5)},
    )
    facts = catalog.facts_for("local-qwen")
    assert facts.output_reserve_share == 0.5
    budget = compute_budget(facts, max_tokens=32_000, output_share=0.25, lower_output=True)
    assert budget.output_reserve == 16_384
    off = FactsOverride(lower_output=False).apply(facts)
    assert off.output_reserve_share == 0.5  # the other fields stay
    assert compute_budget(off, max_tokens=32_000, lower_output=True).lower_output is False
    # The built-in facts of another model say nothing: the run's settings hold.
    plain = compute_budget(catalog.facts_for("gpt-4o"), max_tokens=64_000, output_share=0.25)
    assert plain.output_reserve == 32_000


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="output_reserve_share"):
        compute_budget(ModelFacts(WINDOW_32K, None), max_tokens=1, output_share=share)


def test_the_settings_default_and_range() -> None:
    settings = CompactionSettings()
    assert settings.output_reserve_share == DEFAULT_RESERVE_SHARE == 0.25
    assert settings.lower_output_limit is True
    for bad in (0, 1.01):
        with pytest.raises(ValueError, match="output_reserve_share"):
            CompactionSettings(output_reserve_share=bad)


# ----------------------------------------------------------------------- the forwarded limit


def _budget(asked: int | None, *, lower: bool = True, window: int = WINDOW_32K) -> Budget:
    return compute_budget(
        ModelFacts(window, None), max_tokens=asked, output_share=0.25, lower_output=lower
    )


def test_a_limit_that_fits_goes_as_asked() -> None:
    budget = _budget(32_000, window=200_000)
    limit = budget.output_limit(100_000)
    assert limit is not None
    assert (limit.asked, limit.forwarded, limit.lowered, limit.fits) == (
        32_000,
        32_000,
        False,
        True,
    )


def test_a_limit_that_does_not_fit_is_lowered_to_what_the_window_leaves() -> None:
    budget = _budget(32_000)
    limit = budget.output_limit(10_000)
    assert limit is not None
    assert limit.forwarded == WINDOW_32K - 1_638 - 10_000
    assert limit.lowered and limit.fits
    assert limit.to_dict() == {"asked": 32_000, "forwarded": 21_130, "lowered": True}


def test_lowering_off_forwards_the_ask_and_says_it_does_not_fit() -> None:
    limit = _budget(32_000, lower=False).output_limit(10_000)
    assert limit is not None
    assert (limit.forwarded, limit.lowered, limit.fits) == (32_000, False, False)


def test_no_limit_asked_means_nothing_to_lower() -> None:
    assert _budget(None).output_limit(30_000) is None


def test_a_prompt_over_its_budget_gets_the_floor_not_a_stub() -> None:
    budget = _budget(32_000)
    limit = budget.output_limit(WINDOW_32K)  # no room at all
    assert limit is not None
    assert limit.forwarded == OUTPUT_FLOOR
    assert limit.lowered and not limit.fits
    # A tiny window's reserve is below the floor: the floor is the reserve then.
    tiny = compute_budget(ModelFacts(2_048, None), max_tokens=1_500, lower_output=True,
                          output_share=0.25)  # fmt: skip
    tiny_limit = tiny.output_limit(2_048)
    assert tiny_limit is not None
    assert tiny_limit.forwarded == tiny.output_reserve == 512


windows = st.integers(min_value=1_024, max_value=2_000_000)
shares = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)
asks = st.integers(min_value=1, max_value=4_000_000)
ratios = st.floats(min_value=0.0, max_value=0.5, allow_nan=False)


@given(windows, shares, asks, ratios)
def test_the_reserve_is_never_above_the_share(
    window: int, share: float, asked: int, ratio: float
) -> None:
    budget = compute_budget(
        ModelFacts(window, None), max_tokens=asked, output_share=share, reserve_ratio=ratio
    )
    assert budget.output_reserve <= math.floor(share * window)
    assert budget.output_reserve == min(asked, math.floor(share * window))
    assert budget.output_source == ("request" if asked <= share * window else "share")


@given(windows, shares, asks, ratios, st.floats(min_value=0.0, max_value=1.0))
def test_a_prompt_within_its_budget_and_the_lowered_limit_fit_the_window(
    window: int, share: float, asked: int, ratio: float, fill: float
) -> None:
    budget = compute_budget(
        ModelFacts(window, None),
        max_tokens=asked,
        output_share=share,
        reserve_ratio=ratio,
        lower_output=True,
    )
    # (A reserve and safety margin larger than the window leave no budget: nothing fits.)
    assume(budget.output_reserve + budget.safety_reserve <= window)
    prompt = math.floor(fill * budget.limit)
    limit = budget.output_limit(prompt)
    assert limit is not None
    assert limit.asked == asked
    assert limit.forwarded <= asked  # never raised
    assert limit.forwarded >= budget.output_reserve  # within the budget: never below the reserve
    assert prompt + limit.forwarded <= window - budget.safety_reserve <= window
    assert limit.fits
    assert limit.lowered == (prompt + asked > window - budget.safety_reserve)


@given(windows, shares, asks, st.integers(min_value=0, max_value=4_000_000), st.booleans())
def test_the_forwarded_limit_at_any_prompt(
    window: int, share: float, asked: int, prompt: int, lower: bool
) -> None:
    budget = compute_budget(
        ModelFacts(window, None), max_tokens=asked, output_share=share, lower_output=lower
    )
    limit = budget.output_limit(prompt)
    assert limit is not None
    room = window - budget.safety_reserve - prompt
    assert 1 <= limit.forwarded <= asked
    if not lower or asked <= room:
        assert limit.forwarded == asked
    else:
        floor = max(1, min(OUTPUT_FLOOR, budget.output_reserve))
        assert limit.forwarded == min(asked, max(room, floor))
    assert limit.fits == (limit.forwarded <= room)


# ----------------------------------------------------------------------- the pipeline's report


def _conversation(turns: int, size: int = 400) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [s("You are terse.")]
    for i in range(turns):
        messages += [u(f"question {i} " + "q" * size), a(f"answer {i} " + "a" * size)]
    messages.append(u("and now?"))
    return messages


def _compact(messages: list[dict[str, object]], *, lower: bool, asked: int = 32_000):
    return compact(
        CompactionRequest(
            messages,
            model="local",
            pipeline=build_pipeline(CompactionSettings()),
            tokenizer=TOK,
            facts=ModelFacts(WINDOW_32K, None),
            max_tokens=asked,
            output_share=0.25,
            lower_output=lower,
        )
    )


def test_the_report_says_the_limit_was_lowered_and_why() -> None:
    messages = _conversation(10)
    result = _compact(messages, lower=True)
    report = result.report
    assert not result.changed  # well under the trigger: only the limit changes
    limit = report.output_limit
    assert limit is not None and limit.lowered
    assert limit.forwarded == WINDOW_32K - report.safety_reserve - report.tokens_after
    assert report.to_dict()["output_limit"] == {
        "asked": 32_000,
        "forwarded": limit.forwarded,
        "lowered": True,
    }
    assert report.to_dict()["budget"]["output_source"] == "share"
    (note,) = [w for w in report.warnings if w.startswith("output limit")]
    assert note == (
        f"output limit lowered from 32000 to {limit.forwarded} tokens: the prompt "
        f"({report.tokens_after} tokens) and 32000 would exceed the 32768-token window less "
        "its 1638-token safety reserve"
    )


def test_a_compacted_prompt_gets_the_limit_its_own_size_leaves() -> None:
    messages = _conversation(80, size=1_000)  # about 40k tokens: past the 32k window
    result = _compact(messages, lower=True)
    report = result.report
    assert result.changed
    assert report.tokens_after <= report.budget
    limit = report.output_limit
    assert limit is not None and limit.lowered and limit.fits
    assert report.tokens_after + limit.forwarded <= WINDOW_32K - report.safety_reserve


def test_the_report_warns_when_lowering_is_off() -> None:
    report = _compact(_conversation(10), lower=False).report
    limit = report.output_limit
    assert limit is not None and not limit.lowered and not limit.fits
    assert any(
        "exceed the 32768-token window" in w and "lower_output_limit is off" in w
        for w in report.warnings
    )


def test_a_small_ask_changes_nothing_and_says_nothing() -> None:
    report = _compact(_conversation(10), lower=True, asked=2_000).report
    limit = report.output_limit
    assert limit is not None and not limit.lowered and limit.fits
    assert report.warnings == ()


@given(
    conversations(),
    st.integers(min_value=300, max_value=4_000),
    st.integers(min_value=1, max_value=40_000),
    st.floats(min_value=0.05, max_value=1.0),
    st.sampled_from([1.0, 1.3, 2.0]),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_what_the_pipeline_forwards_fits_the_window_with_its_limit(
    messages: list[dict[str, object]], window: int, asked: int, share: float, ratio: float
) -> None:
    """Generated conversations (tool loops, late results, developer messages) compacted by the
    default pipeline: whenever the compacted prompt is within its budget, that prompt (as the
    triggers count it, calibrated) and the limit forwarded fit the window, lowered exactly when
    the ask would not; the limit is never raised, and lowered only when the ask does not fit."""
    result = compact(
        CompactionRequest(
            messages,
            model="local",
            pipeline=build_pipeline(CompactionSettings()),
            tokenizer=TOK,
            facts=ModelFacts(window, None),
            max_tokens=asked,
            output_share=share,
            lower_output=True,
            calibration=Calibration(ratio=ratio),
        )
    )
    report = result.report
    limit = report.output_limit
    assert limit is not None and limit.asked == asked and limit.forwarded <= asked
    prompt = Calibration(ratio=ratio).apply(report.tokens_after)
    room = window - report.safety_reserve - prompt
    if limit.lowered:
        assert asked > room
    if prompt <= report.budget:
        assert limit.lowered == (asked > room)
        assert prompt + limit.forwarded <= window
        assert limit.fits
