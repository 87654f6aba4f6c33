"""What reading ``usage.prompt_tokens`` from compressed replies costs, and what avoiding it would.

    python -m bench.usage_probe [--rounds 300] [--out bench/results/usage-probe.md]

The SDKs send ``Accept-Encoding: gzip, deflate``; an upstream that compresses then hands the
proxy gzip bytes that it relays untouched. Calibration needs the reply's usage, so either the
probe decompresses on the side (compaction_proxy/upstream/_usage.py), or the proxy asks the upstream for
``identity`` and the client gets the reply uncompressed. This measures, per reply, the probe's
CPU time on identity and gzip bodies (JSON replies, and SSE streams fed event by event as a
server flushes them), and the bytes each encoding puts on the wire.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import platform
import statistics
import time
import zlib
from pathlib import Path

import orjson

from compaction_proxy.upstream import UsageProbe


def _json_reply(completion_words: int) -> bytes:
    text = " ".join(f"word{i % 97}" for i in range(completion_words))
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 120_000, "completion_tokens": completion_words},
        }
    )


def _sse_events(deltas: int) -> list[bytes]:
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1}
    events = []
    for i in range(deltas):
        choice = {"index": 0, "delta": {"content": f" word{i % 97}"}, "finish_reason": None}
        events.append(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")
    usage = {"prompt_tokens": 120_000, "completion_tokens": deltas}
    events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _gzip_events(events: list[bytes]) -> list[bytes]:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [compressor.compress(e) + compressor.flush(zlib.Z_SYNC_FLUSH) for e in events]
    out.append(compressor.flush())
    return out


def _probe_time(content_type: str, encoding: str | None, chunks: list[bytes], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        probe = UsageProbe.start(content_type, encoding, None)
        assert probe is not None
        for chunk in chunks:
            probe.feed(chunk)
        tokens = probe.prompt_tokens()
        samples.append(time.perf_counter() - started)
        assert tokens == 120_000
    return statistics.median(samples)


def run(rounds: int) -> list[tuple[str, int, int, float, float]]:
    rows = []
    for name, words in (("JSON, 300-word answer", 300), ("JSON, 8,000-word answer", 8_000)):
        body = _json_reply(words)
        zipped = gzip.compress(body)
        chunks = [body[i : i + 16_384] for i in range(0, len(body), 16_384)]
        zchunks = [zipped[i : i + 16_384] for i in range(0, len(zipped), 16_384)]
        rows.append(
            (
                name,
                len(body),
                len(zipped),
                _probe_time("application/json", None, chunks, rounds),
                _probe_time("application/json", "gzip", zchunks, rounds),
            )
        )
    for name, deltas in (("SSE, 300 deltas", 300), ("SSE, 8,000 deltas", 8_000)):
        events = _sse_events(deltas)
        zevents = _gzip_events(events)
        rows.append(
            (
                name,
                sum(map(len, events)),
                sum(map(len, zevents)),
                _probe_time("text/event-stream", None, events, rounds),
                _probe_time("text/event-stream", "gzip", zevents, rounds),
            )
        )
    return rows


def report(rows: list[tuple[str, int, int, float, float]], rounds: int) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.1f} µs"

    lines = [
        "# The usage probe on compressed replies",
        "",
        f"`python -m bench.usage_probe --rounds {rounds}` on {dt.date.today().isoformat()}, "
        f"Python {platform.python_version()}, {platform.machine()}; medians per reply. "
        "Streams are gzipped as a server streams them: one compressor, a sync flush per event.",
        "",
        "| reply | identity bytes | gzip bytes | probe, identity | probe, gzip | "
        "gzip cost per reply | identity's extra bytes to the client |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, plain, zipped, t_plain, t_gzip in rows:
        lines.append(
            f"| {name} | {plain:,} | {zipped:,} | {us(t_plain)} | {us(t_gzip)} | "
            f"+{us(t_gzip - t_plain)} | +{plain - zipped:,} ({plain / zipped:.1f}x) |"
        )
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
