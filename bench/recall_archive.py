"""What the recall archive costs, in process (docs/recall.md): keeping what one compaction
removed, and answering a recall call (ids, a span, a query) from a real SQLite file, a memory
store and, with ``--redis URL``, a Redis.

An agent session's tool results (~2 KB each, a planted fact in some) are archived as one span;
the answers are counted with o200k_base as the proxy counts them. Wall-clock ms per operation
(median of ``--runs``), on whatever else the machine is doing: figures to compare, not targets.

    python -m bench.recall_archive [--sizes 100,1000,5000] [--runs 5] [--redis URL] [--out F]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from compaction_proxy.checkpoints import (
    Archive,
    CheckpointStore,
    MemoryStore,
    RedisStore,
    SqliteStore,
    archive_namespace,
    merged_index,
)
from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from compaction_proxy.compaction.archive import Archived, RecallIds
from compaction_proxy.compaction.settings import RecallSettings
from compaction_proxy.engine import RecallDesk
from compaction_proxy.wire.recall import RecallCall

SETTINGS = RecallSettings(enabled=True)
NS = archive_namespace("Bearer sk-bench", None)
IDS = RecallIds(b"bench-archive-namespace-key")  # the key a namespace's ids are made with


def tool_result(index: int) -> dict[str, Any]:
    lines = [
        f"{index:05d}:{n:03d} ok   src/module_{n % 17}.py  {n * 7 % 1000} ms" for n in range(40)
    ]
    if index % 50 == 7:
        lines.insert(
            20, f"FACT-{index:05d}: the deploy token for shard {index} is TOKEN-{index * 31}"
        )
    return {"role": "tool", "tool_call_id": f"call_{index}", "content": "\n".join(lines)}


def run_of(size: int) -> Archived:
    originals = {IDS.original(m): m for m in (tool_result(i) for i in range(size))}
    ids = tuple(originals)
    span = IDS.span(ids, "summary")
    return Archived(originals, {span: ids}, (*ids, span))


async def timed(runs: int, work: Callable[[], Awaitable[Any]]) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def measure(name: str, store: CheckpointStore, sizes: list[int], runs: int) -> list[str]:
    tokens = TokenizerProvider(EncodingLoader()).get("o200k_base")
    archive = Archive(store, SETTINGS)
    desk = RecallDesk(archive, SETTINGS, tokens.count_text)
    rows = []
    for size in sizes:
        run = run_of(size)
        keep = await timed(runs, lambda run=run: archive.keep(NS, run))
        index = merged_index(None, run, SETTINGS.max_archive_bytes)
        allowed = frozenset(entry[0] for entry in index)
        one = next(iter(run.originals))
        (span,) = run.spans
        calls = {
            "one id": RecallCall("c", orjson.dumps({"ids": [one]}).decode()),
            "the span": RecallCall("c", orjson.dumps({"ids": [span]}).decode()),
            "query": RecallCall("c", '{"query": "deploy token shard 1007"}'),
        }
        answers = {
            label: await timed(runs, lambda call=call: desk.answer(NS, allowed, call))
            for label, call in calls.items()
        }
        index_bytes = sum(entry[1] for entry in index)
        rows.append(
            f"| {name} | {size} | {index_bytes / 1024:.0f} KiB | {len(index)} | {keep:.1f} | "
            f"{answers['one id']:.1f} | {answers['the span']:.1f} | {answers['query']:.1f} |"
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--redis", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = [
        "| store | originals | archive (index bytes) | index entries | keep ms | "
        "recall one id ms | recall the span ms (paged) | query ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as directory:
        stores: list[tuple[str, CheckpointStore]] = [
            ("memory", MemoryStore(max_entries=100_000)),
            ("sqlite", SqliteStore(Path(directory) / "checkpoints.db")),
        ]
        if args.redis:
            stores.append(("redis", RedisStore(args.redis)))
        for name, store in stores:
            lines.extend(await measure(name, store, sizes, args.runs))
            await store.close()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    asyncio.run(main())
