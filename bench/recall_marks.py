"""What ``compaction.recall`` costs the compaction core: latency with and without the marks, and
what one compaction archives.

    python -m bench.recall_marks [--quick] [--out bench/results/recall-marks.md]

For each conversation size (bench/conversations.py: agent turns with heavy-tailed tool outputs)
on gpt-4o with a 16k window (so the default pipeline fires: pruning, collapse, truncation; no
summarizer), ``compact`` runs with ``recall`` off and on, on a fresh count cache each time
(the encoding already loaded), alternating the two so drift hits both alike. Reported: the
median and p90 in ms, the overhead of recall, and with recall on what the run archived: the
originals, the spans, their canonical bytes (what the checkpoint store keeps beside the
checkpoint) and how many marks the forwarded messages carry. No timing is asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.compaction import MODEL, WINDOWS, Series, new_loader, timed
from bench.conversations import conversation, tools
from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    TokenizerProvider,
    build_pipeline,
    compact,
)
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.marks import message_mark

SIZES = (100, 620, 2000, 6500)
QUICK_SIZES = (100, 2000)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    args = parser.parse_args(argv)
    loader = new_loader()
    loader.load("o200k_base")
    pipeline = build_pipeline(CompactionSettings())
    catalog = WINDOWS["16k"]
    tool_defs = tools()

    def run(messages: list[dict], recall: bool) -> CompactionResult:
        request = CompactionRequest(
            messages,
            model=MODEL,
            pipeline=pipeline,
            tokenizer=TokenizerProvider(loader),
            facts=catalog,
            tools=tool_defs,
            recall=recall,
        )
        return compact(request)

    rows = [
        "| messages | tokens | off: median / p90 ms | on: median / p90 ms | overhead | "
        "archived originals | spans | archived bytes | marks forwarded |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in QUICK_SIZES if args.quick else SIZES:
        messages = conversation(size)
        reps = 3 if args.quick else (9 if size <= 2000 else 5)
        off, on = Series(), Series()
        result = None
        for _ in range(reps):
            seconds, _ = timed(lambda: run(messages, False))
            off.add(seconds)
            seconds, result = timed(lambda: run(messages, True))
            on.add(seconds)
        assert result is not None
        archived = result.archived
        originals = archived.originals if archived is not None else {}
        spans = archived.spans if archived is not None else {}
        stored = sum(len(canonical_bytes(m)) for m in originals.values())
        marks = sum(1 for m in result.messages if message_mark(m) is not None)
        overhead = (on.med_ms - off.med_ms) / off.med_ms * 100
        rows.append(
            f"| {size:,} | {result.report.tokens_before:,} | {off.cell()} | {on.cell()} | "
            f"{overhead:+.0f}% | {len(originals):,} | {len(spans):,} | {stored:,} | {marks:,} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    text = "\n".join(
        [
            "# Recall marks: the core's cost",
            "",
            "`python -m bench.recall_marks"
            + (" --quick" if args.quick else "")
            + "`: gpt-4o with a 16k window, the default pipeline (no summarizer), a fresh count "
            "cache per run.",
            "",
            *rows,
            "",
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
