"""What recall costs and what it brings back: the 200-step agent session of
tests/integration/test_recall_session.py, run with recall on and off, measured.

Real processes on loopback: the fake upstream (a 16k window, the summarizer, and the scripted
model that calls ``compaction_recall`` when a fact it is asked for is not in its prompt), the
proxy with SQLite checkpoints, the official ``openai`` SDK. After the steps, one question per
planted fact. Reported:

- facts answered (the value in the final answer) with recall and without;
- archive bytes per conversation: the originals and spans kept in the store, and the index the
  last checkpoint names;
- extra upstream calls per recall (hidden rounds per question that recalled);
- question latency: median and max wall time of a question that recalled and of one that did
  not (the fact still visible, or recall off): the ratio is what the hidden round adds.

    python -m bench.recall [--steps 200] [--out bench/results/recall.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.fakes.recall_policy import planted
from tests.support.agent_loop import SYSTEM, TASK
from tests.support.agent_session import CHAT, TOOLS, tool_output
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

WINDOW = 16_000
MODEL = "agent-16k"
FACT_EVERY = 20


@dataclass
class Run:
    recall: bool
    known: int = 0
    asked: int = 0
    recalled: list[float] = field(default_factory=list)  # seconds, questions that recalled
    plain: list[float] = field(default_factory=list)  # seconds, questions answered directly
    rounds: list[int] = field(default_factory=list)
    archive_bytes: int = 0
    archive_rows: int = 0
    index_entries: int = 0
    step_seconds: float = 0.0


def _conversation(steps: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    conversation: list[dict[str, Any]] = [SYSTEM, TASK]
    keys: list[tuple[str, str]] = []
    for index in range(steps):
        call_id = f"call_{index}"
        conversation.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": orjson.dumps({"path": f"src/m{index}.py"}).decode(),
                        },
                    }
                ],
            }
        )
        content = tool_output(index, 0, 1_200 if index % 2 == 0 else 150)
        if index % FACT_EVERY == 3:
            key, value = planted(index)
            keys.append((key, value))
            content = f"config says {key} = {value}\n{content}"
        conversation.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return conversation, keys


def run(work: Path, steps: int, recall: bool) -> Run:
    upstream = UpstreamServer(work / f"upstream-{recall}.log", context_window=WINDOW).start()
    db = work / f"checkpoints-{recall}.db"
    config = proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(db)},
        summarization={"enabled": True, "maxSummaryTokens": 600, "retainRecent": {"turns": 2}},
        compaction={"recall": {"enabled": recall, "max_rounds": 3, "max_tokens": 2_000}},
    )
    proxy = ProxyServer(write_config(work / f"proxy-{recall}.yaml", config), work / "p.log")
    proxy.start()
    out = Run(recall)
    try:
        client = proxy.openai_client()
        full, keys = _conversation(steps)
        started = time.perf_counter()
        for end in range(4, len(full) + 1, 2):
            client.chat.completions.create(model=MODEL, messages=full[:end], tools=TOOLS)
        out.step_seconds = (time.perf_counter() - started) / steps
        upstream.clear()
        conversation = list(full)
        for key, value in keys:
            conversation.append({"role": "user", "content": f"QUESTION: what is {key}?"})
            began = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=conversation, tools=TOOLS
            )
            took = time.perf_counter() - began
            text = raw.parse().choices[0].message.content or ""
            header = raw.headers.get("x-compaction-recall", "")
            rounds = _rounds(header)
            out.asked += 1
            out.known += f"{key} = {value}" in text
            if rounds:
                out.recalled.append(took)
                out.rounds.append(rounds)
            else:
                out.plain.append(took)
            upstream.take(CHAT)
            conversation.append({"role": "assistant", "content": text})
    finally:
        proxy.stop()
        upstream.stop()
    out.archive_rows, out.archive_bytes, out.index_entries = _archive_size(db)
    return out


def _rounds(header: str) -> int:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == "rounds":
            return int(value)
    return 0


def _archive_size(db: Path) -> tuple[int, int, int]:
    """Rows and bytes of archive entries (their meta says kind original/span), and the index
    entries of the largest one a checkpoint names."""
    rows = size = index = 0
    with sqlite3.connect(db) as conn:
        for (value,) in conn.execute("select value from checkpoints"):
            data = orjson.loads(value)
            meta = data.get("meta") or {}
            if meta.get("kind") in ("original", "span"):
                rows += 1
                size += len(value)
            entries = meta.get("archive")
            if isinstance(entries, list):
                index = max(index, len(entries))
    return rows, size, index


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values) * 1000:.1f} / {max(values) * 1000:.1f}"


def report(on: Run, off: Run, steps: int) -> str:
    rounds = statistics.mean(on.rounds) if on.rounds else 0.0
    lines = [
        f"# Recall: a {steps}-step agent session, {WINDOW // 1000}k window",
        "",
        f"{datetime.date.today()} · {platform.python_version()} · {platform.machine()}",
        "",
        "| | recall on | recall off |",
        "|---|---|---|",
        f"| facts answered | {on.known}/{on.asked} | {off.known}/{off.asked} |",
        f"| questions that recalled | {len(on.recalled)} | {len(off.recalled)} |",
        f"| extra upstream calls per recall | {rounds:.2f} | - |",
        f"| archive rows / bytes | {on.archive_rows} / {on.archive_bytes:,} | "
        f"{off.archive_rows} / {off.archive_bytes:,} |",
        f"| index entries (last checkpoint) | {on.index_entries} | {off.index_entries} |",
        f"| question that recalled, ms (median / max) | {_ms(on.recalled)} | - |",
        f"| question answered directly, ms (median / max) | {_ms(on.plain)} | {_ms(off.plain)} |",
        f"| step, ms (mean) | {on.step_seconds * 1000:.1f} | {off.step_seconds * 1000:.1f} |",
        "",
    ]
    plain = on.plain + off.plain
    if on.recalled and plain:
        ratio = statistics.median(on.recalled) / statistics.median(plain)
        lines.append(
            f"A question that recalled takes {ratio:.2f}x one answered without a hidden round "
            "(median, the same proxy and conversation size): the hidden round's upstream call "
            "and the answer read from the archive. The fake model answers in about a "
            "millisecond, so against a real model the hidden round costs about one more model "
            "call on a prefix the upstream has cached."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        on = run(work, args.steps, True)
        off = run(work, args.steps, False)
    text = report(on, off, args.steps)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
