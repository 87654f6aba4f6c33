"""A single-task agent loop whose summarizer writes prose and copies no exact string: how many
of the folded steps' paths, commands, exit codes, error lines and numbers are still in the
request forwarded at the end, with the ledger on and off (docs/compaction.md, "The ledger").

    python -m bench.ledger_loop [--steps 120] [--window 16000]

In process, through the core's real pipeline (the default pipeline, summarization on, recall
on): each request is the previous forwarded request plus the next step, as a client served
from checkpoints sees it. Each step runs a distinct command whose output holds an error line,
a path, a number with its unit and an exit code; the summarizer answers the same plausible
prose every time. A string counts when it is anywhere in the last forwarded request; what the
ledger's share left out is counted from the report's warnings and looked up in what the runs
archived (what recall would answer). Deterministic; a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionSettings,
    ModelFacts,
    SummarizationSettings,
    SummaryRequest,
    build_pipeline,
    compact_async,
)
from compaction_proxy.compaction.archive import RecallIds
from compaction_proxy.compaction.tokenizer_provider import TokenizerProvider

PROSE = (
    "Goal: get the test suite green. Progress: investigated several failures, edited the "
    "database layer and re-ran the tests; some still fail. Next: keep fixing the remaining "
    "failures and re-run the suite."
)


class Prose:
    """A summarizer that writes plausible prose and copies no exact string."""

    calls = 0

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        return PROSE


def step(n: int) -> list[dict[str, Any]]:
    args = json.dumps({"command": f"pytest -q tests/test_mod{n}.py -k case{n}"})
    output = (
        f"{'log line ' * 120}\n"
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}\n"
        f"src/app/mod{n}.py:{10 + n}: in handler{n}\n"
        f"handler{n} took {n + 0.5} s\nexit code {n % 3 + 1}"
    )
    call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": args}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": output},
    ]


def must_keep(n: int) -> list[str]:
    return [
        f"pytest -q tests/test_mod{n}.py -k case{n}",
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}",
        f"src/app/mod{n}.py",
        f"handler{n} took {n + 0.5} s",
        f"exit code {n % 3 + 1}",
    ]


def run(steps: int, window: int, ledger: bool) -> dict[str, Any]:
    tokenizer = TokenizerProvider()
    pipeline = build_pipeline(
        CompactionSettings(ledger={"enabled": ledger}), SummarizationSettings(enabled=True)
    )
    summarizer = Prose()
    sent: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests. Never push to main."},
    ]
    results: list[Any] = []
    archive: list[str] = []
    left_out = 0
    for n in range(steps):
        new = step(n)
        results.append(new[1])
        request = CompactionRequest(
            [*sent, *new],
            model="agent",
            pipeline=pipeline,
            tokenizer=tokenizer,
            facts=ModelFacts(window, 0),
            recall=RecallIds(b"bench-ledger-loop"),
        )
        result = asyncio.run(compact_async(request, summarizer=summarizer))
        sent = list(result.messages)
        for warning in result.report.warnings:
            if warning.startswith("ledger: ") and "left out" in warning:
                left_out += int(warning.split()[1])
        if result.archived is not None:
            archive.extend(json.dumps(m) for m in result.archived.originals.values())
    forwarded = json.dumps(sent, ensure_ascii=False)
    present = {id(m) for m in sent}
    folded = [n for n in range(steps) if id(results[n]) not in present]
    wanted = [s for n in folded for s in must_keep(n)]
    kept = [s for s in wanted if s in forwarded]
    blob = "\n".join(archive)
    missing = [s for s in wanted if s not in forwarded]
    return {
        "ledger": ledger,
        "summaries": summarizer.calls,
        "folded steps": len(folded),
        "strings": len(wanted),
        "forwarded": len(kept),
        "share": round(100 * len(kept) / max(1, len(wanted)), 1),
        "left out (reported)": left_out,
        "missing, in the archive": sum(1 for s in missing if json.dumps(s)[1:-1] in blob),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ledger_loop")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--window", type=int, default=16_000)
    args = parser.parse_args(argv)
    for ledger in (True, False):
        print(json.dumps(run(args.steps, args.window, ledger)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
