"""`/healthz` latency from a second client while a ~500k-token agent body is compacted.

The second performance issue wants big bodies off the event loop: while one client's
500k-token request is compacted, how long does another client wait for ``GET /healthz``? Not a
test: it asserts nothing and writes a report for people to read.

Real processes on 127.0.0.1: bench.mock_upstream (canned replies, so the upstream costs next to
no CPU) and the proxy (``python -m compaction_proxy serve``) configured as ``bench.gateway
--agent`` configures it (SQLite checkpoints, summarization off, bench/gateway_agent.py
``proxy_config``). The bodies are 500k sessions of bench/agent_bodies.py (``--fresh`` of
them, seeds 0, 1, ...). Each request is sent by bench/hostile_load.py's ``measure``: a second
client asks ``/healthz`` on a kept-alive connection every 10 ms and the proxy's RSS is sampled
every 20 ms. A row's health figures are the samples sent while its requests were in flight
(sent to answered); ``idle`` is the same client with no request in flight.

Each model gets its own fresh proxy, and "first sight" is a session's base that proxy has
counted none of the messages of:

* nothing fires (window 4M tokens): each session's base on first sight, then requests that
  each add one tool step to seed 0's (every count cached but the new step's: the quiet check);
* fires (the window of bench.gateway --agent's checkpoint model, its trigger ~10 % under seed
  0's base): each session's base on first sight (compacted, stored as a checkpoint), seed 0's
  base under ``--repeat`` new task messages (no checkpoint to find: compacted again, its
  earlier turns' counts cached), then requests that extend the last one's checkpoint by one
  step (a checkpoint hit, nothing fires).

Calibration is off (``NO_CALIBRATION``): the mock's usage figures are not a count.

    python -m bench.healthz_during [--fresh 5] [--repeat 10] [--steps 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.agent_bodies import SIZES, SessionBodies, agent_session, tokenizers
from bench.gateway_agent import PLAIN_MODEL, PLAIN_WINDOW, ckpt_model, ckpt_window, proxy_config
from bench.harness import KEY, cpu_model, stamp
from bench.hostile_load import Run, measure, percentile, poll_health
from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import ProxyServer

SIZE = "500k"
IDLE_SECONDS = 2.0
STEP_SETTLE = 0.5  # seconds after a small step before the next (a fired body gets hostile_load's)
AUTH = {"Authorization": f"Bearer {KEY}"}
NO_CALIBRATION = {"COMPACTION_PROXY_COMPACTION__CALIBRATION__ENABLED": "false"}
"""The mock's usage is canned (42 prompt tokens): calibrating by it would scale every count
after the first 500k answer to half (the ratio's lower clamp), and the bases after the first
would no longer fire."""


@dataclass
class Row:
    name: str
    runs: list[Run]

    def health(self) -> list[float]:
        """The health samples sent while one of the row's requests was in flight."""
        return [
            ms
            for run in self.runs
            for at, ms in zip(run.health_at, run.health_ms, strict=False)
            if run.sent_at <= at <= run.answered_at
        ]


def idle(port: int) -> Run:
    """The health client alone for :data:`IDLE_SECONDS`: the floor the other rows sit on."""
    run = Run("idle", 0)
    stop = threading.Event()
    thread = threading.Thread(target=poll_health, args=(port, stop, run), daemon=True)
    run.sent_at = time.perf_counter()
    thread.start()
    time.sleep(IDLE_SECONDS)
    stop.set()
    thread.join(5)
    run.answered_at = time.perf_counter()
    return run


def nothing_fires(proxy: ProxyServer, sessions: list[SessionBodies], steps: int) -> list[Row]:
    """Each session's base, new to the proxy; then one-step requests extending the first's."""
    rest = idle(proxy.port)
    first = [measure(proxy, "first", bodies.base(1), headers=AUTH) for bodies in sessions]
    more = [
        measure(proxy, f"step {i}", sessions[0].body(i, 1), headers=AUTH, settle=STEP_SETTLE)
        for i in range(steps)
    ]
    return [
        Row("nothing fires: idle", [rest]),
        Row("nothing fires: a base, first sight", first),
        Row("nothing fires: one more step (counts cached)", more),
    ]


def fires(proxy: ProxyServer, sessions: list[SessionBodies], repeat: int, steps: int) -> list[Row]:
    """Each session's base, new to the proxy, fires; so does the first session's base under
    ``repeat`` other task messages (worker ``w``'s base is its own conversation to the
    checkpoints: it finds none, while its earlier turns' counts are cached); the steps extend
    the last one's checkpoint."""
    rest = idle(proxy.port)
    first = [measure(proxy, "first", bodies.base(1), headers=AUTH) for bodies in sessions]
    bodies = sessions[0]
    again = [
        measure(proxy, f"again {w}", bodies.base(w), headers=AUTH) for w in range(2, repeat + 2)
    ]
    hits = [
        measure(proxy, f"hit {i}", bodies.body(i, repeat + 1), headers=AUTH, settle=STEP_SETTLE)
        for i in range(steps)
    ]
    return [
        Row("fires: idle", [rest]),
        Row("fires: a base, first sight", first),
        Row("fires: a base under a new task (counts cached)", again),
        Row("checkpoint hit: one more step", hits),
    ]


def fresh_proxy(directory: Path, name: str, mock_port: int, windows: dict[str, int]) -> ProxyServer:
    config = proxy_config(directory / f"{name}.yaml", mock_port, directory / f"{name}.db", windows)
    proxy = ProxyServer(config, directory / f"{name}.log", env=NO_CALIBRATION)
    proxy.start()
    # The first request of a process pays for lazy set-up (the upstream pool): not a body's.
    measure(proxy, "warm-up", bodies_warm_up(), headers=AUTH, settle=STEP_SETTLE)
    return proxy


def bodies_warm_up() -> bytes:
    return b'{"model":"%s","messages":[{"role":"user","content":"hi"}]}' % PLAIN_MODEL.encode()


def _answers(runs: list[Run]) -> str:
    """Each distinct answer with how many requests got it, then the last one's token counts."""
    counts: dict[str, int] = {}
    for run in runs:
        h = run.headers
        key = (
            f"{run.status} {run.error_code}".strip()
            + f" `{h.get('x-compaction-checkpoint', '?')}` `{h.get('x-compaction-strategies', '?')}`"
        )
        counts[key] = counts.get(key, 0) + 1
    h = runs[-1].headers
    before, after = h.get("x-compaction-tokens-before", "?"), h.get("x-compaction-tokens-after")
    tokens = f"{before} → {after}" if after and after != before else before
    return "; ".join(f"{n}× {key}" for key, n in counts.items()) + f"; last: {tokens} tokens"


def _seconds(runs: list[Run]) -> str:
    values = [run.seconds for run in runs]
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} / {max(values):.3f}"


def render(
    rows: list[Row],
    sessions: list[SessionBodies],
    tokens: list[int],
    windows: dict[str, int],
    load: tuple[float, float],
    argv: list[str],
) -> str:
    lines = [
        f"# `/healthz` while a ~{SIZE}-token agent body is compacted",
        "",
        f"- Measured {stamp()}; {platform.machine()}, {os.cpu_count()} CPUs ({cpu_model()}), "
        "2 cores shared with other work and not pinned: figures from one run compare with "
        f"each other, not across runs. Load average (1 min) {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end.",
        "- Command (from the repository root): `python -m bench.healthz_during"
        + "".join(f" {a}" for a in argv)
        + "`",
        f"- Bodies: bench/agent_bodies.py's {SIZE} sessions, seeds 0-{len(sessions) - 1} "
        "(first sight: each seed's base; the other rows: seed 0), bases of "
        + ", ".join(f"{n:,}" for n in tokens)
        + " o200k tokens, "
        + ", ".join(f"{len(b.base()):,}" for b in sessions)
        + f" bytes; seed 0's one-step requests {sessions[0].mean_bytes():,} bytes on average "
        "over a fork.",
        f"- Windows: `{PLAIN_MODEL}` {windows[PLAIN_MODEL]:,} tokens (nothing fires), "
        f"`{ckpt_model(SIZE)}` {windows[ckpt_model(SIZE)]:,} (bench/gateway_agent.py "
        "`ckpt_window`: the trigger ~10 % under seed 0's base). Calibration off: the mock's "
        "usage is canned.",
        "- Proxy: bench/gateway_agent.py's `proxy_config` (aiohttp upstream transport, SQLite "
        "checkpoints, summarization off), a fresh process per model; upstream: "
        "bench.mock_upstream.",
        "- `/healthz`: one client on a kept-alive connection, a request every 10 ms (plus its "
        "own latency); the row's samples are those sent while one of its requests was in "
        "flight. Request seconds: the client's, from sending the body to reading the answer "
        "(median / max when the row has several).",
        "",
        "| case | requests | answers: status, checkpoint, strategies | request s | `/healthz` p50 / p99 / max (ms) "
        "| health samples | main RSS peak − before (MiB) |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for row in rows:
        health = row.health()
        failed = sum(run.health_failures for run in row.runs)
        idle_row = row.runs[0].name == "idle"
        figures = (
            f"{statistics.median(health):.1f} / {percentile(health, 0.99):.1f} / {max(health):.1f}"
            if health
            else "no sample"
        )
        peak = max(run.main_peak_kb - run.main_before_kb for run in row.runs) / 1024
        lines.append(
            f"| {row.name} | {0 if idle_row else len(row.runs)} | "
            f"{'—' if idle_row else _answers(row.runs)} | "
            f"{'—' if idle_row else _seconds(row.runs)} | {figures} | {len(health)}"
            f"{f' ({failed} failed)' if failed else ''} | {'—' if idle_row else f'{peak:.0f}'} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", type=int, default=5, help="sessions, each new to the proxy")
    parser.add_argument("--repeat", type=int, default=10, help="bases under a new task message")
    parser.add_argument("--steps", type=int, default=40, help="one-step requests per model")
    parser.add_argument("--out", default="bench/results/healthz-during-500k.md")
    args = parser.parse_args(argv)
    tok = tokenizers().get("o200k_base")
    plain: list[SessionBodies] = []
    ckpt: list[SessionBodies] = []
    tokens: list[int] = []
    for seed in range(args.fresh):
        session = agent_session(SIZES[SIZE], tok, seed=seed)
        plain.append(SessionBodies.build(session, PLAIN_MODEL))
        ckpt.append(SessionBodies.build(session, ckpt_model(SIZE)))
        tokens.append(session.base_tokens)
    # The bodies are bytes from here: a collection of the sessions' objects would pause this
    # process's health client and show up as the proxy's latency.
    del session
    gc.collect()
    gc.freeze()
    windows = {PLAIN_MODEL: PLAIN_WINDOW, ckpt_model(SIZE): ckpt_window(tokens[0])}
    rows: list[Row] = []
    load_at_start = os.getloadavg()[0]
    directory = Path(tempfile.mkdtemp(prefix="healthz-during-"))  # kept: the servers' logs
    mock = ServerProcess(
        "mock",
        lambda port: python_module_argv("bench.mock_upstream", "--port", str(port)),
        directory / "mock.log",
        ready_path="/health",
        ready_status=200,
    )
    mock.start()
    try:
        proxy = fresh_proxy(directory, "plain", mock.port, windows)
        try:
            rows += nothing_fires(proxy, plain, args.steps)
        finally:
            proxy.stop()
        proxy = fresh_proxy(directory, "ckpt", mock.port, windows)
        try:
            rows += fires(proxy, ckpt, args.repeat, args.steps)
        finally:
            proxy.stop()
    finally:
        mock.stop()
    print(f"# logs in {directory}", file=sys.stderr)
    for row in rows:
        print(row.name, [f"{run.seconds:.3f}" for run in row.runs], file=sys.stderr)
    load = (load_at_start, os.getloadavg()[0])
    text = render(rows, plain, tokens, windows, load, sys.argv[1:] if argv is None else argv)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
