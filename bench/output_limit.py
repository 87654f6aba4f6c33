"""What writing a lowered output limit into the client's bytes costs.

When the compacted prompt plus the request's ``max_tokens`` would not fit the window, the proxy
forwards the limit lowered (compaction_proxy/compaction/budget.py, ``Budget.output_limit``). On
a request compaction left alone that is the one change: the body goes as the client's bytes
with only the limit's value replaced (``ClientBody.with_members``), which costs the scan of the
body's top-level members (compaction_proxy/wire/_jsonspans.py) where the client's bytes alone
cost nothing. This times that splice on agent-session bodies (bench/agent_bodies.py) with
``max_tokens: 32000``, for two spellings of the same body:

* ``compact``: what the SDKs send (the messages are recognised by one comparison);
* ``indented``: the same body pretty-printed (every element found by the regular-expression
  scan).

Thread CPU time, median over the runs, in µs; a fresh ``ClientBody`` each run (the scan
included).

    python -m bench.output_limit [--sizes 8k,32k,128k,500k] [--runs 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import orjson

from bench.agent_bodies import SIZES, SessionBodies, agent_session, tokenizers


def _cpu_us(raw: bytes, data: dict[str, object]) -> tuple[float, bytes]:
    from compaction_proxy.wire import ClientBody

    start = time.thread_time_ns()
    out = ClientBody(raw, data, "messages").with_members({"max_tokens": 21_130})
    return (time.thread_time_ns() - start) / 1e3, out


def _rows(size: str, runs: int) -> list[tuple[str, str, int, float]]:
    tok = tokenizers().get("o200k_base")
    bodies = SessionBodies.build(agent_session(SIZES[size], tok), "m", {"max_tokens": 32_000})
    compact = bodies.body(0)
    rows = []
    for spelling, raw in (
        ("compact", compact),
        ("indented", json.dumps(orjson.loads(compact), indent=1).encode()),
    ):
        data = orjson.loads(raw)
        times = []
        for _ in range(runs):
            took, out = _cpu_us(raw, data)
            times.append(took)
        assert orjson.loads(out) == {**data, "max_tokens": 21_130}
        assert out.replace(b"21130", b"32000", 1) == raw, "a byte other than the limit changed"
        rows.append((size, spelling, len(raw), statistics.median(times)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8k,32k,128k,500k")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        rows.extend(_rows(size, args.runs))
        print(size, "done", file=sys.stderr)
    lines = [
        "# Writing a lowered output limit into the client's bytes",
        "",
        f"Command: `python -m bench.output_limit {' '.join(argv or sys.argv[1:])}`; thread CPU "
        f"µs, median over {args.runs} runs, a fresh `ClientBody` each (its scan included).",
        "",
        "| size | spelling | body bytes | with_members µs |",
        "|---|---|---:|---:|",
        *(f"| {s} | {sp} | {n:,} | {t:.0f} |" for s, sp, n, t in rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
