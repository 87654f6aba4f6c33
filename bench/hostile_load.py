"""Hostile bodies against a real proxy: its memory, and how long other clients wait meanwhile.

Not a test: it asserts nothing and writes a report for people to read. Real processes on
127.0.0.1 only: the fake upstream (tests/fakes/upstream.py) and the proxy (``python -m
compaction_proxy serve``, default limits, SQLite checkpoints in a temporary directory). For
each body below, one client sends it while another asks ``GET /healthz`` over a kept-alive
connection every 10 ms; the proxy's RSS (its process and children, from /proc) is sampled
every 20 ms. A warm-up first starts the parse worker (a refused body of 120,000 messages).

- 1,000,000 tiny messages (29 MiB, under the 32 MiB body limit): refused with 413;
- 200,000 tiny messages (a smaller hostile body, still over the message limit): refused with 413;
- 50,000 tiny messages: the most messages the limits allow, compacted;
- 50,000 messages filling the body limit (32 MiB): the largest request the limits allow,
  compacted (a summary call to the fake upstream included).

    python -m bench.hostile_load [--out bench/results/hostile-load.md]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.soak import rss_kb
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

BODY_LIMIT = 32 * 1024 * 1024
HEALTH_EVERY = 0.010
RSS_EVERY = 0.020
SETTLE = 3.0  # seconds after a request before "RSS after" is read
REQUEST_BOUND = 110.0  # seconds one request may take before the run gives up on it


def tiny_messages(count: int) -> bytes:
    """``count`` messages in all: a system prompt, then one-character turns (the hostile
    shape: 1,000,000 of them are 29 MiB)."""
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(count - 1):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": "x"})
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def full_body(count: int, limit: int = BODY_LIMIT) -> bytes:
    """``count`` messages whose contents fill the body to just under ``limit`` bytes."""
    overhead = len(tiny_messages(count))
    each = max(1, (limit - overhead - 4096) // count)
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(count - 1):
        text = (f"step {i}: " + "lorem ipsum dolor sit amet " * (each // 27 + 1))[:each]
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


@dataclass
class Run:
    name: str
    size: int
    status: int = 0
    seconds: float = 0.0
    error_code: str = ""
    health_ms: list[float] = field(default_factory=list)
    health_at: list[float] = field(default_factory=list)  # perf_counter when each was sent
    health_failures: int = 0
    sent_at: float = 0.0  # perf_counter when the request was sent, and when it was answered
    answered_at: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # the answer's, names lower-cased
    rss_before_kb: int = 0
    rss_peak_kb: int = 0
    main_peak_kb: int = 0
    main_before_kb: int = 0
    rss_after_kb: int = 0
    after_by_process: str = ""


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def poll_health(port: int, stop: threading.Event, out: Run) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        started = time.perf_counter()
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                out.health_failures += 1
        except (OSError, http.client.HTTPException):
            out.health_failures += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        out.health_at.append(started)
        out.health_ms.append((time.perf_counter() - started) * 1000)
        stop.wait(HEALTH_EVERY)
    conn.close()


def _sample_rss(pid: int, stop: threading.Event, out: Run) -> None:
    while not stop.is_set():
        out.rss_peak_kb = max(out.rss_peak_kb, rss_kb(pid))
        out.main_peak_kb = max(out.main_peak_kb, _own_rss_kb(pid))
        stop.wait(RSS_EVERY)


def measure(
    proxy: ProxyServer,
    name: str,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    settle: float = SETTLE,
) -> Run:
    """Send ``body`` while the health and RSS samplers run; ``settle``: seconds to wait
    after the answer before "RSS after" is read (bench/healthz_during.py's small steps
    need less than a body the parse worker handled)."""
    assert proxy.proc is not None
    pid = proxy.proc.pid
    run = Run(name, len(body))
    run.rss_before_kb = run.rss_peak_kb = rss_kb(pid)
    run.main_before_kb = run.main_peak_kb = _own_rss_kb(pid)
    stop = threading.Event()
    threads = [
        threading.Thread(target=poll_health, args=(proxy.port, stop, run), daemon=True),
        threading.Thread(target=_sample_rss, args=(pid, stop, run), daemon=True),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # a few health samples before the body arrives
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=REQUEST_BOUND)
    started = time.perf_counter()
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        response = conn.getresponse()
        payload = response.read()
        run.status = response.status
        run.headers = {k.lower(): v for k, v in response.getheaders()}
        if response.status >= 400:
            try:
                run.error_code = str(orjson.loads(payload)["error"]["code"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                run.error_code = "?"
    except (OSError, http.client.HTTPException) as exc:
        run.error_code = type(exc).__name__
    run.sent_at, run.answered_at = started, time.perf_counter()
    run.seconds = run.answered_at - started
    conn.close()
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(5)
    time.sleep(settle)
    run.rss_after_kb = rss_kb(pid)
    run.after_by_process = _by_process(pid)
    return run


def _by_process(pid: int) -> str:
    """``main 420 + worker 60`` (MiB): the proxy and its parse worker, if it has one."""
    parts = [f"main {_own_rss_kb(pid) / 1024:.0f}"]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            parts.append(f"worker {rss_kb(int(child)) / 1024:.0f}")
    return " + ".join(parts)


def _own_rss_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def report(runs: list[Run], idle_kb: int, started: str) -> str:
    lines = [
        "# Hostile bodies: memory and other clients' latency",
        "",
        f"Run {started} on {platform.machine()}, {os.cpu_count()} CPUs (shared with other "
        "work: figures from one run compare with each other, not across runs). "
        "`python -m bench.hostile_load`.",
        "",
        f"Proxy RSS at rest (process and children, after start-up and a warm-up): "
        f"{idle_kb / 1024:.0f} MiB.",
        "",
        "| body | size | answer | seconds | `/healthz` p50 / p99 / max (ms) | health samples "
        "| RSS before → peak → after (MiB) | peak − before | main process: peak − before "
        "| after, by process (MiB) |",
        "|---|---:|---|---:|---|---:|---|---:|---:|---|",
    ]
    for run in runs:
        health = run.health_ms
        answer = f"{run.status} {run.error_code}".strip()
        lines.append(
            f"| {run.name} | {run.size / 2**20:.1f} MiB | {answer} | {run.seconds:.2f} | "
            f"{statistics.median(health):.1f} / {percentile(health, 0.99):.1f} / "
            f"{max(health):.1f} | {len(health)}"
            f"{f' ({run.health_failures} failed)' if run.health_failures else ''} | "
            f"{run.rss_before_kb / 1024:.0f} → {run.rss_peak_kb / 1024:.0f} → "
            f"{run.rss_after_kb / 1024:.0f} | "
            f"{(run.rss_peak_kb - run.rss_before_kb) / 1024:.0f} MiB "
            f"({(run.rss_peak_kb - run.rss_before_kb) * 1024 / run.size:.1f}x the body) | "
            f"{(run.main_peak_kb - run.main_before_kb) / 1024:.0f} MiB "
            f"({(run.main_peak_kb - run.main_before_kb) * 1024 / run.size:.1f}x) | "
            f"{run.after_by_process} |"
        )
    lines += [
        "",
        "The health samples are every request the second client completed while the body "
        "was sent, parsed, compacted and answered (one every 10 ms, plus its own latency). "
        "Before the message limits and the parsing of large bodies off the event loop, the "
        "1,000,000-message body took 5 GB of RSS and stalled "
        "every other client for 46 s; 200,000 messages took +946 MiB and 8.5 s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench/results/hostile-load.md")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    bodies = [
        ("1,000,000 tiny messages", tiny_messages(1_000_000)),
        ("200,000 tiny messages", tiny_messages(200_000)),
        ("50,000 tiny messages (the message limit)", tiny_messages(50_000)),
        ("50,000 messages, 32 MiB (the largest allowed)", full_body(50_000)),
        ("the same body again (a checkpoint hit)", full_body(50_000)),
    ]
    with tempfile.TemporaryDirectory(prefix="hostile-load-") as tmp:
        directory = Path(tmp)
        upstream = UpstreamServer(directory / "upstream.log").start()
        try:
            config = proxy_config(upstream_entry(upstream))
            config["store"] = {"backend": "sqlite", "path": str(directory / "checkpoints.db")}
            path = write_config(directory / "proxy.yaml", config)
            proxy = ProxyServer(path, directory / "proxy.log").start()
            try:
                measure(proxy, "warm-up", tiny_messages(10))
                measure(proxy, "warm-up", tiny_messages(120_000))  # starts the parse worker
                idle = rss_kb(proxy.proc.pid if proxy.proc else 0)
                runs = []
                for name, body in bodies:
                    runs.append(measure(proxy, name, body))
                    print(runs[-1].name, runs[-1].status, f"{runs[-1].seconds:.2f}s")
            finally:
                proxy.stop()
        finally:
            upstream.stop()
    text = report(runs, idle, started)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
