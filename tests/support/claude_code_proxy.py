"""Claude Code through the proxy to the fake Messages model, and what every party saw of it.

tests/integration/test_claude_code_proxy.py asserts on a :class:`ProxiedRun`; ``python -m
tests.support.claude_code_proxy`` runs the same sessions on servers of its own and prints their
figures (requests, compaction events, checkpoint hits, cache-read shares, wall time), the way
``python -m tests.support.claude_code baseline`` does without the proxy.

The set-up is what a user writes: one upstream entry at the fake's ``/v1`` (the client's
``x-api-key`` passes through), the window declared in ``models:``, the SQLite store, and the
default pipeline with its summarizer on the request's own upstream and model.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.observability.traffic import parse_metrics
from tests.support.claude_code import DEFAULT_MODEL, Session, loop_prompt, run_session
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer, cache_share
from tests.support.servers import Event, ProxyServer, Recorded, proxy_config, upstream_entry

Metrics = dict[str, dict[tuple[tuple[str, str], ...], float]]


def config(fake: MessagesUpstreamServer, db: Path, window: int) -> dict[str, Any]:
    """The proxy's configuration: nothing but the upstream, the store and the window."""
    return proxy_config(
        upstream_entry(fake.url + "/v1", name="local"),
        store={"backend": "sqlite", "path": str(db)},
        models={DEFAULT_MODEL: {"context_window": window}},
    )


@dataclass(frozen=True)
class Turn:
    """One of Claude Code's requests: the proxy's access line and the fake's usage for it."""

    access: dict[str, Any]
    usage: dict[str, Any]

    @property
    def event(self) -> bool:
        """The proxy compacted anew here (anything but forwarding its stored checkpoint)."""
        return any(name != "checkpoint" for name in self.access.get("strategies") or [])

    @property
    def hit(self) -> bool:
        """The proxy forwarded its stored checkpoint and the steps after it, nothing new."""
        return self.access.get("strategies") == ["checkpoint"]

    @property
    def prompt(self) -> int:
        u = self.usage
        return int(
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        )


@dataclass(frozen=True)
class ProxiedRun:
    """One Claude Code session through the proxy, and what every party recorded of it."""

    name: str
    session: Session
    events: list[Event]
    requests: list[Recorded]
    turns: list[Turn]
    metrics: Metrics

    def refused(self) -> list[Event]:
        return [e for e in self.events if e["type"] == "refused"]

    def rejected(self) -> list[Event]:
        return [e for e in self.events if e["type"] == "rejected"]

    def claude_requests(self) -> list[Recorded]:
        """What the proxy forwarded for Claude Code (it always streams; summaries do not)."""
        return [r for r in self.requests if r.path == MESSAGES and r.json().get("stream") is True]

    def summary_calls(self) -> list[Recorded]:
        """Everything else the fake received: the proxy's own calls."""
        return [r for r in self.requests if r.json().get("stream") is not True]

    def hits_after_first_event(self) -> list[tuple[Turn, Turn]]:
        """(previous, hit) for every checkpoint hit once the proxy has compacted."""
        first = next((i for i, t in enumerate(self.turns) if t.event), len(self.turns))
        later = self.turns[first:]
        return [(before, turn) for before, turn in itertools.pairwise(later) if turn.hit]

    def describe(self) -> str:
        """The figures, one line."""
        events = sum(t.event for t in self.turns)
        hits = [turn for _, turn in self.hits_after_first_event()]
        every = cache_share([t.usage for t in self.turns]).share
        between = cache_share([t.usage for t in hits]).share
        return (
            f"{self.name}: {self.session.describe()}; fake: {len(self.requests)} requests "
            f"({len(self.summary_calls())} summary calls), {len(self.refused())} refused, "
            f"{len(self.rejected())} rejected; proxy: {events} events, {len(hits)} checkpoint "
            f"hits; cache-read share {every:.1%} over all requests, {between:.1%} over the hits"
        )


def access_lines(proxy: ProxyServer, offset: int) -> list[dict[str, Any]]:
    lines = []
    for line in proxy.log_text(offset).splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("logger") == "compaction_proxy.access" and entry.get("path") == MESSAGES:
            lines.append(entry)
    return lines


def run_through(
    claude: Path,
    fake: MessagesUpstreamServer,
    proxy: ProxyServer,
    *,
    name: str,
    steps: int,
    workdir: Path,
    disable_auto_compact: bool,
) -> ProxiedRun:
    """The fake's loop of ``steps`` Bash steps, Claude Code at ``proxy``, the proxy at ``fake``
    (reset first), read back from all three."""
    fake.reset()
    offset = proxy.log_size()
    session = run_session(
        claude,
        proxy.url,  # the root: Claude Code adds /v1 itself
        loop_prompt(steps),
        workdir=workdir,
        disable_auto_compact=disable_auto_compact,
    )
    answered = [e for e in fake.events() if e["type"] == "answered" and e.get("stream")]
    # The access line is written once the reply has gone out; give the last one time to land.
    deadline = time.monotonic() + 15.0
    lines = access_lines(proxy, offset)
    while len(lines) < len(answered) and time.monotonic() < deadline:
        time.sleep(0.05)
        lines = access_lines(proxy, offset)
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        metrics = parse_metrics(http.get("/metrics").text)
    # Claude Code sends one request at a time, so the proxy's lines and the fake's answers pair
    # up in order (summary calls are neither: not in the access log, and never streamed).
    if len(lines) != len(answered):
        raise AssertionError(
            f"{len(lines)} access lines for {len(answered)} answers: {session.describe()}"
        )
    turns = [Turn(line, event["usage"]) for line, event in zip(lines, answered, strict=True)]
    return ProxiedRun(name, session, fake.events(), fake.requests(), turns, metrics)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the session through a proxy of its own, with and without Claude Code's
    auto-compact, and prints the figures."""
    import argparse
    import tempfile

    from tests.support.claude_code import Unavailable, ensure_binary
    from tests.support.servers import write_config

    parser = argparse.ArgumentParser(prog="python -m tests.support.claude_code_proxy")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--window", type=int, default=65_536)
    args = parser.parse_args(argv)
    try:
        claude = ensure_binary()
    except Unavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="claude-code-proxy-") as scratch:
        root = Path(scratch)
        fake = MessagesUpstreamServer(root / "fake.log", context_window=args.window)
        fake.start()
        try:
            for name, off in (("auto_compact", False), ("auto_compact_off", True)):
                path = write_config(
                    root / f"{name}.yaml", config(fake, root / f"{name}.db", args.window)
                )
                proxy = ProxyServer(path, root / f"{name}.log")
                proxy.start()
                try:
                    run = run_through(
                        claude,
                        fake,
                        proxy,
                        name=name,
                        steps=args.steps,
                        workdir=root / name,
                        disable_auto_compact=off,
                    )
                finally:
                    proxy.stop()
                print(run.describe(), flush=True)
        finally:
            fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
