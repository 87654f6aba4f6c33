"""Closed-loop HTTP load generator in Python (aiohttp), with per-request latency capture.

Why it exists: the benchmark must run with nothing but pip packages, and the c=1 overhead
numbers need per-request timings (time to first body byte and total) that `hey` does not
give at sub-millisecond resolution. It runs in its own process (the caller pins it with
`taskset`). Honest limit: a single Python process tops out near ~1k RPS on one core, so use
`hey` for throughput whenever it is installed.

Several targets are measured in interleaved rounds (round 1: A, B, C; round 2: A, B, C; ...)
so slow drift on a noisy machine hits every target alike. Warm-up requests are discarded.

With `--session-file` (bench/agent_bodies.py) each worker sends an agent session instead of one
fixed body: the same conversation plus one more tool step per request, the way agents send.

Run: python -m bench.loadgen --target direct=http://127.0.0.1:18080/v1/chat/completions \
        (--body-file body.json | --session-file session.json) -c 1 -n 200 --rounds 5 --warmup 50
Prints one JSON object: {target_name: summary} (milliseconds; `sent` counts every request,
warm-up included, and `mean_body_bytes` their mean size).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from bench.agent_bodies import SessionBodies


@dataclass
class Samples:
    total_ms: list[float] = field(default_factory=list)
    ttfb_ms: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0  # wall time spent measuring, for RPS


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summarize(s: Samples) -> dict[str, float]:
    n = len(s.total_ms)
    return {
        "n": n,
        "errors": s.errors,
        "rps": n / s.seconds if s.seconds else 0.0,
        "p50": percentile(s.total_ms, 50),
        "p99": percentile(s.total_ms, 99),
        "ttfb_p50": percentile(s.ttfb_ms, 50),
        "ttfb_p99": percentile(s.ttfb_ms, 99),
        # SSE sanity check: every target must deliver the same number of `data:` events.
        "events": statistics.median(s.events) if s.events else 0,
    }


async def one_request(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], out: Samples
) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as response:
            first = await response.content.readany()
            ttfb = time.perf_counter()
            rest = await response.read()
            end = time.perf_counter()
            if response.status != 200:
                out.errors += 1
                return
    except (TimeoutError, aiohttp.ClientError):
        out.errors += 1
        return
    out.total_ms.append((end - start) * 1000)
    out.ttfb_ms.append((ttfb - start) * 1000)
    out.events.append((first + rest).count(b"data:"))


async def run_batch(
    session: aiohttp.ClientSession,
    url: str,
    body: BodySource,
    headers: dict[str, str],
    concurrency: int,
    *,
    requests: int | None,
    duration: float | None,
    out: Samples,
) -> None:
    """`concurrency` workers loop until `requests` are done or `duration` has passed."""
    remaining = requests
    deadline = time.perf_counter() + duration if duration else None

    async def worker(index: int) -> None:
        nonlocal remaining
        while True:
            if remaining is not None:
                if remaining <= 0:
                    return
                remaining -= 1
            if deadline is not None and time.perf_counter() >= deadline:
                return
            await one_request(session, url, body.next(index), headers, out)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    out.seconds += time.perf_counter() - start


class BodySource:
    """The body of each request: one fixed body, or an agent session per worker.

    A session (bench/agent_bodies.py) sends, per worker, the base conversation plus one more
    step per request; each target gets its own source, so every target sees the same sequence.
    The body is built before the request's clock starts.
    """

    def __init__(
        self, fixed: bytes | None = None, session: SessionBodies | None = None, cycle: int = 0
    ) -> None:
        self.fixed = fixed
        self.session = session
        self.cycle = cycle
        self.sent: dict[int, int] = {}
        self.bytes = 0
        self.count = 0

    def next(self, worker: int) -> bytes:
        if self.session is None:
            assert self.fixed is not None
            body = self.fixed
        else:
            request = self.sent.get(worker, 0)
            self.sent[worker] = request + 1
            body = self.session.body(request, worker, self.cycle)
        self.bytes += len(body)
        self.count += 1
        return body


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    fixed = Path(args.body_file).read_bytes() if args.body_file else None
    files = dict(t.split("=", 1) for t in args.target_session)
    if args.session_file:
        files = {name: args.session_file for name, _ in (t.split("=", 1) for t in args.target)}
        files.update(dict(t.split("=", 1) for t in args.target_session))
    loaded: dict[str, SessionBodies] = {}
    if files:
        from bench.agent_bodies import SessionBodies  # only here: it imports the proxy's core

        for file in set(files.values()):
            loaded[file] = SessionBodies.from_file(Path(file))
    headers = {"content-type": "application/json"}
    for raw in args.header:
        name, _, value = raw.partition(":")
        headers[name.strip()] = value.strip()
    targets = [t.split("=", 1) for t in args.target]
    results = {name: Samples() for name, _ in targets}
    sources = {
        name: BodySource(fixed, loaded[files[name]] if name in files else None, args.cycle)
        for name, _ in targets
    }
    timeout = aiohttp.ClientTimeout(total=300)
    # One session (and keep-alive pool) per target, like a real client talking to one host.
    sessions = {
        name: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.concurrency), timeout=timeout
        )
        for name, _ in targets
    }
    try:
        for name, url in targets:
            await run_batch(
                sessions[name],
                url,
                sources[name],
                headers,
                args.concurrency,
                requests=args.warmup,
                duration=None,
                out=Samples(),
            )
        for _ in range(args.rounds):
            for name, url in targets:
                await run_batch(
                    sessions[name],
                    url,
                    sources[name],
                    headers,
                    args.concurrency,
                    requests=args.requests,
                    duration=args.duration,
                    out=results[name],
                )
    finally:
        for session in sessions.values():
            await session.close()
    out = {}
    for name, s in results.items():
        summary = summarize(s)
        source = sources[name]
        # Every request sent (warm-up included): the driver divides process CPU time by it.
        summary["sent"] = source.count
        summary["mean_body_bytes"] = source.bytes / source.count if source.count else 0.0
        out[name] = summary
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop aiohttp load generator")
    parser.add_argument("--target", action="append", required=True, help="name=url (repeatable)")
    parser.add_argument("--body-file", help="one body, sent on every request")
    parser.add_argument(
        "--session-file",
        help="agent-session bodies (bench/agent_bodies.py), one session per worker",
    )
    parser.add_argument(
        "--target-session",
        action="append",
        default=[],
        help="name=file: this target's own session file (another model, say)",
    )
    parser.add_argument(
        "--cycle", type=int, default=0, help="session: first cycle (a new run sends new steps)"
    )
    parser.add_argument("-H", "--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-n", "--requests", type=int, help="requests per target per round")
    parser.add_argument("-z", "--duration", type=float, help="seconds per target per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=20, help="discarded requests per target")
    args = parser.parse_args()
    if (args.requests is None) == (args.duration is None):
        parser.error("give exactly one of -n/--requests and -z/--duration")
    named = {t.split("=", 1)[0] for t in args.target_session}
    if (
        args.body_file is None
        and args.session_file is None
        and named != {t.split("=", 1)[0] for t in args.target}
    ):
        parser.error("give --body-file, --session-file or a --target-session for every target")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    json.dump(asyncio.run(run(args)), sys.stdout)
    print()


if __name__ == "__main__":
    main()
