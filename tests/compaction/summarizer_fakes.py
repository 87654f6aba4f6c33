"""In-memory summarizers for the compaction tests (they record every request)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    Mode,
    ModelFacts,
    Pipeline,
    Summarizer,
    SummaryError,
    SummaryRequest,
    compact_async,
)
from compaction_proxy.compaction.strategies import Strategy

BIG = ModelFacts(context_window=1_000_000, max_output_tokens=0)
TOK = CharacterEstimatorTokenizer()


def short_summary(request: SummaryRequest) -> str:
    """Deterministic and short: how many messages, and whether it extends a summary."""
    text = f"summary of {len(request.messages)} message(s)"
    if request.previous_summary is not None:
        text += f" after [{request.previous_summary[:20]}]"
    return text


class FakeSummarizer:
    """Returns ``reply(request)``, or raises ``error``; records every request."""

    def __init__(
        self,
        reply: Callable[[SummaryRequest], str] | str = short_summary,
        *,
        error: BaseException | None = None,
    ) -> None:
        self.reply = reply
        self.error = error
        self.calls: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls.append(request)
        if self.error is not None:
            raise self.error
        return self.reply if isinstance(self.reply, str) else self.reply(request)


def failing(reason: str, message: str = "upstream said no") -> FakeSummarizer:
    return FakeSummarizer(error=SummaryError(reason, message))


async def run_async(
    strategies: Strategy | tuple[Strategy, ...],
    messages: list[dict[str, Any]],
    summarizer: Summarizer | None,
    *,
    facts: ModelFacts = BIG,
    fallback: bool = False,
    mode: Mode = Mode.NORMAL,
) -> CompactionResult:
    chosen = strategies if isinstance(strategies, tuple) else (strategies,)
    return await compact_async(
        CompactionRequest(
            messages,
            model="test-model",
            pipeline=Pipeline(chosen, fallback=fallback),
            tokenizer=TOK,
            facts=facts,
            reserve_ratio=0,
            mode=mode,
        ),
        summarizer=summarizer,
    )
