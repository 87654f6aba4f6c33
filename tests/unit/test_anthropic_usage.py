"""The prompt's size in Anthropic's replies (compaction_proxy/wire/messages/_sizes.py) and the usage
probe reading a stream's first events (compaction_proxy/upstream/_usage.py, ``at_start``).

The streams are the fake Messages upstream's own (tests/fakes/messages/render.py), so they stay
in step with what the integration tests' server sends.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from compaction_proxy.upstream import UsageProbe
from compaction_proxy.wire.messages._sizes import anthropic_usage_tokens
from tests.fakes.messages import render
from tests.fakes.messages.app import Settings, validate_settings

CHUNK_SIZES = (1, 9, 512, 4096, 1 << 20)

USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 45_000,
    "output_tokens": 77,
}
PROMPT = 12 + 300 + 45_000


# ------------------------------------------------------------------ anthropic_usage_tokens


def test_a_json_reply_counts_the_cached_prefix_too() -> None:
    reply = render.message("msg_1", "claude-sonnet-4-5", [], "end_turn", USAGE, None)
    assert anthropic_usage_tokens(reply) == PROMPT


def test_message_start_states_it_inside_the_message() -> None:
    start = {"type": "message_start", "message": {"id": "msg_1", "usage": USAGE}}
    assert anthropic_usage_tokens(start) == PROMPT


def test_a_cumulative_message_delta_states_it_at_the_top() -> None:
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": USAGE}
    assert anthropic_usage_tokens(delta) == PROMPT


@pytest.mark.parametrize(
    "usage",
    [
        {"output_tokens": 15},  # llama.cpp's message_delta
        {"input_tokens": 0, "output_tokens": 15},  # a server that states it only at the end
        {"input_tokens": None, "cache_read_input_tokens": None},
        {"cache_read_input_tokens": 5_000, "output_tokens": 15},  # no input count: not a prompt
        {"input_tokens": True},
        {"input_tokens": "12"},
        {"input_tokens": -5},
    ],
)
def test_no_input_count_is_no_figure(usage: dict[str, Any]) -> None:
    assert anthropic_usage_tokens({"type": "message_delta", "usage": usage}) is None


def test_missing_and_null_cache_fields_count_nothing() -> None:
    usage = {"input_tokens": 40, "cache_read_input_tokens": None}
    assert anthropic_usage_tokens({"usage": usage}) == 40


@pytest.mark.parametrize(
    "payload",
    [None, [], "usage", {"type": "ping"}, {"usage": None}, {"message": {"usage": []}}],
)
def test_anything_else_is_none(payload: Any) -> None:
    assert anthropic_usage_tokens(payload) is None


# ------------------------------------------------------------------ the stream's first events


def _stream(
    usage: dict[str, Any],
    *,
    delta_usage: dict[str, Any] | None = None,
    text: str = "word " * 5_000,
) -> bytes:
    """An Anthropic stream as the fake renders it; ``delta_usage`` replaces what its
    ``message_delta`` states (the fake states the cumulative input fields there)."""
    opening = render.message("msg_1", "claude-sonnet-4-5", [], None, usage, None)
    content = [{"type": "text", "text": text}]

    async def collect() -> list[bytes]:
        return [e async for e in render.events(opening, content, "end_turn", usage)]

    events = asyncio.run(collect())
    if delta_usage is not None:
        events = [_with_delta_usage(e, delta_usage) for e in events]
    return b"".join(events)


def _with_delta_usage(event: bytes, usage: dict[str, Any]) -> bytes:
    if not event.startswith(b"event: message_delta\n"):
        return event
    data = orjson.loads(event.split(b"data: ", 1)[1])
    data["usage"] = usage
    return render.sse("message_delta", data)


def _read(
    stream: Sequence[bytes] | bytes, size: int, *, at_start: bool, coding: str | None = None
) -> int | None:
    probe = UsageProbe.start(
        "text/event-stream", coding, None, anthropic_usage_tokens, at_start=at_start
    )
    assert probe is not None
    chunks = [stream] if isinstance(stream, bytes) else list(stream)
    for chunk in chunks:
        for i in range(0, len(chunk), size):
            probe.feed(chunk[i : i + size])
    return probe.prompt_tokens()


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_a_long_stream_whose_end_states_only_the_output_is_read_from_its_start(size: int) -> None:
    stream = _stream(USAGE, delta_usage={"output_tokens": 77})  # llama.cpp's message_delta
    assert len(stream) > 40_000  # message_start is far outside the last 4 KiB
    assert _read(stream, size, at_start=True) == PROMPT
    # What the probe read before: the tail alone, which has no input count.
    assert _read(stream, size, at_start=False) is None


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_a_stream_whose_lines_end_in_cr_is_read_as_one_ending_in_lf(size: int) -> None:
    # SSE lets a line end in CR alone. The probe split lines at LF only: such a stream's start
    # was never read, and its end only by the lenient scan (`input_tokens` alone, 12).
    stream = _stream(USAGE, delta_usage={"output_tokens": 77}).replace(b"\n", b"\r")
    assert _read(stream, size, at_start=True) == PROMPT
    short = _stream(USAGE, text="hi").replace(b"\n", b"\r")
    assert _read(short, size, at_start=False) == PROMPT


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_the_cumulative_end_wins_over_the_start(size: int) -> None:
    # A server that knows the prompt's size only at the end states 0 at the start.
    start_usage = {**USAGE, "input_tokens": 0, "cache_read_input_tokens": 0}
    stream = _stream(start_usage, delta_usage={**USAGE, "input_tokens": 999})
    assert _read(stream, size, at_start=True) == 999 + 300 + 45_000


def test_a_stream_of_nothing_but_its_start_is_read() -> None:
    opening = render.message("msg_1", "m", [], None, USAGE, None)
    start = render.sse("message_start", {"type": "message_start", "message": opening})
    assert _read(start, 7, at_start=True) == PROMPT


def test_a_message_start_cut_at_the_tails_start_is_read_whole_from_the_head() -> None:
    # The tail begins inside message_start, after its line's start but before its usage: the
    # old lenient read took `input_tokens` alone from the cut object (12, not the prompt).
    opening = render.message("msg_" + "x" * 3_000, "m", [], None, USAGE, None)
    start = render.sse("message_start", {"type": "message_start", "message": opening})
    rest = render.sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 3}})
    rest += render.sse("message_stop", {"type": "message_stop"})
    cut_at = start.index(b'"msg_') + 10
    stream = start + rest + b": " + b"p" * (4096 - (len(start) - cut_at) - len(rest) - 3) + b"\n"
    assert len(stream) - 4096 == cut_at
    assert _read(stream, 100, at_start=False) == 12
    assert _read(stream, 100, at_start=True) == PROMPT


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_a_gzip_stream_is_read_from_its_start_too(size: int) -> None:
    events = _stream(USAGE, delta_usage={"output_tokens": 77})
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    pieces = [events[i : i + 700] for i in range(0, len(events), 700)]
    chunks = [compressor.compress(p) + compressor.flush(zlib.Z_SYNC_FLUSH) for p in pieces]
    chunks.append(compressor.flush())
    assert _read(chunks, size, at_start=True, coding="gzip") == PROMPT


def test_the_head_is_bounded_and_a_usage_event_cut_at_its_bound_is_not_guessed_at() -> None:
    filler = b": " + b"p" * (16_384 - 200) + b"\n"
    opening = render.message("msg_1", "m", [], None, USAGE, None)
    start = render.sse("message_start", {"type": "message_start", "message": opening})
    probe = UsageProbe.start("text/event-stream", None, None, anthropic_usage_tokens, at_start=True)
    assert probe is not None
    probe.feed(filler)
    probe.feed(start)  # its usage object begins inside the bound and ends past it
    assert b'"usage"' in (filler + start)[:16_384]
    probe.feed(b"x" * 10_000)  # pushes message_start out of the tail
    assert probe.prompt_tokens() is None


def test_the_fake_states_llamacpps_message_delta_when_asked() -> None:
    """The fake Messages upstream's ``delta_usage: output`` (what the real-process tests use)."""
    opening = render.message("msg_1", "m", [], None, USAGE, None)
    content = [{"type": "text", "text": "hi"}]

    async def collect(style: str) -> list[bytes]:
        events = render.events(opening, content, "end_turn", USAGE, delta_usage=style)
        return [e async for e in events]

    for style, stated in (("output", {"output_tokens": 77}), ("cumulative", USAGE)):
        delta = next(e for e in asyncio.run(collect(style)) if b"message_delta" in e)
        assert orjson.loads(delta.split(b"data: ", 1)[1])["usage"] == stated
    with pytest.raises(ValueError, match="delta_usage"):
        validate_settings(Settings(delta_usage="nope"))
