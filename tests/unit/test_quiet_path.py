"""The prompt-bound fast path of `Compactor.run`: same answers as the full path, taken only
where nothing can fire (compaction_proxy/engine/_quiet.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from compaction_proxy.compaction import (
    Mode,
    Pipeline,
    compact_async,
)
from compaction_proxy.compaction.strategies.base import Strategy
from compaction_proxy.compaction.strategies.composite import PipelineStrategy
from compaction_proxy.compaction.strategies.summarization import SummarizationStrategy
from compaction_proxy.compaction.strategies.truncation import TruncationStrategy
from compaction_proxy.compaction.triggers import (
    Always,
    AnyOf,
    MessagesExceed,
    TokenRatio,
    TokensBelow,
    TokensExceed,
)
from compaction_proxy.config import Settings
from compaction_proxy.engine import Compactor
from compaction_proxy.engine._quiet import QuietLimits, quiet_limit
from tests.support.processes import tiktoken_cache_dir

WINDOW = 4000
OUTPUT = 500


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


@pytest.fixture
def compactor() -> Iterator[Compactor]:
    made = Compactor(
        Settings(
            upstreams=[{"name": "up", "base_url": "http://up.test/v1"}],
            models={"small-model": {"context_window": WINDOW, "max_output_tokens": OUTPUT}},
        )
    )
    yield made
    made.close()


def agent_body(steps: int, *, step_words: int = 20) -> dict[str, Any]:
    """A tool-using conversation of ``steps`` call/result pairs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "fix the build"},
    ]
    for i in range(steps):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = " ".join(f"line{i}_{j}" for j in range(step_words))
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": text})
    return {"model": "small-model", "messages": messages, "max_tokens": OUTPUT}


async def full_path(compactor: Compactor, body: dict[str, Any]) -> Any:
    return await compact_async(compactor._request(body, Mode.NORMAL))


def budget_of(compactor: Compactor, body: dict[str, Any]) -> int:
    return compactor.run_sync(body, Mode.DRY_RUN).report.budget


async def test_below_every_threshold_the_answer_is_the_full_paths(compactor: Compactor) -> None:
    body = agent_body(4)
    await full_path(compactor, body)  # an agent session: every message seen before
    body["messages"].append({"role": "user", "content": "and now the tests"})
    quick = await compactor.run(body, Mode.NORMAL, size_hint=0)
    full = await full_path(compactor, body)
    assert quick.metrics is None, "the fast path was not taken"
    assert quick.report == full.report
    assert quick.changed is full.changed is False
    assert quick.messages == full.messages
    assert all(a is b for a, b in zip(quick.messages, body["messages"], strict=True))
    assert quick.report.tokens_before < 0.6 * quick.report.budget


async def test_a_cold_conversation_is_counted_and_still_quick(compactor: Compactor) -> None:
    """Uncached messages up to the inline size are counted, not bounded: still exact."""
    body = agent_body(3)
    quick = await compactor.run(body, Mode.NORMAL, size_hint=0)
    assert quick.metrics is None
    assert quick.report == (await full_path(compactor, body)).report


async def test_the_fast_path_lowers_the_output_limit_as_the_full_path_does(
    compactor: Compactor,
) -> None:
    """An agent's 32,000 on this 4,000 window: the reserve is a quarter of it, and the limit
    forwarded is what the window leaves, whichever path counted the prompt."""
    body = {**agent_body(3), "max_tokens": 32_000}
    quick = await compactor.run(body, Mode.NORMAL, size_hint=0)
    full = await full_path(compactor, body)
    assert quick.metrics is None, "the fast path was not taken"
    assert quick.report == full.report
    report = quick.report
    assert report.output_reserve == WINDOW // 4
    limit = report.output_limit
    assert limit is not None and limit.lowered
    assert limit.forwarded == WINDOW - report.safety_reserve - report.tokens_after


async def test_a_large_uncached_message_takes_the_full_path(compactor: Compactor) -> None:
    """Past the inline size a new message is only bounded: not exact, so the view decides."""
    body = agent_body(1)
    body["messages"].append({"role": "user", "content": "word " * 20_000})  # 100 KB
    result = await compactor.run(body, Mode.NORMAL, size_hint=100_000)
    assert result.metrics is not None
    assert result.changed  # far over this model's budget: the full path compacted it


def sized(compactor: Compactor, low: float, high: float) -> dict[str, Any]:
    """The smallest agent conversation at ``low`` of the budget or more (and under ``high``)."""
    steps = 1
    while True:
        body = agent_body(steps)
        report = compactor.run_sync(body, Mode.DRY_RUN).report
        if report.tokens_before >= low * report.budget:
            assert report.tokens_before < high * report.budget, "a step is too large"
            return body
        steps += 1


async def test_past_the_prepare_threshold_the_view_is_built(compactor: Compactor) -> None:
    """Between prepare (0.7) and trigger (0.8): the metrics reach `Preparer.wants`."""
    body = sized(compactor, 0.7, 0.8)
    result = await compactor.run(body, Mode.NORMAL, size_hint=0)
    prepare = compactor.settings.summarization.prepare
    assert prepare is not None and result.metrics is not None
    assert prepare.fires(result.metrics)
    assert not result.changed


async def test_calibration_moves_the_fast_paths_limit(compactor: Compactor) -> None:
    """A count under the limit raw but over it calibrated goes the full way, and fires."""
    body = sized(compactor, 0.45, 0.55)
    raw = compactor.run_sync(body, Mode.DRY_RUN).report
    quick = await compactor.run(body, Mode.NORMAL, size_hint=0)
    assert quick.metrics is None
    for _ in range(20):
        compactor.calibrate(
            "small-model", reported=2 * raw.tokens_before, counted=raw.tokens_before
        )
    assert compactor.calibration_for("small-model").effective > 1.9
    result = await compactor.run(body, Mode.NORMAL, size_hint=0)
    assert result.metrics is not None
    assert result.changed
    full = await full_path(compactor, body)
    assert result.report == full.report


async def test_other_modes_and_debug_take_the_full_path(compactor: Compactor) -> None:
    body = agent_body(2)
    forced = await compactor.run(body, Mode.FORCE, size_hint=0)
    assert forced.metrics is not None
    compactor.debug = True
    assert (await compactor.run(body, Mode.NORMAL, size_hint=0)).metrics is not None


def _truncation(trigger: Any) -> Strategy:
    return TruncationStrategy(trigger=trigger)


@pytest.mark.parametrize(
    "strategies",
    [
        pytest.param((_truncation(MessagesExceed(10)),), id="messages"),
        pytest.param((_truncation(Always()),), id="always"),
        pytest.param((_truncation(TokensBelow(100)),), id="tokens_below"),
        pytest.param((_truncation(AnyOf((TokenRatio(0.8), MessagesExceed(5)))),), id="any"),
        pytest.param((PipelineStrategy([_truncation(TokenRatio(0.8))]),), id="nested"),
        pytest.param((SummarizationStrategy(target_count=4),), id="summary-by-groups"),
    ],
)
def test_triggers_only_the_view_can_decide_take_the_full_path(
    strategies: tuple[Strategy, ...],
) -> None:
    assert quiet_limit(Pipeline(strategies=strategies), 1000, None) is None


def test_the_limit_is_the_first_point_anything_fires() -> None:
    pipeline = Pipeline(
        strategies=(_truncation(TokenRatio(0.8)), _truncation(TokensExceed(600))), fallback=True
    )
    assert quiet_limit(pipeline, 1000, None) == 601
    assert quiet_limit(pipeline, 1000, TokenRatio(0.5)) == 500
    assert quiet_limit(pipeline, 1000, MessagesExceed(3)) is None
    # Nothing fires before the budget is exceeded: the over-budget work bounds the limit.
    lone = Pipeline(strategies=(_truncation(TokensExceed(3000)),), fallback=False)
    assert quiet_limit(lone, 1000, None) == 1001
    # Nothing fires at all as the prompt grows: the full path (growth is not the question).
    assert quiet_limit(Pipeline(strategies=(), fallback=False), 1000, None) is None


def test_limits_are_remembered_per_pipeline_and_budget() -> None:
    limits = QuietLimits(TokenRatio(0.6))
    pipeline = Pipeline(strategies=(_truncation(TokenRatio(0.8)),))
    assert limits.limit(pipeline, 1000) == 600
    assert limits.limit(pipeline, 2000) == 1200
    assert limits.limit(pipeline, 1000) == 600


async def test_an_estimated_request_is_counted_once_either_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider counts requests served by the estimator (a metric): the fast path asks it
    for the tokenizer once, and the full path it hands over to does not ask again."""
    from compaction_proxy.compaction import encodings

    monkeypatch.setattr(encodings, "BUNDLED_PACKAGE", "no_such_package_with_encodings")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/nonexistent-tiktoken-cache")
    made = Compactor(
        Settings(
            upstreams=[{"name": "up", "base_url": "http://up.test/v1"}],
            models={"small-model": {"context_window": WINDOW, "max_output_tokens": OUTPUT}},
            compaction={"tokenizer": {"download": False}},
        )
    )
    try:
        quiet = await made.run(agent_body(2), Mode.NORMAL, size_hint=0)
        assert quiet.metrics is None and quiet.report.tokenizer != "o200k_base"
        assert made.tokenizers.fallback_uses == 1
        full = await made.run(agent_body(2), Mode.FORCE, size_hint=0)
        assert full.metrics is not None
        assert made.tokenizers.fallback_uses == 2
        body = sized_estimated(made)
        before = made.tokenizers.fallback_uses
        big = await made.run(body, Mode.NORMAL, size_hint=0)
        assert big.metrics is not None  # past the prepare threshold: the full path
        assert made.tokenizers.fallback_uses == before + 1
    finally:
        made.close()


def sized_estimated(compactor: Compactor) -> dict[str, Any]:
    steps = 1
    while True:
        body = agent_body(steps)
        report = compactor.run_sync(body, Mode.DRY_RUN).report
        if report.tokens_before >= 0.72 * report.budget:
            return body
        steps += 1
