"""What the proxy adds to a ~128k-token Messages request, against the same mock called directly.

    python -m bench.messages_latency [--tokens 128000] [--requests 30] [--rounds 3]
        [--fires 5] [--quick] [--out bench/results/messages-latency.md]

Real processes on loopback: the mock upstream (bench/mock_upstream.py, which answers
``POST /v1/messages`` with a canned Anthropic message or its SSE events) on core 1, the proxy
(``python -m compaction_proxy serve``, one worker, SQLite checkpoints, summarization off) on
core 0, and this process as the client on core 1, one request at a time. Every proxied request
has a direct twin with the same bytes sent to the mock, interleaved pair by pair (and the
order inside a pair alternating), so drift on a busy machine hits both alike.

The session is Claude Code-shaped (bench/messages_bodies.py), sized to ``--tokens`` by the
proxy's own count of the lifted body; the chat route's peer is the same kind of conversation
as chat messages, sized the same way, measured in the same run. Cases, each as JSON and as a
stream (time to first byte and total):

* ``first request``: system, tools and the task only (~8k tokens), nothing compacted;
* ``pass-over``: the 128k session on a 4M-token window: nothing compacted, the proxy's cost of
  reading, counting and forwarding it;
* ``checkpoint hit``: the same session on a window whose trigger sits ~10 % under it, after
  its base compacted once (before the measurement): every request is the previous one plus a
  new tool step and finds the checkpoint, the steady state of an agent session. Forks of new
  steps restart from the base before they would fire again (as in bench/agent_bodies.py);
* ``compaction (warm counts)``: a new session of the same size fires, every message already
  counted by an earlier request (as in a session that grew to its trigger);
* ``compaction (cold)``: the same with nothing counted before (a conversation the proxy never
  saw: after a restart, say).

Figures: p50 and p90 of the proxied requests minus those of their direct twins (added ms),
proxied p50 over direct p50 (the ratio), and the proxy's own CPU time per request (from
/proc: the steadier figure when other jobs share the cores). Response headers are checked on every proxied request
(nothing fired / the checkpoint hit / the compaction fired), and a failed check stops the run.
No timing is asserted; the run writes a table for people to read.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.harness import (
    CLIENT_CPU,
    KEY,
    PROXY_CPU,
    PY,
    REPO,
    Target,
    cpu_model,
    free_port,
    pinned,
    start,
    stop,
    versions,
    wait_ready,
)
from bench.loadgen import percentile
from bench.messages_bodies import MAX_TOKENS, Conversation, Step, conversation, fork_steps
from compaction_proxy.compaction import TokenizerProvider
from compaction_proxy.wire.messages import lift

ROUTES = ("messages", "chat")
MODES = ("json", "stream")
PATHS = {"messages": "/v1/messages?beta=true", "chat": "/v1/chat/completions"}
HEADERS = {
    "messages": {
        "content-type": "application/json",
        "x-api-key": KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
        "fine-grained-tool-streaming-2025-05-14",
    },
    "chat": {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
}
PLAIN_WINDOW = 4_000_000
RESERVE_RATIO = 0.05  # the budget's safety share (the default)
TRIGGER_RATIO = 0.8  # the default trigger: 0.8 of the budget
FORK_SHARE = 0.08
"""How much a fork of new steps may add to the base before the next fork starts again from
the base: well under the ~10 % between the base and the trigger."""
CASES = (
    "first request",
    "pass-over",
    "checkpoint hit",
    "compaction (warm counts)",
    "compaction (cold)",
)


def model(route: str, kind: str) -> str:
    return f"{'claude' if route == 'messages' else 'chat'}-bench-{kind}"


def reserve_share() -> float:
    """The share of the window a request's own output limit may reserve, by the proxy's
    default settings (1.0, the whole limit, where the proxy has no such bound)."""
    from compaction_proxy.compaction.settings import CompactionSettings

    share = getattr(CompactionSettings(), "output_reserve_share", 1.0)
    return float(share)


def ckpt_window(base_tokens: int, share: float = 1.0) -> int:
    """A window whose trigger sits ~10 % under the base's count. The output reserve is the
    request's ``max_tokens`` (Claude Code's 32,000), at most ``share`` of the window."""
    budget = base_tokens * 0.9 / TRIGGER_RATIO
    window = math.ceil((budget + MAX_TOKENS) / (1 - RESERVE_RATIO)) + 1
    if share * window < MAX_TOKENS:  # the bound applies: the reserve is share x window
        window = math.ceil(budget / (1 - RESERVE_RATIO - share)) + 1
    return window


def body(session: Conversation, route: str, name: str, stream: bool, extra: list[Step]) -> bytes:
    if route == "messages":
        return orjson.dumps(session.messages_body(name, stream=stream, extra=extra))
    return orjson.dumps(session.chat_body(name, stream=stream, extra=extra))


# ------------------------------------------------------------------ sessions


def counter(provider: TokenizerProvider, route: str) -> Callable[[Conversation], int]:
    """The proxy's count of a session's prompt (its lifted messages and tools)."""
    tok = provider.get("o200k_base")

    def count(session: Conversation) -> int:
        if route == "messages":
            data = session.messages_body("m")
            chat = lift(data).chat_body(data)
        else:
            chat = session.chat_body("m")
        messages = chat["messages"]
        return sum(tok.count_message(m) for m in messages) + tok.count_tools(chat["tools"])

    return count


def sized(tag: str, tokens: int, count: Callable[[Conversation], int]) -> Conversation:
    """A session of ``tag`` grown a step at a time until the proxy counts ``tokens``."""
    session = conversation(tag)
    while count(session) < tokens:
        session.grow()
    return session


def twin(tag: str, like: Conversation) -> Conversation:
    """A session with the steps of ``like``'s length and texts and ids of its own."""
    session = conversation(tag)
    session.grow(len(like.steps))
    return session


@dataclass
class Forks:
    """Requests that each add one new step to the base, restarting from it every
    ``length`` steps with steps never sent before."""

    session: Conversation
    prefix: str
    length: int
    sent: int = 0
    steps: list[Step] = field(default_factory=list)

    def next(self) -> list[Step]:
        j = self.sent % self.length
        if j == 0:
            tag = f"{self.prefix}{self.sent // self.length}"
            self.steps = fork_steps(tag, len(self.session.steps), self.length)
        self.sent += 1
        return self.steps[: j + 1]


# ------------------------------------------------------------------ the client


@dataclass
class Sample:
    ttfb: float
    total: float


@dataclass
class Series:
    direct: list[Sample] = field(default_factory=list)
    proxy: list[Sample] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the proxy's CPU ms per proxied request


class ProxyCpu:
    """The proxy's CPU time (every thread of every process in its session, from /proc), read
    before each proxied request: what one request cost it is the time until the next one
    (its work after the reply, such as storing a checkpoint, included; between the two only
    the direct twin runs, which the proxy does not see)."""

    def __init__(self, leader: int) -> None:
        self.pids = [
            int(e.name)
            for e in os.scandir("/proc")
            if e.name.isdigit() and _session_of(e.name) == leader
        ]
        self.last: float | None = None
        self.owner: Series | None = None

    def seconds(self) -> float:
        total = 0.0
        for pid in self.pids:
            try:
                for task in os.scandir(f"/proc/{pid}/task"):
                    with open(f"{task.path}/schedstat") as f:
                        total += int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
        return total

    def mark(self, owner: Series | None) -> None:
        """Close the previous proxied request's account and open ``owner``'s."""
        now = self.seconds()
        if self.owner is not None and self.last is not None:
            self.owner.cpu.append((now - self.last) * 1000)
        self.last, self.owner = now, owner


def _session_of(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])


class Client:
    def __init__(self, direct: str, proxy: str, cpu: ProxyCpu) -> None:
        self.bases = {"direct": direct, "proxy": proxy}
        self.cpu = cpu
        timeout = aiohttp.ClientTimeout(total=600)
        self.sessions = {
            name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout)
            for name in self.bases
        }

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()

    async def send(
        self, where: str, route: str, data: bytes
    ) -> tuple[Sample, dict[str, str], bytes]:
        url = self.bases[where] + PATHS[route]
        started = time.perf_counter()
        async with self.sessions[where].post(url, data=data, headers=HEADERS[route]) as reply:
            first = await reply.content.readany()
            ttfb = time.perf_counter()
            rest = await reply.read()
            end = time.perf_counter()
            if reply.status != 200:
                raise RuntimeError(f"{where} {route}: {reply.status} {(first + rest)[:300]!r}")
            headers = {k.lower(): v for k, v in reply.headers.items()}
        return Sample((ttfb - started) * 1000, (end - started) * 1000), headers, first + rest

    async def pair(self, series: Series, route: str, data: bytes, flip: bool) -> dict[str, str]:
        """One direct and one proxied request of the same bytes; the proxy's headers. The
        proxy relays the reply byte for byte, so both answers must be the same bytes."""
        order = ("proxy", "direct") if flip else ("direct", "proxy")
        headers: dict[str, str] = {}
        answers: dict[str, bytes] = {}
        for where in order:
            if where == "proxy":
                self.cpu.mark(series)
            sample, got, answers[where] = await self.send(where, route, data)
            if where == "proxy":
                series.proxy.append(sample)
                headers = got
            else:
                series.direct.append(sample)
        if answers["proxy"] != answers["direct"]:
            raise RuntimeError(f"{route}: the proxied reply differs from the direct one")
        return headers


def expect(case: str, headers: dict[str, str]) -> str | None:
    """What is wrong with a proxied reply's report headers for ``case`` (None: as meant)."""
    checkpoint = headers.get("x-compaction-checkpoint")
    strategies = headers.get("x-compaction-strategies")
    if case in ("first request", "pass-over"):
        ok = checkpoint == "none" and strategies == "none"
    elif case == "checkpoint hit":  # the report names the checkpoint as what changed
        ok = checkpoint == "hit" and strategies == "checkpoint"
    else:
        ok = checkpoint == "new" and strategies not in (None, "none")
    if ok:
        return None
    return f"{case}: checkpoint {checkpoint!r}, strategies {strategies!r}"


# ------------------------------------------------------------------ the run


@dataclass
class Plan:
    tokens: int
    requests: int
    rounds: int
    fires: int
    warmup: int


@dataclass
class RouteSetup:
    route: str
    base: Conversation
    base_tokens: int  # the proxy's count of the base, as counter() makes it
    window: int
    steps_per_fork: int
    count: Callable[[Conversation], int]
    primed: dict[str, str] = field(default_factory=dict)


async def measure(
    client: Client, setups: dict[str, RouteSetup], plan: Plan
) -> dict[tuple[str, str, str], Series]:
    series: dict[tuple[str, str, str], Series] = {}
    forks: dict[tuple[str, str, str], Forks] = {}
    for route, setup in setups.items():
        for mode in MODES:
            for case in ("pass-over", "checkpoint hit"):
                tag = f"{route[0]}{'p' if case == 'pass-over' else 'h'}{mode[0]}"
                forks[(case, route, mode)] = Forks(setup.base, tag, setup.steps_per_fork)
            for case in CASES:
                series[(case, route, mode)] = Series()

    async def one(case: str, route: str, mode: str, flip: bool, keep: bool = True) -> None:
        setup = setups[route]
        stream = mode == "stream"
        if case == "first request":
            data = body(conversation(setup.base.tag), route, model(route, "plain"), stream, [])
        else:
            kind = "plain" if case == "pass-over" else "ckpt"
            extra = forks[(case, route, mode)].next()
            data = body(setup.base, route, model(route, kind), stream, extra)
        target = series[(case, route, mode)] if keep else Series()
        headers = await client.pair(target, route, data, flip)
        wrong = expect(case, headers)
        if wrong is not None:
            raise RuntimeError(f"{route} {mode} {wrong}")

    steady = ("first request", "pass-over", "checkpoint hit")
    for case in steady:
        for route in setups:
            for mode in MODES:
                for k in range(plan.warmup):
                    await one(case, route, mode, k % 2 == 1, keep=False)
    for r in range(plan.rounds):
        print(f"# round {r + 1}/{plan.rounds}", file=sys.stderr, flush=True)
        for case in steady:
            for route in setups:
                for mode in MODES:
                    for k in range(plan.requests):
                        await one(case, route, mode, k % 2 == 1)
    for k in range(plan.fires):
        print(f"# compactions {k + 1}/{plan.fires}", file=sys.stderr, flush=True)
        for route, setup in setups.items():
            for mode in MODES:
                stream = mode == "stream"
                for case, warm in (
                    ("compaction (warm counts)", True),
                    ("compaction (cold)", False),
                ):
                    tag = f"{route[0]}{'w' if warm else 'c'}{mode[0]}{k}"
                    fresh = twin(tag, setup.base)
                    if warm:  # an earlier request counted every message (nothing fired)
                        plain = body(fresh, route, model(route, "plain"), False, [])
                        client.cpu.mark(None)
                        _, seen, _ = await client.send("proxy", route, plain)
                        assert seen.get("x-compaction-strategies") == "none", seen
                    data = body(fresh, route, model(route, "ckpt"), stream, [])
                    headers = await client.pair(
                        series[(case, route, mode)], route, data, k % 2 == 1
                    )
                    wrong = expect(case, headers)
                    if wrong is not None:
                        raise RuntimeError(f"{route} {mode} {wrong}")
    await asyncio.sleep(0.5)  # the last request's checkpoint is stored after its reply
    client.cpu.mark(None)
    return series


async def prime(client: Client, setup: RouteSetup) -> None:
    """The base compacts once and becomes the checkpoint every hit request finds."""
    route = setup.route
    _, headers, _ = await client.send(
        "proxy", route, body(setup.base, route, model(route, "ckpt"), False, [])
    )
    if headers.get("x-compaction-strategies") in (None, "none"):
        raise RuntimeError(f"{route}: the base did not compact: {headers}")
    setup.primed = headers
    probe = fork_steps(f"{route[0]}probe", len(setup.base.steps), 1)
    for _ in range(100):  # the checkpoint is stored once the upstream has answered
        _, seen, _ = await client.send(
            "proxy", route, body(setup.base, route, model(route, "ckpt"), False, probe)
        )
        if seen.get("x-compaction-checkpoint") == "hit":
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{route}: the base's checkpoint is never found")


def proxy_config(path: Path, mock_port: int, store: Path, windows: dict[str, int]) -> Path:
    models = "\n".join(
        f"  {name}: {{context_window: {window}, encoding: o200k_base}}"
        for name, window in windows.items()
    )
    path.write_text(
        f"""server:
  upstream_transport: aiohttp
  log_level: warning
  api_keys: ["{KEY}"]
upstreams:
  - name: mock
    base_url: http://127.0.0.1:{mock_port}/v1
    api_key: sk-mock
models:
{models}
store:
  backend: sqlite
  path: {store}
windows:
  discover: false
summarization:
  enabled: false
compaction:
  calibration:
    enabled: false
  tokenizer:
    download: false
"""
    )
    return path


# ------------------------------------------------------------------ report


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q)


def row(case: str, route: str, s: Series, attr: str) -> list[str]:
    direct = [getattr(x, attr) for x in s.direct]
    proxy = [getattr(x, attr) for x in s.proxy]
    d50, d90, p50, p90 = (_ms(direct, 50), _ms(direct, 90), _ms(proxy, 50), _ms(proxy, 90))
    return [
        f"{p50 - d50:.2f}",
        f"{p90 - d90:.2f}",
        f"{p50 / d50:.1f}x" if d50 > 0 else "n/a",
        f"{d50:.2f}",
        f"{p50:.2f}",
    ]


def cpu(s: Series) -> str:
    return f"{statistics.median(s.cpu):.2f}" if s.cpu else "n/a"


def render(
    argv: list[str],
    plan: Plan,
    setups: dict[str, RouteSetup],
    series: dict[tuple[str, str, str], Series],
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
    seconds: float,
    notes: list[str],
) -> str:
    shown = ["python", "-m", "bench.messages_latency", *argv]
    before, after = loads
    lines = [
        "# Added latency on a ~128k-token Messages body (and the chat route's peer)",
        "",
        f"- Date: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; the run took {seconds:.0f} s",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores), {platform.system()} "
        f"{platform.release()}; load average before {before[0]:.2f} / {before[1]:.2f} / "
        f"{before[2]:.2f}, after {after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f} (1 / 5 / "
        "15 min; other jobs shared the machine)",
        f"- Versions: {versions(None)}",
        f"- Command (from the repository root): `{' '.join(shown)}`",
        f"- Processes: the proxy (`python -m compaction_proxy serve`, one worker, aiohttp "
        f"transport, SQLite checkpoints, summarization and calibration off) on core "
        f"{PROXY_CPU}; the mock upstream (bench/mock_upstream.py, delay 0) and this client "
        f"(aiohttp, one request at a time, keep-alive) on core {CLIENT_CPU}. Loopback only.",
        "- Every proxied request has a direct twin (the same bytes to the mock), interleaved "
        "pair by pair. `added p50` / `added p90` = the proxied percentile minus the direct "
        "one; `ratio` = proxied p50 / direct p50. Streams: 16 text deltas; `ttfb` is the time "
        "to the first body bytes. `proxy CPU`: the proxy's own CPU ms per request (every "
        "thread, from /proc; its work after the reply included), the steadier figure when "
        "other jobs share the cores.",
        f"- Samples per row: {plan.rounds} rounds x {plan.requests} pairs for the first "
        f"three cases ({plan.warmup} warm-up pairs each discarded), {plan.fires} pairs for "
        "each compaction case (one new session per pair: with so few, p90 is about the "
        "slowest).",
        "",
        "## Sessions",
        "",
        "| route | steps | content blocks | body bytes | tokens (proxy's count) | "
        "compacted window | steps per fork | the base's compaction (tokens, strategies) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for route, setup in setups.items():
        data = body(setup.base, route, "m", False, [])
        primed = setup.primed
        blocks = setup.base.blocks if route == "messages" else "(chat)"
        lines.append(
            f"| {route} | {len(setup.base.steps)} | {blocks} | {len(data):,} | "
            f"{setup.base_tokens:,} | {setup.window:,} | {setup.steps_per_fork} | "
            f"{primed.get('x-compaction-tokens-before')} -> "
            f"{primed.get('x-compaction-tokens-after')}, "
            f"`{primed.get('x-compaction-strategies')}` |"
        )
    for route, setup in setups.items():
        first = conversation(setup.base.tag)
        data = body(first, route, "m", False, [])
        lines.append(
            f"\n`first request` ({route}): {len(data):,} bytes, "
            f"{setup.count(first):,} tokens by the proxy's count."
        )
    lines += [
        "",
        "## JSON (total ms)",
        "",
        "| case | route | added p50 | added p90 | ratio | direct p50 | proxied p50 | "
        "proxy CPU p50 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        for route in setups:
            s = series[(case, route, "json")]
            cells = [*row(case, route, s, "total"), cpu(s)]
            lines.append(f"| {case} | {route} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Streaming (ms): time to first byte, and total",
        "",
        "| case | route | ttfb added p50 | ttfb added p90 | ttfb ratio | direct ttfb p50 | "
        "proxied ttfb p50 | total added p50 | total added p90 | total ratio | direct p50 | "
        "proxied p50 | proxy CPU p50 |",
        "|---|---|" + "---:|" * 11,
    ]
    for case in CASES:
        for route in setups:
            s = series[(case, route, "stream")]
            cells = [*row(case, route, s, "ttfb"), *row(case, route, s, "total"), cpu(s)]
            lines.append(f"| {case} | {route} | " + " | ".join(cells) + " |")
    lines += ["", "Checked on every proxied request (response headers):", ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128_000)
    parser.add_argument("--requests", type=int, default=30, help="pairs per case per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fires", type=int, default=5, help="pairs per compaction case")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16k, few requests")
    parser.add_argument("--out", type=Path, default=Path("bench/results/messages-latency.md"))
    args = parser.parse_args(argv)
    if args.quick:
        plan = Plan(16_000, 3, 1, 1, 1)
    else:
        plan = Plan(args.tokens, args.requests, args.rounds, args.fires, args.warmup)
    began = time.monotonic()
    load_before = os.getloadavg()
    from bench.agent_bodies import tokenizers

    provider = tokenizers()
    setups: dict[str, RouteSetup] = {}
    windows: dict[str, int] = {}
    for route in ROUTES:
        count = counter(provider, route)
        base = sized(route[0], plan.tokens, count)
        tokens = count(base)
        step_tokens = (tokens - count(conversation(base.tag))) / max(1, len(base.steps))
        per_fork = max(1, int(FORK_SHARE * tokens / step_tokens))
        window = ckpt_window(tokens, reserve_share())
        setups[route] = RouteSetup(route, base, tokens, window, per_fork, count)
        windows[model(route, "plain")] = PLAIN_WINDOW
        windows[model(route, "ckpt")] = setups[route].window
        print(
            f"# {route}: {len(base.steps)} steps, {tokens:,} tokens, {per_fork} steps per fork",
            file=sys.stderr,
            flush=True,
        )

    tmp = Path(tempfile.mkdtemp(prefix="bench-mlatency-"))
    env = {}
    if provider.loader.directories:
        env["TIKTOKEN_CACHE_DIR"] = str(provider.loader.directories[0])
    mock_port, proxy_port = free_port(), free_port()
    mock = Target(
        "direct",
        f"http://127.0.0.1:{mock_port}",
        "/health",
        pinned(CLIENT_CPU, [PY, "-m", "bench.mock_upstream", "--port", str(mock_port)]),
    )
    config = proxy_config(tmp / "proxy.yaml", mock_port, tmp / "checkpoints.db", windows)
    proxy = Target(
        "proxy",
        f"http://127.0.0.1:{proxy_port}",
        "/healthz",
        pinned(
            PROXY_CPU,
            [PY, "-m", "compaction_proxy", "serve", "--config", str(config)]
            + ["--port", str(proxy_port)],
        ),
        env=env,
    )
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > int(CLIENT_CPU):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})

    async def run() -> dict[tuple[str, str, str], Series]:
        assert proxy.proc is not None
        client = Client(mock.base, proxy.base, ProxyCpu(proxy.proc.pid))
        try:
            for setup in setups.values():
                await prime(client, setup)
            return await measure(client, setups, plan)
        finally:
            await client.close()

    try:
        for target in (mock, proxy):
            start(target, tmp / f"{target.name}.log")
        for target in (mock, proxy):
            wait_ready(target, 60)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        series = asyncio.run(run())
    finally:
        for target in (proxy, mock):
            stop(target)
    total = sum(len(s.proxy) for s in series.values())
    notes = [
        f"{total} proxied requests, every reply the same bytes as its direct twin's, and "
        "every one with the report headers its case means: "
        "`first request` and `pass-over` nothing compacted and no checkpoint (strategies "
        "`none`); `checkpoint hit` the checkpoint found (strategies `checkpoint`) and nothing "
        "compacted again; the compaction cases a strategy fired and a new checkpoint made.",
        "A checkpoint hit forwards the checkpoint's view (about half the budget) where the "
        "direct twin sends the whole session: the mock reads less from the proxy than from "
        "the client on those rows.",
    ]
    text = render(
        argv if argv is not None else sys.argv[1:],
        plan,
        setups,
        series,
        (load_before, os.getloadavg()),
        time.monotonic() - began,
        notes,
    )
    print(text)
    out = args.out if args.out.is_absolute() else REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"# written to {out}; logs in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    main()
