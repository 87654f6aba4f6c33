"""Gateway overhead benchmark: direct mock vs compaction-proxy (both transports) vs LiteLLM.

One run starts everything on loopback and measures it together, because on a shared 2-core
machine numbers taken minutes apart are not comparable:

* the mock upstream and the load generator share core 1; every proxy gets core 0 alone
  (`taskset`), one worker each, so "proxy RPS / direct RPS" compares one proxy core against
  what the mock can serve;
* added latency at concurrency 1 = proxy percentile minus direct percentile, from the Python
  generator (per-request timings, warm-up discarded, targets interleaved round by round);
* throughput at concurrency 16 from `hey` when installed (Go, no ~1k RPS Python ceiling),
  else from the Python generator; rounds interleave targets and the median round is reported.

Nothing here asserts on timings: the run prints and writes a table for people to read.

Run (from the repo root): python -m bench.gateway [--quick] [--out bench/results/gateway.md]

`--agent` switches to the agent-session mode (bench/gateway_agent.py): bodies of ~8k to 500k
tokens that grow by one tool step per request, nothing firing and with checkpoint hits, CPU
time per request, and the agent-session targets: python -m bench.gateway --agent [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import (
    CLIENT_CPU,
    DEFAULT_LITELLM,
    KEY,
    LITELLM_VENV,
    MESSAGES,
    PROXY_CPU,
    PY,
    REPO,
    Target,
    cpu_model,
    fmt,
    free_port,
    hey,
    pinned,
    start,
    stop,
    versions,
    wait_ready,
)


def proxy_config(path: Path, mock_port: int, transport: str, log_level: str) -> Path:
    path.write_text(
        f"""server:
  upstream_transport: {transport}
  log_level: {log_level}
  api_keys: ["{KEY}"]
upstreams:
  - name: mock
    base_url: http://127.0.0.1:{mock_port}/v1
    api_key: sk-mock
"""
    )
    return path


def litellm_config(path: Path, mock_port: int) -> Path:
    path.write_text(
        f"""model_list:
  - model_name: mock-gpt
    litellm_params:
      model: openai/mock-gpt
      api_base: http://127.0.0.1:{mock_port}/v1
      api_key: sk-mock
"""
    )
    return path


def loadgen(
    targets: list[Target],
    body: Path,
    concurrency: int,
    rounds: int,
    warmup: int,
    *,
    requests: int | None = None,
    duration: float | None = None,
) -> dict[str, dict[str, float]]:
    cmd = [
        PY,
        "-m",
        "bench.loadgen",
        "--body-file",
        str(body),
        "-c",
        str(concurrency),
        "--rounds",
        str(rounds),
        "--warmup",
        str(warmup),
        "-H",
        f"Authorization: Bearer {KEY}",
    ]
    cmd += ["-n", str(requests)] if requests else ["-z", str(duration)]
    for t in targets:
        cmd += ["--target", f"{t.name}={t.url}"]
    out = subprocess.run(pinned(CLIENT_CPU, cmd), cwd=REPO, capture_output=True, check=True)
    return json.loads(out.stdout)


def median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def main() -> None:
    if "--agent" in sys.argv[1:]:  # the agent-session mode has its own options
        from bench.gateway_agent import main as agent_main

        agent_main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 short round: a smoke run")
    parser.add_argument("--out", default="bench/results/gateway.md")
    parser.add_argument("--litellm", default=str(DEFAULT_LITELLM), help="litellm CLI path")
    parser.add_argument("--chunks", type=int, default=16, help="SSE content deltas per stream")
    parser.add_argument("--no-hey", action="store_true", help="use the Python generator only")
    args = parser.parse_args()

    rounds, n_c1, warmup, seconds = (1, 100, 30, 2.0) if args.quick else (5, 300, 100, 5.0)
    tp_rounds = 1 if args.quick else 3
    use_hey = bool(shutil.which("hey")) and not args.no_hey
    litellm = Path(args.litellm) if Path(args.litellm).exists() else None
    notes: list[str] = []
    if not shutil.which("taskset"):
        notes.append("`taskset` not found: processes were NOT pinned to cores.")
    if litellm is None:
        notes.append(
            f"LiteLLM skipped: `{args.litellm}` not found. Install it with "
            f"`python3 -m venv {LITELLM_VENV} && {LITELLM_VENV}/bin/pip "
            "install 'litellm[proxy]'` from the repository root (or pass --litellm)."
        )

    tmp = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    bodies = {}
    for mode, extra in (("json", {}), ("sse", {"stream": True})):
        bodies[mode] = tmp / f"{mode}.json"
        bodies[mode].write_bytes(
            json.dumps({"model": "mock-gpt", "messages": MESSAGES, **extra}).encode()
        )

    mock_port = free_port()
    mock = Target(
        "direct",
        f"http://127.0.0.1:{mock_port}",
        "/health",
        pinned(
            CLIENT_CPU,
            [
                PY,
                "-m",
                "bench.mock_upstream",
                "--port",
                str(mock_port),
                "--chunks",
                str(args.chunks),
            ],
        ),
    )
    targets = [mock]
    for name, transport, level in (
        ("proxy-aiohttp", "aiohttp", "warning"),
        ("proxy-httpx", "httpx", "warning"),
        ("proxy-aiohttp+info-log", "aiohttp", "info"),
    ):
        port = free_port()
        cfg = proxy_config(tmp / f"{name}.yaml", mock_port, transport, level)
        targets.append(
            Target(
                name,
                f"http://127.0.0.1:{port}",
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
                        str(port),
                    ],
                ),
            )
        )
    port = free_port()
    targets.append(
        Target(
            "ref-aiohttp-passthrough",
            f"http://127.0.0.1:{port}",
            "/health",
            pinned(
                PROXY_CPU,
                [
                    PY,
                    "-m",
                    "bench.ref_passthrough",
                    "--port",
                    str(port),
                    "--upstream",
                    f"http://127.0.0.1:{mock_port}/v1",
                ],
            ),
        )
    )
    if litellm is not None:
        port = free_port()
        cfg = litellm_config(tmp / "litellm.yaml", mock_port)
        targets.append(
            Target(
                "litellm",
                f"http://127.0.0.1:{port}",
                "/health/liveliness",
                pinned(
                    PROXY_CPU,
                    [
                        str(litellm),
                        "--config",
                        str(cfg),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--num_workers",
                        "1",
                    ],
                ),
                env={
                    "LITELLM_MASTER_KEY": KEY,
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                },
            )
        )

    c1: dict[str, dict[str, dict[str, float]]] = {}
    c16: dict[str, dict[str, dict[str, float]]] = {}
    py_ceiling: dict[str, float] = {}
    try:
        for t in targets:
            start(t, tmp / f"{t.name}.log")
        for t in targets:
            took = wait_ready(t, 120 if t.name == "litellm" else 30)
            print(f"# {t.name} ready in {took:.1f}s", file=sys.stderr)
        for mode in ("json", "sse"):
            print(f"# c=1 {mode}", file=sys.stderr)
            c1[mode] = loadgen(targets, bodies[mode], 1, rounds, warmup, requests=n_c1)
        per_round: dict[str, dict[str, list[dict[str, float]]]] = {
            m: {t.name: [] for t in targets} for m in ("json", "sse")
        }
        for r in range(tp_rounds):
            for mode in ("json", "sse"):
                print(f"# c=16 {mode} round {r + 1}/{tp_rounds}", file=sys.stderr)
                for t in targets:
                    if use_hey:
                        res = hey(t.url, bodies[mode], 16, seconds)
                    else:
                        res = loadgen([t], bodies[mode], 16, 1, warmup, duration=seconds)[t.name]
                    per_round[mode][t.name].append(res)
        for mode in ("json", "sse"):
            c16[mode] = {name: median_round(rs) for name, rs in per_round[mode].items()}
        if use_hey:  # the Python generator's own ceiling, measured against the bare mock
            py_ceiling = loadgen([mock], bodies["json"], 16, 1, warmup, duration=seconds)["direct"]
    finally:
        for t in reversed(targets):
            stop(t)

    report = render(
        args,
        targets,
        c1,
        c16,
        py_ceiling,
        use_hey,
        notes,
        litellm,
        body_bytes=bodies["json"].stat().st_size,
    )
    print(report)
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"# written to {out}; logs in {tmp}", file=sys.stderr)


def render(
    args: argparse.Namespace,
    targets: list[Target],
    c1: dict[str, dict[str, dict[str, float]]],
    c16: dict[str, dict[str, dict[str, float]]],
    py_ceiling: dict[str, float],
    use_hey: bool,
    notes: list[str],
    litellm: Path | None,
    body_bytes: int,
) -> str:
    names = [t.name for t in targets]
    d1j, d1s = c1["json"]["direct"], c1["sse"]["direct"]
    cmd = "cd " + str(REPO) + " && " + " ".join([PY, "-m", "bench.gateway", *sys.argv[1:]])
    tool = "hey (Go, closed loop)" if use_hey else "bench.loadgen (Python aiohttp, closed loop)"
    lines = [
        "# Gateway overhead benchmark",
        "",
        f"- Date: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores), {platform.system()} {platform.release()}",
        f"- Versions: {versions(litellm)}",
        f"- Pinning: proxies on core {PROXY_CPU} (1 worker each); mock upstream and load "
        f"generator on core {CLIENT_CPU}. Loopback only. Request body {body_bytes} B; SSE = "
        f"{args.chunks} content deltas + role/stop frames + [DONE]; mock delay 0 ms.",
        f"- c=1: bench.loadgen, {'1 round' if args.quick else '5 interleaved rounds'} per "
        "target, warm-up discarded; 'added' = target percentile minus direct percentile.",
        f"- c=16: {tool}, {'1 round' if args.quick else 'median of 3 interleaved rounds'} of "
        f"{'2' if args.quick else '5'} s per target and mode.",
        "- `ref-aiohttp-passthrough` (bench/ref_passthrough.py) is a floor, not a product: raw "
        "ASGI + aiohttp with no auth, header rules or error handling, on the same stack.",
        f"- Command: `{cmd}`",
        *[f"- Note: {n}" for n in notes],
        "",
        "## Concurrency 1: latency (ms)",
        "",
        "| target | JSON p50 | JSON p99 | added p50 | added p99 | SSE TTFB p50 | added TTFB p50 "
        "| SSE total p50 | SSE total p99 | added total p50 | added total p99 | SSE events |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        j, s = c1["json"][name], c1["sse"][name]
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    fmt(j["p50"]),
                    fmt(j["p99"]),
                    fmt(j["p50"] - d1j["p50"]),
                    fmt(j["p99"] - d1j["p99"]),
                    fmt(s["ttfb_p50"]),
                    fmt(s["ttfb_p50"] - d1s["ttfb_p50"]),
                    fmt(s["p50"]),
                    fmt(s["p99"]),
                    fmt(s["p50"] - d1s["p50"]),
                    fmt(s["p99"] - d1s["p99"]),
                    fmt(s["events"], 0),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "## Concurrency 16: throughput",
        "",
        "| target | JSON RPS | JSON p50 ms | JSON p99 ms | JSON RPS / direct | SSE RPS | SSE p50 ms "
        "| SSE p99 ms | SSE RPS / direct | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    dj, ds = c16["json"]["direct"]["rps"], c16["sse"]["direct"]["rps"]
    for name in names:
        j, s = c16["json"][name], c16["sse"][name]
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    fmt(j["rps"], 0),
                    fmt(j["p50"]),
                    fmt(j["p99"]),
                    fmt(j["rps"] / dj),
                    fmt(s["rps"], 0),
                    fmt(s["p50"]),
                    fmt(s["p99"]),
                    fmt(s["rps"] / ds),
                    str(int(j["errors"] + s["errors"])),
                ]
            )
            + " |"
        )
    if py_ceiling:
        lines += [
            "",
            f"Python generator ceiling (bench.loadgen, c=16, JSON, direct mock): "
            f"{py_ceiling['rps']:.0f} RPS (p50 {py_ceiling['p50']:.2f} ms) vs hey's "
            f"{dj:.0f} RPS: numbers near that ceiling measure the generator, not the target.",
        ]
    else:
        lines += [
            "",
            "Throughput is from the Python generator, which caps near ~1k RPS per core: "
            "install `hey` (`apt-get install -y hey`) for real throughput numbers.",
        ]
    lines += ["", "## Targets (reported, not asserted)", ""]
    for name in names:
        if not name.startswith("proxy-"):
            continue
        added = c1["json"][name]["p50"] - d1j["p50"]
        ratio = c16["json"][name]["rps"] / dj
        lines.append(
            f"- {name}: added p50 at c=1 (JSON) {added:.2f} ms "
            f"({'met' if added <= 0.5 else 'NOT met'}, target ≤ 0.5 ms); c=16 JSON throughput "
            f"{ratio:.2f}× direct ({'met' if ratio >= 0.5 else 'NOT met'}, target ≥ 0.5×); "
            f"SSE {c16['sse'][name]['rps'] / ds:.2f}× direct."
        )
    a, h = c16["json"]["proxy-aiohttp"]["rps"], c16["json"]["proxy-httpx"]["rps"]
    lines.append(
        f"- Faster transport at c=16 JSON: {'aiohttp' if a >= h else 'httpx'} "
        f"({max(a, h) / min(a, h):.2f}×)."
    )
    info = c16["json"].get("proxy-aiohttp+info-log")
    if info:
        lines.append(
            f"- Cost of `log_level: info` (one JSON access line per request, to a file): "
            f"c=1 p50 {c1['json']['proxy-aiohttp+info-log']['p50'] - c1['json']['proxy-aiohttp']['p50']:+.3f} ms, "
            f"c=16 RPS {info['rps'] / a - 1:+.1%} vs warning."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
