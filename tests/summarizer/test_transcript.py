"""Transcript guards: placeholders for binary data, reasoning dropped, elision, chunks, fold."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from compaction_proxy.compaction.summarizer_contract import CUT_MARK, SummaryError
from compaction_proxy.compaction.tokens import CharacterEstimatorTokenizer
from compaction_proxy.summarizer import DEFAULT_PROMPTS, PromptSet
from compaction_proxy.summarizer._transcript import (
    SummarizerWindow,
    TranscriptOptions,
    chunk_blocks,
    elide,
    fold,
    plan_chunks,
    render_blocks,
    render_message,
    scrub_text,
)

COUNT = CharacterEstimatorTokenizer().count_text
B64 = base64.b64encode(os.urandom(9000)).decode()  # 12000 characters


def test_tool_calls_and_results_by_name() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        {"role": "tool", "tool_call_id": "c1", "content": "20C"},
        {"role": "tool", "tool_call_id": "unknown", "content": "orphan"},
        {"role": "function", "name": "legacy_fn", "content": "legacy result"},
        {"role": "assistant", "content": "Sunny, 20C."},
    ]
    blocks = render_blocks(messages)
    assert blocks[0] == "[user alice]\nWeather in Paris?"
    assert blocks[1] == '[assistant]\n-> get_weather({"city": "Paris"})\n-> get_time({})'
    assert blocks[2] == "[tool result: get_time]\n12:00"
    assert blocks[3] == "[tool result: get_weather]\n20C"
    assert blocks[4] == "[tool result]\norphan"
    assert blocks[5] == "[tool result: legacy_fn]\nlegacy result"
    assert blocks[6] == "[assistant]\nSunny, 20C."


def test_image_parts_and_data_urls_become_placeholders() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/cat.png", "detail": "low"},
            },
            {"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": B64}},
        ],
    }
    text = render_message(message)
    assert B64[:50] not in text
    assert "[image]" in text
    assert "[image: https://example.com/cat.png]" in text
    assert "[audio]" in text and "[file: report.pdf]" in text
    assert len(text) < 200


def test_data_url_and_base64_inside_text() -> None:
    text = scrub_text(f"see data:application/pdf;base64,{B64} and also {B64} end")
    assert B64[:40] not in text
    assert "[binary data, 9000 bytes]" in text
    assert text.startswith("see ") and text.endswith(" end")
    assert scrub_text(f"![x](data:image/jpeg;base64,{B64})") == "![x]([image])"


def test_ordinary_text_is_left_alone() -> None:
    for text in (
        "x" * 500,
        "-" * 300,
        "/usr/lib/python3/dist-packages/foo/bar.py",
        "sha256:" + "ab12" * 16,
        "a perfectly normal sentence.",
    ):
        assert scrub_text(text) == text


def test_reasoning_is_dropped_whole() -> None:
    message = {
        "role": "assistant",
        "reasoning_content": "SECRET-CHAIN-1",
        "reasoning": {"summary": "SECRET-CHAIN-2"},
        "thinking": "SECRET-CHAIN-3",
        "content": [
            {"type": "thinking", "thinking": "SECRET-CHAIN-4", "signature": "sig"},
            {"type": "redacted_thinking", "data": "SECRET-CHAIN-5"},
            {"type": "reasoning", "text": "SECRET-CHAIN-6"},
            {"type": "text", "text": "The answer is 4."},
        ],
    }
    text = render_message(message)
    assert "SECRET" not in text and "sig" not in text
    assert text == "[assistant]\nThe answer is 4."
    # The client's dict is never edited.
    assert message["reasoning_content"] == "SECRET-CHAIN-1"
    assert len(message["content"]) == 4


def test_oversized_message_keeps_head_and_tail() -> None:
    body = "HEAD-MARK " + "lorem ipsum " * 5000 + " TAIL-MARK"
    text = render_message(
        {"role": "tool", "content": body}, options=TranscriptOptions(max_message_chars=1000)
    )
    assert "HEAD-MARK" in text and "TAIL-MARK" in text
    assert "characters elided] …" in text
    assert len(text) < 1200
    assert elide("short", 100) == "short"
    cut = elide("a" * 100 + "b" * 100, 50)
    assert cut.startswith("a" * 30) and cut.endswith("b" * 20)
    assert "[150 characters elided]" in cut


def test_chunks_fit_their_budget_and_keep_order() -> None:
    blocks = [f"[user]\nmessage {i} " + "word " * (20 + i * 7) for i in range(40)]
    chunks = chunk_blocks(blocks, lambda _n: 300, COUNT)
    assert len(chunks) > 1
    assert all(COUNT(chunk) <= 300 for chunk in chunks)
    joined = "\n\n".join(chunks)
    positions = [joined.index(f"message {i} ") for i in range(40)]
    assert positions == sorted(positions)


def test_a_block_larger_than_a_chunk_is_elided_to_fit() -> None:
    blocks = ["[user]\nsmall", "[tool result]\nSTART " + "data " * 5000 + "END", "[user]\nafter"]
    chunks = chunk_blocks(blocks, lambda _n: 400, COUNT)
    assert all(COUNT(c) <= 400 for c in chunks)
    assert any("START" in c and "END" in c and "elided" in c for c in chunks)
    assert chunks[-1].endswith("[user]\nafter")


def test_plan_chunks_sizes_later_chunks_for_the_running_summary() -> None:
    blocks = [f"[user]\n{i} " + "word " * 200 for i in range(60)]
    window = SummarizerWindow(context_window=8000, max_output_tokens=1000)
    chunks = plan_chunks(blocks, None, DEFAULT_PROMPTS, window, COUNT)
    prompt = COUNT(DEFAULT_PROMPTS.checkpoint)
    update = COUNT(DEFAULT_PROMPTS.update)
    assert COUNT(chunks[0]) <= window.input_budget(prompt, 0)
    for chunk in chunks[1:]:
        assert COUNT(chunk) <= window.input_budget(update, 1000)
    # Each call (prompt + previous summary + chunk + output) fits the window.
    assert len(chunks) > 2
    assert prompt + COUNT(chunks[0]) + 1000 <= 8000
    for chunk in chunks[1:]:
        assert update + 1000 + COUNT(chunk) + 1000 <= 8000


def test_window_too_small_is_a_summary_error() -> None:
    window = SummarizerWindow(context_window=2000, max_output_tokens=1500)
    with pytest.raises(SummaryError) as caught:
        plan_chunks(["[user]\nhello"], None, DEFAULT_PROMPTS, window, COUNT)
    assert caught.value.reason == "error"


class RecordingCall:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, system: str, user: str) -> str:
        self.calls.append((system, user))
        return f"summary-{len(self.calls)}"


async def test_fold_one_call_per_chunk_update_prompt_after_the_first() -> None:
    call = RecordingCall()
    result = await fold(["chunk-a", "chunk-b", "chunk-c"], None, DEFAULT_PROMPTS, call)
    assert result == "summary-3"
    assert [system for system, _ in call.calls] == [
        DEFAULT_PROMPTS.checkpoint,
        DEFAULT_PROMPTS.update,
        DEFAULT_PROMPTS.update,
    ]
    assert "<previous-checkpoint>" not in call.calls[0][1]
    assert "chunk-a" in call.calls[0][1]
    assert "<previous-checkpoint>\nsummary-1\n</previous-checkpoint>" in call.calls[1][1]
    assert "<previous-checkpoint>\nsummary-2\n</previous-checkpoint>" in call.calls[2][1]
    assert "chunk-c" in call.calls[2][1]


async def test_fold_with_previous_summary_starts_with_the_update_prompt() -> None:
    call = RecordingCall()
    await fold(["chunk-a"], "the old checkpoint", DEFAULT_PROMPTS, call)
    system, user = call.calls[0]
    assert system == DEFAULT_PROMPTS.update
    assert "<previous-checkpoint>\nthe old checkpoint\n</previous-checkpoint>" in user


async def test_fold_passes_a_cut_chunk_on_without_its_mark_and_ends_with_it() -> None:
    """A chunk's summary kept from a cut reply is folded into the next without the mark (the
    model would copy it), and the whole summary says it was cut."""
    call = RecordingCall()
    replies = iter([f"first\n\n{CUT_MARK}", "second"])

    async def cut_first(system: str, user: str) -> str:
        await call(system, user)
        return next(replies)

    result = await fold(["a", "b"], None, DEFAULT_PROMPTS, cut_first)
    assert "<previous-checkpoint>\nfirst\n</previous-checkpoint>" in call.calls[1][1]
    assert result == f"second\n\n{CUT_MARK}"
    assert await fold(["a"], None, DEFAULT_PROMPTS, RecordingCall()) == "summary-1"


async def test_fold_with_custom_prompt_only() -> None:
    call = RecordingCall()
    prompts = PromptSet.from_config("MY PROMPT")
    await fold(["a", "b"], None, prompts, call)
    assert [s for s, _ in call.calls] == ["MY PROMPT", "MY PROMPT"]


async def test_fold_stops_at_the_first_failure() -> None:
    calls = 0

    async def failing(system: str, user: str) -> str:
        nonlocal calls
        calls += 1
        raise SummaryError("timeout", "slow")

    with pytest.raises(SummaryError):
        await fold(["a", "b"], None, DEFAULT_PROMPTS, failing)
    assert calls == 1


async def test_fold_without_chunks_is_empty() -> None:
    with pytest.raises(SummaryError) as caught:
        await fold([], None, DEFAULT_PROMPTS, RecordingCall())
    assert caught.value.reason == "empty"


def test_text_riding_beside_a_tool_result_is_shown() -> None:
    # Anthropic's blocks after a step's tool results ride on its last result
    # (compaction_proxy/wire/messages/_lift.py): a note the user queued is what the model read.
    message = {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "tests: 3 failed",
        "blocks": [
            {"type": "text", "text": "User note: the deadline is FRIDAY-9."},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    block = render_message(message)
    assert "tests: 3 failed" in block and "FRIDAY-9" in block
    assert "base64" not in block
