"""Summary calls sized by the summarizer model's calibration and window, and made once more,
smaller, after a "too long" refusal (compaction_proxy/summarizer/_sizing.py).

respx plays an upstream that counts prompts as a model with another tokenizer would: our count
times ``SCALE``, refused past its window in OpenAI's words (with the window and the count).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryError, SummaryRequest
from compaction_proxy.compaction.tokens import Tokenizer
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.summarizer import (
    ForwardedRequest,
    HttpSummarizer,
    SummarizerWindow,
    SummaryOverflow,
    SummarySizing,
)
from compaction_proxy.summarizer._sizing import smaller_after
from compaction_proxy.upstream import Overflow, UpstreamTransport
from tests.support.processes import tiktoken_cache_dir

LOCAL = "http://local.test/v1"
MODEL = "local-4k"
WINDOW = 4_096
SCALE = 1.63
LIMIT = 600

TOKENIZER: Tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
    "o200k_base"
)

STRETCH = tuple(
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}: " + "detail " * 180}
    for i in range(12)
)  # about 2,200 tokens by our count: 3,600 by the upstream's


def upstream_count(body: dict[str, Any]) -> int:
    """The upstream's count of a call: ours, times ``SCALE``."""
    ours = sum(TOKENIZER.count_message(m) for m in body["messages"]) + TOKENIZER.reply_priming
    return math.ceil(ours * SCALE)


class Upstream:
    """Answers summary calls that fit its window, refuses the others as OpenAI words it (or,
    ``stated=False``, as Groq does: no numbers at all)."""

    def __init__(self, window: int = WINDOW, *, stated: bool = True) -> None:
        self.window = window
        self.stated = stated
        self.bodies: list[dict[str, Any]] = []
        self.refused = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        self.bodies.append(body)
        prompt = upstream_count(body)
        output = body.get("max_completion_tokens") or 0
        if prompt + output > self.window:
            self.refused += 1
            message = (
                f"This model's maximum context length is {self.window} tokens. However, you "
                f"requested {prompt + output} tokens ({prompt} in the messages, {output} in the "
                "completion). Please reduce the length of the messages or completion."
                if self.stated
                else "Please reduce the length of the messages or completion."
            )
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                },
            )
        reply = {
            "id": "c",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"summary {len(self.bodies)}"},
                }
            ],
        }
        return httpx.Response(200, json=reply)


class Learned:
    """The edge's side of :class:`SummarySizing`, recorded."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.observed: list[tuple[str, int, int]] = []
        self.windows: list[tuple[str, str, int]] = []

    def sizing(self) -> SummarySizing:
        async def learn(upstream: str, model: str, tokens: int) -> None:
            self.windows.append((upstream, model, tokens))

        def calibrate(model: str, reported: int, counted: int) -> None:
            self.observed.append((model, reported, counted))

        return SummarySizing(ratio=lambda _model: self.ratio, calibrate=calibrate, learn=learn)


def summarizer(client: UpstreamTransport, learned: Learned) -> HttpSummarizer:
    upstreams = [UpstreamSettings.model_validate({"name": "local", "base_url": LOCAL})]
    return HttpSummarizer(
        SummarizationSettings.model_validate({"maxSummaryTokens": LIMIT}),
        upstreams,
        client,
        facts_for=lambda _model: ModelFacts(context_window=WINDOW, max_output_tokens=4_096),
        tokenizer_for=lambda _model: TOKENIZER,
        sizing=learned.sizing(),
    )


def bound(summary: HttpSummarizer) -> HttpSummarizer:
    """Bound to the request the stretch comes from: the prefix form applies (same upstream and
    model, no binary content) whenever it fits."""
    messages = [{"role": "system", "content": "You are a coding agent."}, *STRETCH]
    messages.append({"role": "user", "content": "go on"})
    return summary.bind(
        caller_key=None, request=ForwardedRequest(messages, upstream="local"), upstream="local"
    )


Mocked = Callable[[Upstream], respx.Route]


@pytest.fixture
def answered(mock: respx.MockRouter) -> Mocked:
    def route(upstream: Upstream) -> respx.Route:
        return mock.post(f"{LOCAL}/chat/completions").mock(side_effect=upstream)

    return route


async def test_calls_are_sized_by_the_calibrated_count(
    answered: Mocked, client: UpstreamTransport
) -> None:
    """With the calibration known, no call is refused: the prefix form, which fits by our count
    (2,400 tokens) and not by the model's (3,900), gives way to chunks that fit."""
    upstream = Upstream()
    answered(upstream)
    learned = Learned(SCALE)
    text = await bound(summarizer(client, learned)).summarize(
        SummaryRequest(STRETCH, None, MODEL, max_tokens=LIMIT)
    )
    assert text.startswith("summary")
    assert upstream.refused == 0
    assert len(upstream.bodies) >= 2  # more than one part: the stretch does not fit one call
    for body in upstream.bodies:
        assert upstream_count(body) + body["max_completion_tokens"] <= WINDOW
    assert learned.windows == [] and learned.observed == []


async def test_the_prefix_form_that_fits_by_our_count_alone_is_refused_uncalibrated(
    answered: Mocked, client: UpstreamTransport
) -> None:
    """The case the calibration prevents (ratio 1.0: nothing measured yet): the call goes in
    the prefix form, is refused, teaches the window and the ratio, and the summary is made by
    one smaller try in parts, not backed off."""
    upstream = Upstream()
    route = answered(upstream)
    learned = Learned(1.0)
    summary = bound(summarizer(client, learned))
    text = await summary.summarize(SummaryRequest(STRETCH, None, MODEL, max_tokens=LIMIT))
    assert text.startswith("summary")
    assert upstream.refused == 1
    first = orjson.loads(route.calls[0].request.content)
    assert first["messages"][-1]["content"].startswith("[compaction-proxy: checkpoint request]")
    for body in upstream.bodies[1:]:
        assert upstream_count(body) + body["max_completion_tokens"] <= WINDOW
    assert learned.windows == [("local", MODEL, WINDOW)]
    [(model, reported, counted)] = learned.observed
    assert model == MODEL and reported / counted == pytest.approx(SCALE, rel=0.01)
    outcomes = [outcome for (_, _, outcome), n in summary.stats.calls.items() for _ in range(n)]
    assert outcomes.count("overflow") == 1 and "error" not in outcomes


async def test_a_call_refused_again_when_smaller_fails_as_overflow(
    answered: Mocked, client: UpstreamTransport
) -> None:
    """Once: a retry refused too is the summary's failure (and the flights' back-off), not a
    series of ever smaller calls."""
    # A refusal that states nothing: the retry is a fifth smaller, and still too long.
    upstream = Upstream(window=2_500, stated=False)
    answered(upstream)
    with pytest.raises(SummaryError) as caught:
        await summarizer(client, Learned(1.0)).summarize(
            SummaryRequest(STRETCH, None, MODEL, max_tokens=LIMIT)
        )
    assert caught.value.reason == "overflow"
    assert "refused again when retried smaller" in caught.value.message
    assert upstream.refused == 2 and len(upstream.bodies) == 2


def _refusal(window: int | None, prompt: int | None, *, floor: bool = False) -> Overflow:
    message = "at least" if floor else "too long"
    return Overflow("openai", window, prompt, None, message)


def test_a_stated_window_smaller_than_ours_is_learned() -> None:
    window = SummarizerWindow(8_000, 500)
    refused = SummaryOverflow("refused", _refusal(4_096, 5_000), sent=5_000)
    smaller = smaller_after(refused, window)
    assert smaller.learned == 4_096 and smaller.window.context_window == 4_096
    assert smaller.window.ratio == 1.0 and smaller.observed == 1.0


def test_a_stated_count_raises_the_ratio() -> None:
    window = SummarizerWindow(4_096, 500)
    refused = SummaryOverflow("refused", _refusal(4_096, 4_890), sent=3_000)
    smaller = smaller_after(refused, window)
    assert smaller.window.context_window == 4_096
    assert smaller.window.ratio == pytest.approx(1.63)
    assert smaller.observed == pytest.approx(1.63)
    # Now sized in the model's tokens: fewer of ours fit.
    assert smaller.window.input_budget(0, 0) < window.input_budget(0, 0) / 1.6


def test_a_refusal_that_states_nothing_still_makes_the_retry_smaller() -> None:
    window = SummarizerWindow(4_096, 500, ratio=1.2)
    refused = SummaryOverflow("refused", _refusal(None, None), sent=3_000)
    smaller = smaller_after(refused, window)
    assert smaller.window.input_budget(0, 0) < window.input_budget(0, 0)
    assert smaller.observed is None


def test_a_floor_count_raises_the_ratio_but_does_not_calibrate() -> None:
    window = SummarizerWindow(4_096, 500)
    refused = SummaryOverflow("refused", _refusal(4_096, 3_597, floor=True), sent=2_000)
    smaller = smaller_after(refused, window)
    assert smaller.window.ratio == pytest.approx(3_597 / 2_000)
    assert smaller.observed is None
