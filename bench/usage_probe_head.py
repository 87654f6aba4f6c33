"""What reading a stream's first events costs the usage probe (Anthropic's ``message_start``).

    python -m bench.usage_probe_head [--rounds 300] [--out bench/results/usage-probe-head.md]

A Messages stream states the prompt's usage in ``message_start``; Anthropic repeats it,
cumulatively, in ``message_delta`` at the end, llama.cpp states only ``output_tokens`` there. So
for a format with ``usage_at_start`` the probe (compaction_proxy/upstream/_usage.py) keeps a
stream's first 16 KiB besides its last 4 KiB. This measures, per stream fed event by event as a
server flushes it, the probe's CPU time with the tail alone and with the head too, on the fake
Messages upstream's own events (tests/fakes/messages/render.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import platform
import statistics
import time
from pathlib import Path

from compaction_proxy.upstream import UsageProbe
from compaction_proxy.wire.messages._sizes import anthropic_usage_tokens
from tests.fakes.messages import render

USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 120_000,
    "output_tokens": 1,
}
PROMPT = 12 + 300 + 120_000


def _events(deltas: int, delta_usage: str) -> list[bytes]:
    opening = render.message("msg_bench", "claude-sonnet-4-5", [], None, USAGE, None)
    text = "".join(f" word{i % 97}" for i in range(deltas * 3))  # ~3 words a 24-char delta

    async def collect() -> list[bytes]:
        content = [{"type": "text", "text": text}]
        stream = render.events(opening, content, "end_turn", USAGE, delta_usage=delta_usage)
        return [event async for event in stream]

    return asyncio.run(collect())


def _probe_time(events: list[bytes], at_start: bool, rounds: int) -> tuple[float, int | None]:
    samples = []
    tokens = None
    for _ in range(rounds):
        started = time.perf_counter()
        probe = UsageProbe.start(
            "text/event-stream", None, None, anthropic_usage_tokens, at_start=at_start
        )
        assert probe is not None
        for event in events:
            probe.feed(event)
        tokens = probe.prompt_tokens()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), tokens


def run(rounds: int) -> list[tuple[str, int, float, float, float]]:
    rows = []
    for deltas in (100, 2_000, 8_000):
        cumulative = _events(deltas, "cumulative")
        output_only = _events(deltas, "output")
        tail, tail_tokens = _probe_time(cumulative, False, rounds)
        head, head_tokens = _probe_time(cumulative, True, rounds)
        start_only, start_tokens = _probe_time(output_only, True, rounds)
        assert tail_tokens == head_tokens == start_tokens == PROMPT
        name = f"{len(cumulative):,} events"
        rows.append((name, sum(map(len, cumulative)), tail, head, start_only))
    return rows


def report(rows: list[tuple[str, int, float, float, float]], rounds: int) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.1f} µs"

    lines = [
        "# The usage probe reading a stream's first events",
        "",
        f"`python -m bench.usage_probe_head --rounds {rounds}` on {dt.date.today().isoformat()}, "
        f"Python {platform.python_version()}, {platform.machine()}; medians per stream, fed "
        "event by event. The head is kept for a format with `usage_at_start` (Messages).",
        "",
        "| stream | bytes | tail only (Anthropic's cumulative end) | head and tail (the same) | "
        "head and tail (llama.cpp's end: read from message_start) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, size, tail, head, start_only in rows:
        lines.append(f"| {name} | {size:,} | {us(tail)} | {us(head)} | {us(start_only)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = report(run(args.rounds), args.rounds)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
