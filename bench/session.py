"""The simulated agent sessions of the integration tests, run longer and reported.

Real processes on loopback: the fake upstream (enforcing the window, also the summarizer) and
the proxy with SQLite checkpoints. Each tool step of the agent is a new request. Two shapes:

- `--mode turns` (default): a user turn every few steps, an 8k window;
- `--mode loop`: one task message, then one tool step per request in the same turn (a coding
  agent), a 32k window, every other tool result ~850 tokens.

Reports requests, compaction events, summarizer calls, forwarded tokens against the raw
conversation's tokens, and the share of requests whose forwarded messages extend the previous
request's unchanged (what keeps an upstream prompt cache warm).

    python -m bench.session [--mode turns|loop] [--requests 300] [--no-summarizer]
                            [--out bench/results/session.md]

`--latency`: the agent loop on a 16k window, timed, with a summarizer that takes
`--summarizer-delay-ms` (2 s), a model that takes 250 ms and a tool that takes 250 ms, run with
and without `summarization.prepare`: how much longer the compaction turns take than ordinary
ones (p50 and max), and the summarizer calls per event.

    python -m bench.session --latency [--requests 60] [--out bench/results/session-prepare.md]

`--matrix`: what compaction keeps, with LibreChat's `summarization:` example pasted as its docs
give it and only `models: {<name>: {context_window: W}}` besides, for chat sessions (a rule in
every user message, ~900-token tool results) and single-turn agent loops, at 8k, 32k and 128k
windows, with the summarizer and without (`enabled: false`), and with the summarizer and
`compaction.carry_user_messages: 0` (the carry off): summarizer calls per request,
compaction events, the prefix-stable share, summaries forwarded after the first, responses
naming a summarization whose summary was not forwarded, facts and user rules carried to the
last request, forwarded against raw tokens (tests/support/trust_session.py drives them).

    python -m bench.session --matrix [--windows 8k,32k,128k] [--out bench/results/...]

`--learned-window`: a small local model the proxy knows nothing about: a 4,096-token window
it learns from the upstream's first refusal (no `models:` entry) and a tokenizer that counts
1.63x the proxy's (`--token-scale`: the calibration it measures from `usage`). The turns
session over 60 requests; how many compactions were summaries and how many only truncation,
and the summarizer calls that were refused as too long.

    python -m bench.session --learned-window [--requests 60] [--token-scale 1.63]

`--full-disk`: the checkpoint store's disk full (no file of the proxy can grow: RLIMIT_FSIZE
on the proxy process, as tests/reliability does) against a working one: summarizer calls for
15 requests of one conversation on a 4,096-token window, compaction events and checkpoint hits.

    python -m bench.session --full-disk [--requests 15]

`--prose`: the exact strings and rules kept with a summarizer that writes prose, ledger on and
off (bench/session_prose.py): `python -m bench.session --prose [--requests 120]`
"""

from __future__ import annotations

import argparse
import datetime
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.session_prose import prose_report
from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from tests.reliability.limits import PipedProxy
from tests.support.agent_loop import run_loop
from tests.support.agent_session import SessionReport, run_session
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)
from tests.support.timed_loop import Session, drive
from tests.support.trust_session import (
    LIBRECHAT_BLOCK,
    LIBRECHAT_UPSTREAM,
    TrustReport,
    run_trust_session,
)


@dataclass(frozen=True)
class Shape:
    window: int
    model: str
    max_output: int


SHAPES = {
    "turns": Shape(8_000, "agent-8k", 1_000),
    "loop": Shape(32_000, "agent-32k", 2_000),
}


@dataclass
class Figures:
    """What both shapes report, one row per request."""

    sent: list[list[dict[str, Any]]]  # the raw conversation of each request
    forwarded: list[list[dict[str, Any]]]
    checkpoints: list[str]
    strategies: list[str]
    prompt_tokens: list[int]
    summarizer_calls: int


def run(args: argparse.Namespace, shape: Shape, work: Path) -> Figures:
    upstream = UpstreamServer(work / "upstream.log", context_window=shape.window).start()
    config = proxy_config(
        upstream_entry(upstream),
        models={
            shape.model: {"context_window": shape.window, "max_output_tokens": shape.max_output}
        },
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization={
            "enabled": not args.no_summarizer,
            "maxSummaryTokens": 800 if args.mode == "turns" else 1_000,
            "retainRecent": {"turns": 2},
        },
    )
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        client = proxy.openai_client()
        if args.mode == "loop":
            loop = run_loop(client, upstream, model=shape.model, steps=args.requests)
            final = loop.conversation
            return Figures(
                sent=[final[: 2 + 2 * s.index] for s in loop.steps],
                forwarded=[s.forwarded for s in loop.steps],
                checkpoints=[s.checkpoint for s in loop.steps],
                strategies=[s.strategies for s in loop.steps],
                prompt_tokens=[s.prompt_tokens for s in loop.steps],
                summarizer_calls=loop.summarizer_calls,
            )
        session = run_session(
            client,
            upstream,
            model=shape.model,
            requests=args.requests,
            tool_output_chars=args.tool_output_chars,
            turn_every=args.turn_every,
        )
        final = session.final_conversation
        return Figures(
            sent=[final[: s.sent] for s in session.steps],
            forwarded=[s.forwarded for s in session.steps],
            checkpoints=[s.checkpoint for s in session.steps],
            strategies=[s.strategies for s in session.steps],
            prompt_tokens=[s.prompt_tokens for s in session.steps],
            summarizer_calls=session.summarizer_calls,
        )
    finally:
        proxy.stop()
        upstream.stop()


LATENCY_WINDOW = 16_000
LATENCY_MODEL = "agent-16k"
MODEL_DELAY_MS = 250
THINK_SECONDS = 0.25


def timed(work: Path, requests: int, summarizer_delay_ms: int, prepare: bool) -> Session:
    upstream = UpstreamServer(work / "upstream.log", context_window=LATENCY_WINDOW).start()
    config = proxy_config(
        upstream_entry(upstream),
        models={LATENCY_MODEL: {"context_window": LATENCY_WINDOW, "max_output_tokens": 2_000}},
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization={
            "enabled": True,
            "maxSummaryTokens": 600,
            "retainRecent": {"turns": 2},
            "timeout": 30,
            "prepare": {"type": "token_ratio", "value": 0.6} if prepare else False,
        },
    )
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        upstream.control(summarizer_delay_ms=summarizer_delay_ms, delay_ms=MODEL_DELAY_MS)
        client = proxy.openai_client()
        return drive(
            [client],
            upstream,
            model=LATENCY_MODEL,
            steps=requests,
            think_seconds=THINK_SECONDS,
            settle_seconds=summarizer_delay_ms / 1000 + 3,
        )
    finally:
        proxy.stop()
        upstream.stop()


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def latency_report(args: argparse.Namespace) -> str:
    rows = []
    p50_gap: dict[bool, float] = {}
    for prepare in (False, True):
        work = Path(tempfile.mkdtemp(prefix="session-latency-"))
        session = timed(work, args.requests, args.summarizer_delay_ms, prepare)
        events = [s.seconds for s in session.events]
        ordinary = [s.seconds for s in session.ordinary]
        p50_gap[prepare] = _ms(events, 0.5) - _ms(ordinary, 0.5)
        rows.append(
            f"| {'on (0.6)' if prepare else 'off'} | {len(session.steps)} | {len(events)} | "
            f"{session.summarizer_calls} | {_ms(ordinary, 0.5):.0f} | {_ms(ordinary, 1.0):.0f} | "
            f"{_ms(events, 0.5):.0f} | {_ms(events, 1.0):.0f} | {p50_gap[prepare]:+.0f} | "
            f"{sum(1 for s in session.events if s.prepared == 'ready')} | "
            f"{session.stable_share():.1%} |"
        )
    met = abs(p50_gap[True]) <= 5
    command = (
        f"python -m bench.session --latency --requests {args.requests} "
        f"--summarizer-delay-ms {args.summarizer_delay_ms}"
    )
    lines = [
        "# Compaction-turn latency with and without prepared summaries",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `{command}`",
        f"- Agent loop (one task, one tool step per request), window {LATENCY_WINDOW:,} tokens, "
        f"summarizer {args.summarizer_delay_ms} ms, model {MODEL_DELAY_MS} ms per reply, "
        f"tool {THINK_SECONDS * 1000:.0f} ms between requests; real processes, SQLite.",
        "- Times are the client's wall time per request (model time included); the compaction "
        "turn is the request answered with `X-Compaction-Checkpoint: new`.",
        "",
        "| prepare | requests | compaction turns | summarizer calls | ordinary p50 ms | "
        "ordinary max ms | compaction p50 ms | compaction max ms | compaction - ordinary p50 ms "
        "| turns that used a prepared summary | prefix stable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Target (compaction turns within 5 ms of ordinary turns at p50 when a prepared "
        f"summary exists): {'met' if met else 'not met'} ({p50_gap[True]:+.0f} ms with prepare, "
        f"{p50_gap[False]:+.0f} ms without).",
    ]
    return "\n".join(lines) + "\n"


WINDOWS = {"8k": 8_192, "32k": 32_768, "128k": 131_072}
MATRIX_REQUESTS = {
    ("chat", "8k"): 130,
    ("loop", "8k"): 80,
    ("chat", "32k"): 200,
    ("loop", "32k"): 160,
    ("chat", "128k"): 420,
    ("loop", "128k"): 360,
}
"""Requests per run: a chat request is half a turn (65 turns at 8k, 100 at 32k); the 128k runs
are long enough to pass the trigger a few times."""


def trust_run(
    work: Path, shape: str, window: int, summarizer: bool, requests: int, carry: bool = True
) -> TrustReport:
    upstream = UpstreamServer(work / "upstream.log", context_window=window).start()
    model = f"acc-{window // 1024}k"
    block = dict(LIBRECHAT_BLOCK) if summarizer else {**LIBRECHAT_BLOCK, "enabled": False}
    extra = {} if carry else {"compaction": {"carry_user_messages": 0}}
    config = proxy_config(
        upstream_entry(upstream, name=LIBRECHAT_UPSTREAM),
        models={model: {"context_window": window}},
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization=block,
        **extra,
    )
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        return run_trust_session(
            proxy.openai_client(),
            upstream,
            model=model,
            shape=shape,  # type: ignore[arg-type]
            requests=requests,
        )
    finally:
        proxy.stop()
        upstream.stop()


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def matrix_report(args: argparse.Namespace) -> str:
    tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
        "o200k_base"
    )
    rows = []
    for label in args.windows.split(","):
        window = WINDOWS[label]
        for shape in ("chat", "loop"):
            for summarizer, carry in ((True, True), (True, False), (False, True)):
                requests = MATRIX_REQUESTS[(shape, label)]
                work = Path(tempfile.mkdtemp(prefix=f"matrix-{shape}-{label}-"))
                report = trust_run(work, shape, window, summarizer, requests, carry)
                raw = sum(
                    tokenizer.count_messages(s.raw) + tokenizer.reply_priming for s in report.steps
                )
                forwarded = sum(s.prompt_tokens for s in report.steps)
                calls = report.summarizer_calls
                rows.append(
                    f"| {shape} | {label} | {'yes' if summarizer else 'no'} | "
                    f"{'on' if carry else 'off'} | {report.requests} | "
                    f"{calls} | {calls / report.requests:.3f} | {report.events} | "
                    f"{report.stable_share():.0%} | {_share(report.summary_share())} | "
                    f"{len(report.false_summary_reports())} | {report.facts_carried():.0%} | "
                    f"{report.rules_carried():.0%} | {forwarded / raw:.0%} |"
                )
                print(rows[-1], flush=True)
    command = f"python -m bench.session --matrix --windows {args.windows}"
    lines = [
        "# What compaction keeps: LibreChat's block verbatim, chat sessions and agent loops",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `{command}`",
        "- Config: LibreChat's `summarization:` example exactly as its docs give it "
        "(`maxSummaryTokens: 4096`, `reserveRatio: 0.05`, trigger `token_ratio` 0.8, its "
        "`contextPruning` block), `models: {acc-Nk: {context_window: N}}` and nothing else; "
        '"summarizer: no" adds `enabled: false`; "carry: off" adds `compaction: '
        "{carry_user_messages: 0}`. Real processes, SQLite checkpoints; the fake "
        "upstream enforces the window and plays the summarizer (its summary lists the FACT "
        "tokens it was shown, never the rules).",
        "- chat: two requests per turn (the user's message stating `keep RULE-n as it is`, "
        "then the tool call and its ~900-token result); loop: one task (with a rule), then one "
        "tool step per request (results alternate ~900 and ~110 tokens).",
        "- summaries kept: of the requests after the first one forwarded with a summary, the "
        "share forwarded with one; false reports: responses whose `X-Compaction-Strategies` "
        "names summarization while the forwarded request holds no summary; facts and rules: "
        "the share present in the last forwarded request.",
        "",
        "| shape | window | summarizer | carry | requests | summarizer calls | "
        "calls per request | events | prefix stable | summaries kept | false reports | "
        "facts carried | rules carried | forwarded / raw |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines) + "\n"


LEARNED_WINDOW = 4_096
LEARNED_MODEL = "local-4k"


@dataclass
class LearnedFigures:
    """The `--learned-window` run: each response's strategies and checkpoint, and what the
    upstream saw of the summarizer."""

    strategies: list[str]
    checkpoints: list[str]
    summarizer_calls: int
    summarizer_refused: int


def learned_run(work: Path, requests: int, scale: float) -> LearnedFigures:
    upstream = UpstreamServer(work / "upstream.log", context_window=LEARNED_WINDOW).start()
    config = proxy_config(
        upstream_entry(upstream),
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization={"enabled": True, "retainRecent": {"turns": 2}},
    )
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        upstream.control(token_scale=scale)
        session = run_session(
            proxy.openai_client(),
            upstream,
            model=LEARNED_MODEL,
            requests=requests,
            tool_output_chars=300,
            turn_every=4,
        )
        refused = sum(
            1 for e in upstream.events() if e.get("type") == "refused" and e.get("summarizer")
        )
        return LearnedFigures(
            strategies=[s.strategies for s in session.steps],
            checkpoints=[s.checkpoint for s in session.steps],
            summarizer_calls=session.summarizer_calls,
            summarizer_refused=refused,
        )
    finally:
        proxy.stop()
        upstream.stop()


def learned_report(args: argparse.Namespace) -> str:
    figures = learned_run(
        Path(tempfile.mkdtemp(prefix="session-learned-")), args.requests, args.token_scale
    )
    compacted = [
        set(s.split(","))
        for s, c in zip(figures.strategies, figures.checkpoints, strict=True)
        if c != "hit" and s not in ("", "none")
    ]
    summaries = sum(1 for s in compacted if "summarization" in s)
    command = (
        f"python -m bench.session --learned-window --requests {args.requests} "
        f"--token-scale {args.token_scale}"
    )
    lines = [
        "# A small local model, its window learned from a refusal",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `{command}`",
        f"- The fake upstream enforces a {LEARNED_WINDOW:,}-token window and counts every prompt "
        f"{args.token_scale}x the proxy's count; the proxy has no `models:` entry (it learns the "
        "window from the first refusal and the ratio from `usage`), summarization on with "
        "`retainRecent: {turns: 2}`, SQLite checkpoints. The turns session (a user turn every 4 "
        "requests, 300-character tool results). Real processes.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {len(figures.strategies)} |",
        f"| compactions (responses whose strategies changed the request, hits excluded) | "
        f"{len(compacted)} |",
        f"| of which summaries (`summarization` in `X-Compaction-Strategies`) | {summaries} |",
        f"| of which without a summary (truncation and the like) | {len(compacted) - summaries} |",
        f"| summarizer calls | {figures.summarizer_calls} |",
        f"| summarizer calls the upstream refused as too long | {figures.summarizer_refused} |",
        f"| checkpoint hits | {sum(1 for c in figures.checkpoints if c == 'hit')} |",
    ]
    return "\n".join(lines) + "\n"


FULL_DISK_WINDOW = 4_096
FULL_DISK_MODEL = "local-4k"


def full_disk_run(work: Path, requests: int, full: bool) -> SessionReport:
    upstream = UpstreamServer(work / "upstream.log", context_window=FULL_DISK_WINDOW).start()
    config = proxy_config(
        upstream_entry(upstream),
        models={FULL_DISK_MODEL: {"context_window": FULL_DISK_WINDOW}},
        store={"backend": "sqlite", "path": str(work / "data" / "checkpoints.db")},
        summarization={"enabled": True, "retainRecent": {"turns": 2}},
    )
    proxy = PipedProxy(write_config(work / "proxy.yaml", config), work / "proxy.log")
    proxy.start()
    try:
        client = proxy.openai_client()
        # A first small request opens the store (its file and schema); then the disk fills.
        client.chat.completions.create(
            model=FULL_DISK_MODEL,
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "ready?"},
            ],
        )
        if full:
            proxy.fill_disk(1)
        upstream.clear()
        return run_session(
            client,
            upstream,
            model=FULL_DISK_MODEL,
            requests=requests,
            tool_output_chars=1_500,
            turn_every=3,
        )
    finally:
        proxy.stop()
        upstream.stop()


def full_disk_report(args: argparse.Namespace) -> str:
    rows = []
    for full in (False, True):
        work = Path(tempfile.mkdtemp(prefix="session-full-disk-"))
        session = full_disk_run(work, args.requests, full)
        checkpoints = [s.checkpoint for s in session.steps]
        summaries = sum(1 for s in session.steps if "summarization" in s.strategies.split(","))
        rows.append(
            f"| {'full' if full else 'working'} | {len(session.steps)} | "
            f"{session.summarizer_calls} | {summaries} | {checkpoints.count('new')} | "
            f"{checkpoints.count('hit')} |"
        )
    lines = [
        "# Summarizer calls with the checkpoint store's disk full",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `python -m bench.session --full-disk --requests {args.requests}`",
        f"- One conversation (the turns session: a user turn every 3 requests, 1,500-character "
        f"tool results) on a {FULL_DISK_WINDOW:,}-token window, summarization on, SQLite "
        'checkpoints; "full": after one small request no file of the proxy can grow '
        "(RLIMIT_FSIZE). Real processes.",
        "",
        "| disk | requests | summarizer calls | responses naming summarization | "
        "X-Compaction-Checkpoint: new | hits |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(SHAPES), default="turns")
    parser.add_argument("--requests", type=int, default=None, help="300; --prose: 120")
    parser.add_argument("--tool-output-chars", type=int, default=300, help="turns mode only")
    parser.add_argument("--turn-every", type=int, default=4, help="turns mode only")
    parser.add_argument("--no-summarizer", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--latency", action="store_true", help="prepare on/off, timed")
    parser.add_argument("--summarizer-delay-ms", type=int, default=2_000)
    parser.add_argument("--matrix", action="store_true", help="what compaction keeps")
    parser.add_argument("--windows", default="8k,32k,128k", help="matrix only")
    parser.add_argument("--learned-window", action="store_true", help="a learned 4k window")
    parser.add_argument("--token-scale", type=float, default=1.63, help="learned-window only")
    parser.add_argument("--full-disk", action="store_true", help="the store's disk full")
    parser.add_argument("--prose", action="store_true", help="prose summaries, ledger on/off")
    args = parser.parse_args()
    args.requests = args.requests or (120 if args.prose else 300)
    special = (
        (args.prose, prose_report),
        (args.full_disk, full_disk_report),
        (args.learned_window, learned_report),
        (args.matrix, matrix_report),
        (args.latency, latency_report),
    )
    for chosen, report in special:
        if chosen:
            _emit(report(args), args.out)
            return
    shape = SHAPES[args.mode]
    figures = run(args, shape, Path(tempfile.mkdtemp(prefix="session-bench-")))

    tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
        "o200k_base"
    )
    raw = [tokenizer.count_messages(sent) + tokenizer.reply_priming for sent in figures.sent]
    raw_total, forwarded_total = sum(raw), sum(figures.prompt_tokens)
    stable = [
        after[: len(before)] == before
        for before, after in zip(figures.forwarded, figures.forwarded[1:], strict=False)
    ]
    events = sum(1 for c in figures.checkpoints if c == "new")
    summarized = sum(
        1
        for c, s in zip(figures.checkpoints, figures.strategies, strict=True)
        if c == "new" and "summarization" in s.split(",")
    )
    command = f"python -m bench.session --mode {args.mode} --requests {args.requests}"
    if args.mode == "turns":
        command += f" --tool-output-chars {args.tool_output_chars} --turn-every {args.turn_every}"
    if args.no_summarizer:
        command += " --no-summarizer"
    shape_text = (
        "one task message, then one tool step per request in the same turn, every other "
        "tool result ~850 tokens"
        if args.mode == "loop"
        else f"a user turn every {args.turn_every} requests, tool results of "
        f"{args.tool_output_chars} characters"
    )
    lines = [
        f"# Simulated agent session through the proxy ({args.mode})",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `{command}`",
        f"- Session: {shape_text}.",
        f"- Upstream window {shape.window:,} tokens (enforced: the upstream answers 400 past it), "
        f"max output {shape.max_output:,}; default pipeline (fire at 0.8, compact to 0.5), "
        + ("no summarizer" if args.no_summarizer else "summarization with retainRecent 2")
        + ", SQLite checkpoints.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {len(raw)} |",
        f"| requests whose raw conversation exceeds the window | "
        f"{sum(1 for r in raw if r > shape.window)} |",
        "| requests that failed | 0 (the run raises on any error) |",
        f"| compaction events (X-Compaction-Checkpoint: new) | {events} |",
        f"| events where summarization acted | {summarized} |",
        f"| summarizer calls | {figures.summarizer_calls} |",
        f"| checkpoint hits | {sum(1 for c in figures.checkpoints if c == 'hit')} |",
        f"| largest raw conversation, tokens | {max(raw):,} |",
        f"| largest forwarded prompt (upstream usage), tokens | {max(figures.prompt_tokens):,} |",
        f"| raw prompt tokens, summed over requests | {raw_total:,} |",
        f"| forwarded prompt tokens (upstream usage), summed | {forwarded_total:,} |",
        f"| forwarded / raw | {forwarded_total / raw_total:.1%} |",
        f"| requests extending the previous forwarded request unchanged | "
        f"{sum(stable)} of {len(stable)} ({sum(stable) / max(1, len(stable)):.1%}) |",
    ]
    _emit("\n".join(lines) + "\n", args.out)


def _emit(text: str, out: Path | None) -> None:
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
