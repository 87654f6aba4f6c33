"""What the Responses adapter adds to a request: items -> chat view -> items, no network.

    python -m bench.responses_adapter [--steps 50 200 800] [--repeat 20]

A stateless Responses agent session (one task, then per step a reasoning item, two parallel
function calls and their outputs, a ~3,000-character output every other step) of each size is
checked (``validate_request``), shown to the core (``lift``), compacted by the default pipeline on a 32k window (counts warm,
as on every request after the first), and mapped back (``lower``): the median of each part, so
the adapter's share of a request's compaction time is visible. Also the mapping back of a
request whose messages come from a checkpoint (matched by canonical bytes, not identity).

No timing is asserted anywhere; figures are reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from compaction_proxy.compaction import (
    CompactionRequest,
    EncodingLoader,
    ModelFacts,
    TokenizerProvider,
    build_pipeline,
    compact,
)
from compaction_proxy.compaction.settings import CompactionSettings, SummarizationSettings
from compaction_proxy.wire.responses import lift, lower, validate_request


def session(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing parser tests"}]
    for n in range(steps):
        items.append(
            {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "g" * 600}
        )
        for k in range(2):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}_{k}",
                    "call_id": f"call_{n}_{k}",
                    "name": "read_file",
                    "arguments": orjson.dumps({"path": f"src/m{n}_{k}.py"}).decode(),
                    "status": "completed",
                }
            )
        for k in range(2):
            size = 3_000 if n % 2 == 0 and k == 0 else 120
            text = "".join(f"line {i} of step {n}\n" for i in range(size // 18))[:size]
            items.append(
                {"type": "function_call_output", "call_id": f"call_{n}_{k}", "output": text}
            )
    return items


def median_ms(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[50, 200, 800])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    provider = TokenizerProvider(EncodingLoader())
    pipeline = build_pipeline(CompactionSettings(), SummarizationSettings(enabled=False))
    facts = ModelFacts(context_window=32_000, max_output_tokens=2_000)
    print(
        "| steps | items | validate ms | lift ms | compact ms | lower ms "
        "| lower from a checkpoint ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for steps in args.steps:
        body = {"model": "gpt-4o", "input": session(steps)}
        lifted = lift(body)

        def run_compact(messages: list[dict[str, Any]] = lifted.messages) -> Any:
            request = CompactionRequest(
                messages, model="gpt-4o", pipeline=pipeline, tokenizer=provider, facts=facts
            )
            return compact(request)

        result = run_compact()  # warms the count cache, as earlier requests would have
        stored = orjson.loads(orjson.dumps(lifted.messages))
        row = (
            median_ms(args.repeat, lambda: validate_request(body)),
            median_ms(args.repeat, lambda: lift(body)),
            median_ms(args.repeat, run_compact),
            median_ms(args.repeat, lambda: lower(lifted, result.messages)),
            median_ms(args.repeat, lambda: lower(lifted, stored)),
        )
        cells = " | ".join(f"{value:.2f}" for value in row)
        print(f"| {steps} | {len(body['input'])} | {cells} |")


if __name__ == "__main__":
    main()
