"""What reporting a checkpoint hit in the client's terms costs, on a ~128k-token conversation.

    python -m bench.hit_report [--tokens 128000] [--rounds 200] [--out bench/results/hit-report.md]

On a hit the proxy reports ``X-Compaction-Tokens-Before`` as the client's whole request
(compaction_proxy/engine/_hit_report.py). It gets the figure from the checkpoint's ``folded_tokens`` meta
(one addition); a checkpoint stored before that meta existed is counted the slow way (every
covered message through the tokenizer, on a worker thread). Measured here, per request, in
process (no HTTP):

* ``as_sent`` with the meta (what every hit pays);
* ``as_sent`` without it, the tokenizer's count cache warm (a repeat hit on an old checkpoint);
* the same, the count cache cold (the first hit on it, or after the LRU evicted the messages);
* for scale: the whole hit request through ``CompactionFlow.run`` (lookup, pipeline on the
  checkpoint view), and a naive re-count of the client's whole request, warm and cold.

Timings are medians of ``--rounds`` runs on one core of a shared machine: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.conversations import conversation, next_turn
from compaction_proxy.checkpoints import MemoryStore, scope_of
from compaction_proxy.compaction import Mode
from compaction_proxy.config import Settings
from compaction_proxy.engine import CompactionFlow, Compactor, FlowRequest, build_flow
from compaction_proxy.engine._hit_report import as_sent

MODEL = "bench-model"


def _settings() -> Settings:
    return Settings.model_validate(
        {
            "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
            "models": {MODEL: {"context_window": 200_000, "max_output_tokens": 4_096}},
            "compaction": {
                "pipeline": [
                    {
                        "strategy": "sliding_window",
                        "trigger": {"tokens_exceed": 100_000},
                        "keep_last_turns": 3,
                    }
                ]
            },
            "summarization": {"enabled": False},
        }
    )


def _sized(compactor: Compactor, tokens: int) -> tuple[int, list[dict[str, Any]]]:
    """The smallest bench conversation of at least ``tokens`` tokens (our count)."""
    size = 100
    while True:
        messages = conversation(size)
        counted = compactor.run_sync({"model": MODEL, "messages": messages}, Mode.DRY_RUN)
        if counted.report.tokens_before >= tokens:
            return size, messages
        size += 20


async def _median(action: Callable[[], Awaitable[Any]], rounds: int, before: Any = None) -> float:
    samples = []
    for _ in range(rounds):
        if before is not None:
            before()
        started = time.perf_counter()
        await action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def run(tokens: int, rounds: int) -> dict[str, Any]:
    settings = _settings()
    compactor = Compactor(settings)
    client = httpx.AsyncClient()
    flow: CompactionFlow = build_flow(settings, compactor, MemoryStore(), client)
    size, first = _sized(compactor, tokens)
    data = {"model": MODEL, "messages": first}
    made = await flow.run(
        FlowRequest(
            data, Mode.NORMAL, size_hint=0, credential="k", caller_key=None, upstream_name="up"
        )
    )
    assert made.checkpoint == "new" and made.save is not None
    assert await made.save() is None
    messages = first + next_turn(size)
    hit_data = {"model": MODEL, "messages": messages}

    async def hit_request() -> Any:
        return await flow.run(
            FlowRequest(
                hit_data,
                Mode.NORMAL,
                size_hint=0,
                credential="k",
                caller_key=None,
                upstream_name="up",
            )
        )

    hit = await hit_request()
    assert hit.checkpoint == "hit"
    namespace = flow.namespace(MODEL, "k", scope=scope_of(hit_data))
    assert flow.checkpoints is not None
    lookup = await flow.checkpoints.lookup(namespace, messages)
    assert lookup.checkpoint is not None and lookup.folded_tokens is not None
    view = await compactor.run({**hit_data, "messages": lookup.messages}, Mode.NORMAL, size_hint=0)
    old = replace(lookup, checkpoint=replace(lookup.checkpoint, meta={}))
    tokenizer = compactor.tokenizers.get(compactor.catalog.facts_for(MODEL).encoding)

    def cold() -> None:
        tokenizer.cache.clear()  # type: ignore[attr-defined]

    async def recount() -> int:
        return sum(tokenizer.count_message(m) for m in messages)

    honest = (await as_sent(view, messages, lookup, compactor)).report.tokens_before
    slow = (await as_sent(view, messages, old, compactor)).report.tokens_before
    full = await recount()
    figures = {
        "size": size,
        "messages": len(messages),
        "client_tokens": honest,
        "view_tokens": view.report.tokens_before,
        "covered": lookup.covered,
        "exact": honest == slow == hit.result.report.tokens_before,
        "recount_messages_only": full,
        "with_meta": await _median(lambda: as_sent(view, messages, lookup, compactor), rounds),
        "no_meta_warm": await _median(lambda: as_sent(view, messages, old, compactor), rounds),
        "no_meta_cold": await _median(
            lambda: as_sent(view, messages, old, compactor), max(5, rounds // 20), cold
        ),
        "recount_warm": await _median(recount, rounds),
        "recount_cold": await _median(recount, max(5, rounds // 20), cold),
    }
    await hit_request()  # the cache is warm again for the whole-request figure
    figures["hit_request"] = await _median(hit_request, max(20, rounds // 5))
    await client.aclose()
    compactor.close()
    return figures


def report(figures: dict[str, Any], rounds: int) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"

    hit = figures["hit_request"]
    rows = [
        ("`as_sent`, checkpoint with `folded_tokens` (every hit)", figures["with_meta"]),
        ("`as_sent`, old checkpoint, count cache warm", figures["no_meta_warm"]),
        ("`as_sent`, old checkpoint, count cache cold", figures["no_meta_cold"]),
        ("naive re-count of the client's messages, cache warm", figures["recount_warm"]),
        ("naive re-count of the client's messages, cache cold", figures["recount_cold"]),
        ("the whole hit through `CompactionFlow.run` (for scale)", hit),
    ]
    lines = [
        "# Reporting a checkpoint hit in the client's terms",
        "",
        f"`python -m bench.hit_report --rounds {rounds}` on "
        f"{dt.date.today().isoformat()}, Python {platform.python_version()}, "
        f"{platform.machine()}; medians, in process.",
        "",
        f"The hit request: {figures['messages']:,} messages, "
        f"**{figures['client_tokens']:,} tokens** as the client sent them "
        f"(X-Compaction-Tokens-Before), {figures['view_tokens']:,} in the checkpoint view "
        f"(what the header said before), the checkpoint standing for {figures['covered']:,} "
        f"messages. Meta, slow path and the flow agree: {figures['exact']}.",
        "",
        "| what | per request | share of the hit |",
        "|---|---:|---:|",
        *(f"| {name} | {us(t)} | {100 * t / hit:.2f}% |" for name, t in rows),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = report(asyncio.run(run(args.tokens, args.rounds)), args.rounds)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
