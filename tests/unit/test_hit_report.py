"""A checkpoint hit reports what the client sent (compaction_proxy/engine/_hit_report.py).

The flow runs in-process with a real memory store and the real tokenizer; the reference figure
is the compactor's own count of the client's whole request with no checkpoint in the way
(``run_sync``), so "exact" here means: the same number a miss would have reported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from compaction_proxy.checkpoints import MemoryStore
from compaction_proxy.compaction import Mode
from compaction_proxy.config import Settings
from compaction_proxy.engine import CompactionFlow, Compactor, FlowRequest, build_flow
from compaction_proxy.engine._hit_report import CHECKPOINT_STEP

MODEL = "small-model"


def _settings() -> Settings:
    return Settings.model_validate(
        {
            "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
            "models": {MODEL: {"context_window": 4_000, "max_output_tokens": 500}},
            "compaction": {
                "pipeline": [
                    {
                        "strategy": "sliding_window",
                        "trigger": {"tokens_exceed": 2_000},
                        "keep_last_turns": 2,
                    }
                ]
            },
            "summarization": {"enabled": False},
        }
    )


def _request(turns: int) -> dict[str, Any]:
    """Turn ``turns``'s request: every earlier turn answered, then its own question; the
    request of the next turn extends this one, as a client resends it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns + 1):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i - 1}"})
        messages.append({"role": "user", "content": f"question {i}: " + "lorem ipsum " * 90})
    return {"model": MODEL, "messages": messages}


@pytest.fixture
async def flow() -> AsyncIterator[CompactionFlow]:
    settings = _settings()
    compactor = Compactor(settings)
    client = httpx.AsyncClient()
    yield build_flow(settings, compactor, MemoryStore(), client)
    await client.aclose()
    compactor.close()


async def _run(flow: CompactionFlow, data: dict[str, Any], mode: Mode = Mode.NORMAL) -> Any:
    result = await flow.run(
        FlowRequest(
            data, mode, size_hint=0, credential="Bearer k", caller_key=None, upstream_name="up"
        )
    )
    if result.save is not None:
        assert await result.save() is None
    return result


def _full_count(flow: CompactionFlow, data: dict[str, Any]) -> int:
    return flow.compactor.run_sync(data, Mode.NORMAL).report.tokens_before


async def test_a_hit_reports_the_clients_whole_request(flow: CompactionFlow) -> None:
    first = await _run(flow, _request(12))
    assert first.checkpoint == "new"
    data = _request(13)  # the same conversation, one turn on
    hit = await _run(flow, data)
    assert hit.checkpoint == "hit"
    report = hit.result.report
    assert report.tokens_before == _full_count(flow, data)
    assert report.messages_before == len(data["messages"])
    assert report.tokens_after < report.tokens_before / 2
    assert report.changed_by[0] == CHECKPOINT_STEP
    step = report.strategies[0]
    assert step.name == CHECKPOINT_STEP and step.changed
    assert step.tokens_before == report.tokens_before
    assert step.tokens_after < step.tokens_before
    assert any("sliding_window" in note for note in step.notes)


async def test_exact_across_many_hits_and_compactions(flow: CompactionFlow) -> None:
    """Checkpoints made on top of checkpoints still add up to the client's count."""
    outcomes = []
    for turns in range(10, 40):
        data = _request(turns)
        result = await _run(flow, data)
        outcomes.append(result.checkpoint)
        assert result.result.report.tokens_before == _full_count(flow, data), turns
    assert outcomes.count("new") >= 3 and outcomes.count("hit") >= 10


async def test_a_dry_run_on_a_hit_reports_the_whole_request_too(flow: CompactionFlow) -> None:
    await _run(flow, _request(12))
    data = _request(14)
    dry = await _run(flow, data, Mode.DRY_RUN)
    assert dry.checkpoint == "hit" and dry.body is None  # the original goes upstream
    assert dry.result.report.tokens_before == _full_count(flow, data)


async def test_a_checkpoint_without_the_figure_is_counted_the_slow_way(
    flow: CompactionFlow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints stored before `folded_tokens` existed still report exactly."""
    import compaction_proxy.engine._hit_report as hit_report

    monkeypatch.setattr(hit_report, "checkpoint_meta", lambda report: {})
    first = await _run(flow, _request(12))
    assert first.checkpoint == "new"
    data = _request(13)
    hit = await _run(flow, data)
    assert hit.checkpoint == "hit"
    assert hit.result.report.tokens_before == _full_count(flow, data)


async def test_a_miss_is_reported_as_the_pipeline_saw_it(flow: CompactionFlow) -> None:
    data = _request(2)
    result = await _run(flow, data)
    assert result.checkpoint == "none"
    assert result.result.report.tokens_before == _full_count(flow, data)
    assert CHECKPOINT_STEP not in result.result.report.changed_by
