"""The benchmark harness both gateway modes share: where things run, how servers start and
stop on pinned cores, and the figures every report prints (versions, CPU model, number format).

`bench/gateway.py` (small bodies) and `bench/gateway_agent.py` (agent-session bodies) import it;
neither imports the other's internals.
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
PROXY_CPU, CLIENT_CPU = "0", "1"
KEY = "sk-bench"
CHAT = "/v1/chat/completions"
LITELLM_VENV = ".venv-litellm"
"""LiteLLM's own virtualenv (git-ignored, like `.venv`), so its dependencies never meet the
project's: `python3 -m venv .venv-litellm && .venv-litellm/bin/pip install 'litellm[proxy]'`."""
DEFAULT_LITELLM = next(
    (
        path
        for path in (
            REPO / LITELLM_VENV / "bin" / "litellm",
            REPO.parent / LITELLM_VENV / "bin" / "litellm",  # where earlier runs installed it
        )
        if path.exists()
    ),
    REPO / LITELLM_VENV / "bin" / "litellm",
)
GUARDIAN_VENV = ".venv-guardian"
"""context-guardian's own virtualenv (git-ignored), for the same reason as LiteLLM's:
`python3 -m venv .venv-guardian && .venv-guardian/bin/pip install context-guardian`."""
DEFAULT_GUARDIAN = next(
    (
        path
        for path in (
            REPO / GUARDIAN_VENV / "bin" / "context-guardian",
            REPO.parent / GUARDIAN_VENV / "bin" / "context-guardian",
        )
        if path.exists()
    ),
    REPO / GUARDIAN_VENV / "bin" / "context-guardian",
)
# A short but realistic agent turn (~1 KB): the proxy parses it with orjson on every request.
MESSAGES = [
    {"role": "system", "content": "You are a careful coding assistant. " * 8},
    {"role": "user", "content": "Summarise the change in compaction_proxy/upstream.py. " * 10},
    {"role": "assistant", "content": "It adds an aiohttp transport behind httpx's API. " * 4},
    {"role": "user", "content": "And the pool limits?"},
]


@dataclass
class Target:
    name: str
    base: str  # http://127.0.0.1:port
    health: str  # path polled until it answers 200
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.base + CHAT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cpu: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if shutil.which("taskset") else cmd


def start(target: Target, log: Path) -> None:
    # Own session, so stop() can end exactly this process group (uvicorn/LiteLLM children).
    target.proc = subprocess.Popen(
        target.cmd,
        cwd=REPO,
        env={**os.environ, **target.env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_ready(target: Target, timeout: float) -> float:
    """Seconds until the health path answered 200; raises if the process died or timed out."""
    begin = time.monotonic()
    while time.monotonic() - begin < timeout:
        assert target.proc is not None
        if target.proc.poll() is not None:
            raise RuntimeError(f"{target.name} exited with {target.proc.returncode}")
        try:
            with urllib.request.urlopen(target.base + target.health, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - begin
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{target.name} not ready after {timeout:.0f}s")


def stop(target: Target) -> None:
    if target.proc is None or target.proc.poll() is not None:
        return
    os.killpg(target.proc.pid, signal.SIGTERM)
    try:
        target.proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(target.proc.pid, signal.SIGKILL)
        target.proc.wait()


def hey(url: str, body: Path, concurrency: int, duration: float) -> dict[str, float]:
    """One closed-loop `hey` run (Go: no Python generator ceiling) on the client core.

    Latencies in ms; ``sent`` is every response hey counted, so a caller can divide a
    server's CPU time by it.
    """
    cmd = ["hey", "-z", f"{duration}s", "-c", str(concurrency), "-m", "POST"]
    cmd += ["-T", "application/json", "-H", f"Authorization: Bearer {KEY}", "-D", str(body), url]
    text = subprocess.run(pinned(CLIENT_CPU, cmd), capture_output=True, text=True).stdout

    def grab(pattern: str) -> float:
        m = re.search(pattern, text)
        return float(m.group(1)) if m else float("nan")

    ok = sum(int(n) for n in re.findall(r"\[200\]\s+(\d+) responses", text))
    total = sum(int(n) for n in re.findall(r"\[\d{3}\]\s+(\d+) responses", text))
    failed = text.split("Error distribution:", 1)[1] if "Error distribution:" in text else ""
    refused = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]\s", failed, re.M))
    return {
        "rps": grab(r"Requests/sec:\s+([\d.]+)"),
        "p50": grab(r"50%+ in ([\d.]+) secs") * 1000,
        "p99": grab(r"99%+ in ([\d.]+) secs") * 1000,
        "errors": total - ok + refused,
        "sent": total + refused,
    }


def guardian_version(guardian: Path) -> str:
    out = subprocess.run([str(guardian), "--version"], capture_output=True, text=True)
    return out.stdout.strip() or "context-guardian (version unknown)"


def versions(litellm: Path | None, guardian: Path | None = None) -> str:
    names = ["uvicorn", "uvloop", "httptools", "httpx", "httpx-aiohttp", "aiohttp", "orjson"]
    parts = [f"Python {platform.python_version()}"]
    parts += [f"{n} {md.version(n)}" for n in names if _has(n)]
    if litellm is not None:
        probe = [
            str(litellm.parent / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ]
        parts.append(
            "LiteLLM " + subprocess.run(probe, capture_output=True, text=True).stdout.strip()
        )
    if guardian is not None:
        parts.append(guardian_version(guardian))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    parts.append(f"compaction-proxy @ {commit or '?'}")
    if shutil.which("hey"):
        parts.append("hey " + _deb_version("hey"))
    return ", ".join(parts)


def _has(name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def _deb_version(pkg: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return out.stdout.strip() or "(version unknown)"


def stamp() -> str:
    """When and at which commit a run was made (``+dirty``: tracked files differ from it), for
    a report's first line."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return f"{when} (commit unknown)"
    status = [*git, "status", "--porcelain", "--untracked-files=no"]
    dirty = subprocess.run(status, capture_output=True, text=True).stdout.strip()
    return f"{when} at {head.stdout.strip()}{'+dirty' if dirty else ''}"


def loop_seconds() -> float:
    """Wall seconds of a fixed pure-Python loop (best of three): how fast this machine runs
    Python today, so runs on different machines can be told apart."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - began)
    return best


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"  # x != x: NaN
