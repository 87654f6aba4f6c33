"""Run one strategy through the public pipeline API."""

from __future__ import annotations

from typing import Any

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    Mode,
    ModelFacts,
    Pipeline,
    compact,
)
from compaction_proxy.compaction.strategies import Strategy

BIG = ModelFacts(context_window=1_000_000, max_output_tokens=0)


def run(
    strategy: Strategy,
    messages: list[dict[str, Any]],
    *,
    facts: ModelFacts = BIG,
    mode: Mode = Mode.NORMAL,
) -> CompactionResult:
    return compact(
        CompactionRequest(
            messages,
            model="test",
            pipeline=Pipeline((strategy,), fallback=False),
            tokenizer=CharacterEstimatorTokenizer(),
            facts=facts,
            reserve_ratio=0,
            mode=mode,
        )
    )
