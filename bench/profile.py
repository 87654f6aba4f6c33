"""Sample the proxy with py-spy while it serves concurrency-16 load, and say where time goes.

Why: throughput tables tell you *that* the proxy is slower than direct; this tells you *which
code* to change. The proxy runs pinned to core 0 exactly as in bench.gateway; the mock, the
load generator and py-spy share core 1. py-spy samples from outside the process (no code
changes, low distortion), so the profile describes the real server.

Run: python -m bench.profile [--transport aiohttp|httpx] [--mode json|sse] [--seconds 10]
                            [--session 8k|32k|128k|500k [--checkpoint]] [--concurrency 16]
Needs `py-spy` (pip install py-spy) and ptrace permission; uses `hey` for load if installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.gateway import proxy_config
from bench.harness import (
    CLIENT_CPU,
    KEY,
    MESSAGES,
    PROXY_CPU,
    PY,
    REPO,
    Target,
    free_port,
    pinned,
    start,
    stop,
    wait_ready,
)

OWN = "(compaction_proxy/"
"""How py-spy names a frame of the proxy's own package (the key of the own-code tables)."""
RATE = 250
"""py-spy samples per second (`-r`): a sample stands for 1/RATE s of one thread's time."""

BUCKETS = [  # first match wins; keys are substrings of py-spy's "func (file:line)" frames
    # Native frames (--native): where C and Rust code spends the time.
    ("cyclic GC (CPython)", "gc_collect"),
    ("orjson (C)", "(orjson/"),
    ("tiktoken (Rust)", "tiktoken"),
    ("hashlib / blake2b (C)", "blake2"),
    ("proxy (own code)", OWN),
    ("httpx client layer", "(httpx/"),
    ("httpx-aiohttp adapter", "(httpx_aiohttp/"),
    ("aiohttp client", "(aiohttp/"),
    ("httpcore/anyio (httpx's own transport)", "(httpcore/"),
    ("httpcore/anyio (httpx's own transport)", "(anyio/"),
    ("logging (stdlib)", "(logging/"),
    ("uvicorn/httptools server", "(uvicorn/"),
    ("asyncio/uvloop loop", "(asyncio/"),
]


def parse_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy `--format raw` is collapsed stacks: 'root;...;leaf count' per line."""
    rows = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            rows.append((stack.split(";"), int(count)))
    return rows


def bucket(frame: str) -> str:
    return next((name for name, key in BUCKETS if key in frame), "other (stdlib, uuid, ...)")


IDLE_WAITS = ("_worker (concurrent/futures/thread.py:", "epoll_wait", "epoll_pwait")
"""A sample whose innermost Python frame is a thread-pool worker waiting for work (the
compaction and SQLite threads between jobs), or whose native leaf is the loop's epoll wait,
is idle: py-spy still records such threads."""


def idle(frames: list[str]) -> bool:
    python = [f for f in frames if ".py:" in f]
    return frames[-1].startswith(IDLE_WAITS[1:]) or (
        bool(python) and python[-1].startswith(IDLE_WAITS[0])
    )


def function(frame: str) -> str:
    """A frame without its line number: ``func (file:line)`` -> ``func (file)``."""
    head, _, where = frame.rpartition(" (")
    return f"{head} ({where.rsplit(':', 1)[0]}" + (")" if ":" in where else "")


def report(
    rows: list[tuple[list[str], int]], title: str, top: int = 15, requests: float = 0.0
) -> str:
    waiting = sum(n for frames, n in rows if idle(frames))
    rows = [(frames, n) for frames, n in rows if not idle(frames)]
    total = sum(n for _, n in rows) or 1
    self_frames: Counter[str] = Counter()
    by_bucket: Counter[str] = Counter()
    own_inclusive: Counter[str] = Counter()
    own_functions: Counter[str] = Counter()
    for frames, n in rows:
        self_frames[frames[-1]] += n
        by_bucket[bucket(frames[-1])] += n
        for f in set(frames):
            if (
                OWN in f
                and "compaction_proxy/cli.py" not in f
                and "compaction_proxy/__main__" not in f
            ):
                own_inclusive[f] += n
        for f in {function(f) for f in frames if OWN in f}:
            if "compaction_proxy/cli.py" not in f and "compaction_proxy/__main__" not in f:
                own_functions[f] += n

    def table(header: str, counter: Counter[str]) -> list[str]:
        out = [f"| {header} | % of samples |", "|---|---|"]
        out += [f"| `{k}` | {100 * v / total:.1f} |" for k, v in counter.most_common(top)]
        return out + [""]

    return "\n".join(
        [
            f"# {title}",
            "",
            f"{total} busy samples ({waiting} idle ones left out: thread-pool workers "
            "waiting for work, the loop waiting in epoll); percentages are of busy samples.",
            "",
            "## Self time by layer",
            "",
            *table("layer", by_bucket),
            "## Hottest frames (self time)",
            "",
            *table("frame", self_frames),
            "## Proxy code lines (inclusive: the line and everything it calls)",
            "",
            *table("frame", own_inclusive),
            *per_request(own_functions, requests, top),
        ]
    )


def per_request(functions: Counter[str], requests: float, top: int) -> list[str]:
    """The proxy's functions by inclusive CPU µs per request (busy samples / RATE / requests).

    Only with a request count (the load's RPS times the sampled seconds); under py-spy the
    figures are a little above an unsampled run's, and their ranking is what to read.
    """
    if requests <= 0:
        return []
    out = [
        "## Proxy functions (inclusive), CPU µs per request",
        "",
        f"Over ~{requests:.0f} requests sampled at {RATE} Hz.",
        "",
        "| function | µs per request |",
        "|---|---:|",
    ]
    out += [f"| `{k}` | {v / RATE / requests * 1e6:.0f} |" for k, v in functions.most_common(top)]
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["aiohttp", "httpx"], default="aiohttp")
    parser.add_argument("--mode", choices=["json", "sse"], default="json")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--log-level", choices=["warning", "info"], default="warning")
    parser.add_argument("--out", help="also write the markdown here")
    parser.add_argument(
        "--session",
        choices=["8k", "32k", "128k", "500k"],
        help="agent-session bodies of this size (bench/agent_bodies.py) instead of the 1 KB body",
    )
    parser.add_argument(
        "--checkpoint", action="store_true", help="--session: every request hits a checkpoint"
    )
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native: C and Rust frames too (GC, orjson)"
    )
    args = parser.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not Path(pyspy).exists():
        sys.exit("py-spy not found: pip install py-spy")

    tmp = Path(tempfile.mkdtemp(prefix="bench-prof-"))
    body = tmp / "body.json"
    extra = ', "stream": true' if args.mode == "sse" else ""
    import json

    body.write_text('{"model": "mock-gpt", "messages": ' + json.dumps(MESSAGES) + extra + "}")
    mock_port, proxy_port = free_port(), free_port()
    env: dict[str, str] = {}
    if args.session:
        session_file, cfg, env = _session_setup(args, tmp, mock_port)
    else:
        cfg = proxy_config(tmp / "proxy.yaml", mock_port, args.transport, args.log_level)
    mock = Target(
        "mock",
        f"http://127.0.0.1:{mock_port}",
        "/health",
        pinned(CLIENT_CPU, [PY, "-m", "bench.mock_upstream", "--port", str(mock_port)]),
    )
    proxy = Target(
        "proxy",
        f"http://127.0.0.1:{proxy_port}",
        "/healthz",
        pinned(
            PROXY_CPU,
            [
                PY,
                "-m",
                "compaction_proxy",
                "serve",
                "--config",
                str(cfg),
                "--port",
                str(proxy_port),
            ],
        ),
        env=env,
    )
    raw = tmp / "profile.raw"
    try:
        for t in (mock, proxy):
            start(t, tmp / f"{t.name}.log")
            wait_ready(t, 30)
        load_seconds = args.seconds + 4  # load runs before and after the sampling window
        if args.session:
            if args.checkpoint:
                _prime(proxy.url, session_file, args.concurrency)
            load = [
                PY,
                "-m",
                "bench.loadgen",
                "--target",
                f"proxy={proxy.url}",
                "--session-file",
                str(session_file),
                "--cycle",
                "1",
                "-c",
                str(args.concurrency),
                "-z",
                str(load_seconds),
                "-H",
                f"Authorization: Bearer {KEY}",
            ]
        elif shutil.which("hey"):
            load = [
                "hey",
                "-z",
                f"{load_seconds}s",
                "-c",
                str(args.concurrency),
                "-m",
                "POST",
                "-T",
                "application/json",
                "-H",
                f"Authorization: Bearer {KEY}",
                "-D",
                str(body),
                proxy.url,
            ]
        else:
            load = [
                PY,
                "-m",
                "bench.loadgen",
                "--target",
                f"proxy={proxy.url}",
                "--body-file",
                str(body),
                "-c",
                str(args.concurrency),
                "-z",
                str(load_seconds),
                "-H",
                f"Authorization: Bearer {KEY}",
            ]
        driver = subprocess.Popen(
            pinned(CLIENT_CPU, load), cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert proxy.proc is not None
        # `taskset` execs the proxy, so the pid we started is the Python process itself.
        subprocess.run(
            pinned(
                CLIENT_CPU,
                [
                    pyspy,
                    "record",
                    "-p",
                    str(proxy.proc.pid),
                    "-d",
                    str(int(args.seconds)),
                    "-r",
                    str(RATE),
                    *(["--native"] if args.native else []),
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                ],
            ),
            check=True,
            capture_output=True,
        )
        load_out = driver.communicate()[0]
    finally:
        for t in (proxy, mock):
            stop(t)
    rps = next((line.strip() for line in load_out.splitlines() if "Requests/sec" in line), "")
    what = (
        f"agent session {args.session}{' with checkpoint hits' if args.checkpoint else ''}"
        if args.session
        else f"{args.transport} transport, {args.mode}, log {args.log_level}"
    )
    match = re.search(r"([\d.]+)", rps)
    text = report(
        parse_raw(raw),
        f"Proxy profile: {what}, c={args.concurrency} ({rps or 'see loadgen output'})",
        top=25,
        requests=float(match.group(1)) * int(args.seconds) if match else 0.0,
    )
    print(text)
    if args.out:
        (REPO / args.out).write_text(text)
    print(f"# raw stacks: {raw}", file=sys.stderr)


def _session_setup(
    args: argparse.Namespace, tmp: Path, mock_port: int
) -> tuple[Path, Path, dict[str, str]]:
    """The session file, the proxy's config and its environment for ``--session``."""
    from bench.agent_bodies import SIZES, SessionBodies, agent_session, tokenizers
    from bench.gateway_agent import (
        PLAIN_MODEL,
        PLAIN_WINDOW,
        ckpt_model,
        ckpt_window,
    )
    from bench.gateway_agent import proxy_config as agent_config

    provider = tokenizers()
    session = agent_session(SIZES[args.session], provider.get("o200k_base"))
    model = ckpt_model(args.session) if args.checkpoint else PLAIN_MODEL
    windows = {
        PLAIN_MODEL: PLAIN_WINDOW,
        ckpt_model(args.session): ckpt_window(session.base_tokens),
    }
    session_file = tmp / "session.json"
    SessionBodies.build(session, model).to_file(session_file)
    cfg = agent_config(tmp / "proxy.yaml", mock_port, tmp / "store.db", windows)
    env = {}
    if provider.loader.directories:
        env["TIKTOKEN_CACHE_DIR"] = str(provider.loader.directories[0])
    return session_file, cfg, env


def _prime(url: str, session_file: Path, workers: int) -> None:
    from bench.agent_bodies import SessionBodies
    from bench.gateway_agent import post

    bodies = SessionBodies.from_file(session_file)
    for worker in range(workers):
        post(url, bodies.base(worker))


if __name__ == "__main__":
    main()
