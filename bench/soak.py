"""A bounded soak: many open streams, then a mixed load, with the proxy's memory sampled.

Not a test: it asserts nothing and writes a report for people to read. Real processes on
127.0.0.1 only: the fake upstream (tests/fakes/upstream.py, recording off) and the proxy
(``python -m proxy serve``, SQLite checkpoints in a temporary directory). Phases:

1. warm-up, then the idle RSS;
2. ``--streams`` (300) concurrent streaming chat requests, each streaming for ``--stream-seconds``
   (the fake's ``X-Fake-Chunks`` / ``X-Fake-Chunk-Delay-Ms``): RSS with all of them open;
3. a mixed load for ``--soak-seconds`` (30) from ``--workers`` closed-loop clients: plain and
   streamed chat, growing agent conversations past an 8k window (compacted, summarizer called),
   previews, pass-through routes, upstream errors, hostile bodies, clients leaving mid-stream;
4. settle, then the idle RSS again.

The proxy's RSS (VmRSS of its process and any children, from /proc) is sampled every second
throughout. Every phase has a deadline: the run stops by itself.

    python -m bench.soak [--streams 300] [--stream-seconds 20] [--soak-seconds 30]
                         [--workers 8] [--out bench/results/soak.md]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

MODEL = "soak-8k"
WINDOW = 8192
CHUNK_DELAY_MS = 1000
HANG_BOUND = 120.0  # seconds any one request may take before it counts as an error


# --------------------------------------------------------------------------- memory


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` and its descendants, in kB (0 for a process that is gone)."""
    total = 0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except FileNotFoundError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            stack.extend(int(child) for child in task.read_text().split())
    return total


@dataclass
class Sample:
    at: float  # seconds since the run began
    phase: str
    rss_kb: int
    open_streams: int


@dataclass
class Run:
    """Everything the report needs; filled in as the phases go."""

    pid: int
    started: float = field(default_factory=time.monotonic)
    phase: str = "start"
    open_streams: int = 0
    samples: list[Sample] = field(default_factory=list)
    done: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    compacted: int = 0  # agent turns the proxy compacted (X-Compaction-Strategies not none)
    marks: dict[str, float] = field(default_factory=dict)

    def sample(self) -> Sample:
        sample = Sample(
            time.monotonic() - self.started, self.phase, rss_kb(self.pid), self.open_streams
        )
        self.samples.append(sample)
        return sample

    def rss_in(self, phase: str, *, open_at_least: int = 0) -> list[int]:
        return [
            s.rss_kb for s in self.samples if s.phase == phase and s.open_streams >= open_at_least
        ]


async def sampler(run: Run, stop: asyncio.Event) -> None:
    """One RSS sample a second until ``stop``."""
    while not stop.is_set():
        run.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


# --------------------------------------------------------------------------- requests


def filler(label: str, words: int) -> str:
    return " ".join(f"{label}{i % 89}" for i in range(words))


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def stream_to_end(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, bool]:
    """Status and whether ``[DONE]`` arrived."""
    async with session.post(url, json=body, headers=headers) as response:
        tail = b""
        async for chunk in response.content.iter_any():
            tail = (tail + chunk)[-64:]
        return response.status, b"[DONE]" in tail


async def hold_stream(
    run: Run, session: aiohttp.ClientSession, base: str, index: int, chunks: int
) -> None:
    """One of the long streams of phase 2; counted open from its first byte to its end."""
    body = chat(f"long stream {index}", stream=True)
    headers = {"X-Fake-Chunks": str(chunks), "X-Fake-Chunk-Delay-Ms": str(CHUNK_DELAY_MS)}
    opened = False
    try:
        async with session.post(
            base + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status != 200:
                run.errors[f"long stream: status {response.status}"] += 1
                return
            tail = b""
            async for chunk in response.content.iter_any():
                if not opened:
                    opened = True
                    run.open_streams += 1
                tail = (tail + chunk)[-64:]
            if b"[DONE]" in tail:
                run.done["long stream"] += 1
            else:
                run.errors["long stream: ended without [DONE]"] += 1
    except (aiohttp.ClientError, TimeoutError) as error:
        run.errors[f"long stream: {type(error).__name__}"] += 1
    finally:
        if opened:
            run.open_streams -= 1


class MixedLoad:
    """The request kinds of phase 3, taken in a fixed rotation by each worker."""

    def __init__(self, run: Run, session: aiohttp.ClientSession, base: str) -> None:
        self.run, self.session, self.base = run, session, base
        self.agents: dict[int, list[dict[str, Any]]] = {}
        self.kinds: list[tuple[str, Callable[[int, int], Awaitable[bool]]]] = [
            ("chat", self.plain_chat),
            ("chat stream", self.chat_stream),
            ("agent turn", self.agent_turn),
            ("chat", self.plain_chat),
            ("preview", self.preview),
            ("GET /v1/models", self.models),
            ("agent turn", self.agent_turn),
            ("embeddings", self.embeddings),
            ("upstream 429 relayed", self.upstream_error),
            ("hostile body (400)", self.hostile),
            ("client leaves mid-stream", self.leave_mid_stream),
        ]

    async def worker(self, worker: int, deadline: float) -> None:
        n = 0
        while time.monotonic() < deadline:
            kind, call = self.kinds[n % len(self.kinds)]
            n += 1
            try:
                ok = await asyncio.wait_for(call(worker, n), HANG_BOUND)
            except (aiohttp.ClientError, TimeoutError) as error:
                self.run.errors[f"{kind}: {type(error).__name__}"] += 1
                continue
            if ok:
                self.run.done[kind] += 1

    async def _post(
        self,
        kind: str,
        path: str,
        body: Any,
        expect: int,
        headers: dict[str, str] | None = None,
        *,
        count_compacted: bool = False,
    ) -> bool:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        async with self.session.post(self.base + path, data=data, headers=all_headers) as reply:
            content = await reply.read()
            if reply.status != expect:
                self.run.errors[f"{kind}: status {reply.status}"] += 1
                return False
            if b"Traceback" in content:
                self.run.errors[f"{kind}: traceback in body"] += 1
                return False
            if count_compacted and reply.headers.get("x-compaction-strategies", "none") != "none":
                self.run.compacted += 1
            return True

    async def plain_chat(self, worker: int, n: int) -> bool:
        return await self._post("chat", "/v1/chat/completions", chat(f"hello {worker}/{n}"), 200)

    async def chat_stream(self, worker: int, n: int) -> bool:
        status, finished = await stream_to_end(
            self.session,
            self.base + "/v1/chat/completions",
            chat(f"stream {worker}/{n}", stream=True),
            {"X-Fake-Chunks": "8", "X-Fake-Chunk-Delay-Ms": "10"},
        )
        if status != 200 or not finished:
            self.run.errors[f"chat stream: status {status}, [DONE] {finished}"] += 1
            return False
        return True

    async def agent_turn(self, worker: int, n: int) -> bool:
        """A conversation that grows by a tool step per request; a new one after 60 steps."""
        messages = self.agents.get(worker)
        if messages is None or len(messages) > 4 * 60:
            messages = [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"task {worker}/{n}: fix the failing tests"},
            ]
        step = len(messages)
        call_id = f"call_{worker}_{n}_{step}"
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "pytest"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": filler(f"w{worker}s{step}", 300)},
        ]
        self.agents[worker] = messages
        body = {"model": MODEL, "messages": messages, "max_tokens": 500}
        return await self._post(
            "agent turn", "/v1/chat/completions", body, 200, count_compacted=True
        )

    async def preview(self, worker: int, n: int) -> bool:
        messages = self.agents.get(worker) or [{"role": "user", "content": "nothing yet"}]
        body = {"model": MODEL, "messages": messages}
        return await self._post("preview", "/v1/compaction/preview", body, 200)

    async def models(self, worker: int, n: int) -> bool:
        async with self.session.get(self.base + "/v1/models") as reply:
            await reply.read()
            if reply.status != 200:
                self.run.errors[f"models: status {reply.status}"] += 1
                return False
            return True

    async def embeddings(self, worker: int, n: int) -> bool:
        body = {"model": "text-embedding-3-small", "input": [f"text {worker}/{n}"] * 4}
        return await self._post("embeddings", "/v1/embeddings", body, 200)

    async def upstream_error(self, worker: int, n: int) -> bool:
        return await self._post(
            "upstream 429",
            "/v1/chat/completions",
            chat("rate me"),
            429,
            {"X-Fake-Status": "429"},
        )

    async def hostile(self, worker: int, n: int) -> bool:
        bodies = [
            b"",
            b"[1, 2]",
            b'{"model": "soak-8k", "messages": [',
            b'{"model": 5, "messages": []}',
            b'{"model": "soak-8k", "messages": [{"role": "user", "content": [5]}]}',
            b'{"model": "soak-8k", "messages": [{"role": "user", "content": "\xff"}]}',
            b'{"model": "soak-8k", "temperature": NaN, "messages": []}',
        ]
        return await self._post(
            "hostile body", "/v1/chat/completions", bodies[n % len(bodies)], 400
        )

    async def leave_mid_stream(self, worker: int, n: int) -> bool:
        headers = {"X-Fake-Chunks": "100", "X-Fake-Chunk-Delay-Ms": "20"}
        async with self.session.post(
            self.base + "/v1/chat/completions",
            json=chat(f"leave {worker}/{n}", stream=True),
            headers=headers,
        ) as reply:
            if reply.status != 200:
                self.run.errors[f"client leaves: status {reply.status}"] += 1
                return False
            await reply.content.readany()
            reply.close()  # drop the connection mid-stream
        return True


# --------------------------------------------------------------------------- phases


async def drive(args: argparse.Namespace, run: Run, base: str) -> None:
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler(run, stop))
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=HANG_BOUND + args.stream_seconds)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run.phase = "warm-up"
        load = MixedLoad(run, session, base)
        await asyncio.gather(*(load.worker(w, time.monotonic() + 3) for w in range(2)))
        run.done.clear()
        run.errors.clear()
        run.compacted = 0

        run.phase = "idle"
        await asyncio.sleep(args.idle_seconds)

        run.phase = "streams"
        run.marks["streams opened"] = time.monotonic() - run.started
        chunks = max(1, args.stream_seconds * 1000 // CHUNK_DELAY_MS)
        streams = [
            asyncio.create_task(hold_stream(run, session, base, i, chunks))
            for i in range(args.streams)
        ]
        await asyncio.wait_for(asyncio.gather(*streams), args.stream_seconds + HANG_BOUND)
        run.marks["streams closed"] = time.monotonic() - run.started

        run.phase = "soak"
        deadline = time.monotonic() + args.soak_seconds
        await asyncio.gather(*(load.worker(w, deadline) for w in range(args.workers)))

        run.phase = "after"
        await asyncio.sleep(args.idle_seconds)
    stop.set()
    await sampling


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({model or '?'}), "
        f"Python {platform.python_version()}"
    )


def report(args: argparse.Namespace, run: Run, command: str) -> str:
    def mb(kb: float) -> str:
        return f"{kb / 1024:.1f} MB"

    idle = run.rss_in("idle")
    held = run.rss_in("streams", open_at_least=args.streams)
    soak = run.rss_in("soak")
    after = run.rss_in("after")
    idle_rss = statistics.median(idle) if idle else 0
    held_rss = max(held) if held else 0
    peak_open = max((s.open_streams for s in run.samples), default=0)
    after_rss = statistics.median(after) if after else 0
    lines = [
        "# Soak: open streams and a mixed load through the proxy",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {machine()}",
        f"- Command: `{command}`",
        "- Processes on 127.0.0.1: the fake upstream (recording off) and `python -m proxy serve` "
        "(one worker, aiohttp transport, SQLite checkpoints, log level warning); the load "
        "generator is this script (aiohttp, one process). All three share the machine.",
        f"- Phase 2: {args.streams} concurrent streaming chat requests, one chunk every "
        f"{CHUNK_DELAY_MS} ms for {args.stream_seconds} s each.",
        f"- Phase 3: {args.workers} closed-loop workers for {args.soak_seconds} s, rotating "
        "through the kinds listed below; the agent turns grow a conversation past the 8k "
        "window of the test model, so the proxy compacts them and calls the (fake) summarizer.",
        "- RSS: VmRSS of the proxy process (and children) from /proc, sampled every second.",
        "",
        "## Memory",
        "",
        "| figure | value |",
        "|---|---|",
        f"| RSS idle, after warm-up (median) | {mb(idle_rss)} |",
        f"| most streams open at once | {peak_open} |",
        f"| RSS with all {args.streams} streams open (max) | "
        + (mb(held_rss) if held else "never all open at once")
        + " |",
        "| RSS per open stream | "
        + (f"{(held_rss - idle_rss) / args.streams:.1f} kB" if held else "n/a")
        + " |",
        "| RSS during the soak: first / max / last sample | "
        + (f"{mb(soak[0])} / {mb(max(soak))} / {mb(soak[-1])}" if soak else "n/a")
        + " |",
        "| growth over the soak (last - first sample) | "
        + (f"{(soak[-1] - soak[0]) / 1024:+.1f} MB" if soak else "n/a")
        + " |",
        f"| RSS idle after everything (median) | {mb(after_rss)} |",
        f"| growth idle to idle | {(after_rss - idle_rss) / 1024:+.1f} MB |",
        "",
        "## Requests",
        "",
        "| kind | done |",
        "|---|---|",
        *[f"| {kind} | {count:,} |" for kind, count in sorted(run.done.items())],
        f"| **all** | **{sum(run.done.values()):,}** |",
        "",
        f"Agent turns the proxy compacted (`X-Compaction-Strategies` not `none`): "
        f"{run.compacted:,} of {run.done['agent turn']:,}.",
        "",
        "## Errors by kind",
        "",
    ]
    if run.errors:
        lines += ["| error | count |", "|---|---|"]
        lines += [f"| {kind} | {count:,} |" for kind, count in sorted(run.errors.items())]
    else:
        lines.append("None: every request got the status and ending it should.")
    lines += ["", "## RSS samples (every 5th second)", "", "| t (s) | phase | open streams | RSS |"]
    lines.append("|---|---|---|---|")
    for sample in run.samples[::5]:
        lines.append(
            f"| {sample.at:.0f} | {sample.phase} | {sample.open_streams} | {mb(sample.rss_kb)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--stream-seconds", type=int, default=20)
    parser.add_argument("--soak-seconds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--idle-seconds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="soak-bench-"))
    upstream = UpstreamServer(work / "upstream.log").start()
    upstream.control(record=False)
    config = proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1000}},
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
    )
    config["server"]["log_level"] = "warning"
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        assert proxy.proc is not None
        run = Run(pid=proxy.proc.pid)
        asyncio.run(drive(args, run, proxy.url))
    finally:
        proxy.stop()
        upstream.stop()
    command = (
        f"python -m bench.soak --streams {args.streams} --stream-seconds {args.stream_seconds} "
        f"--soak-seconds {args.soak_seconds} --workers {args.workers}"
    )
    text = report(args, run, command)
    print(text)
    print(f"logs: {work}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
