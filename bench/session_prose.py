"""What a new user's agent loop keeps of its exact strings when the summary is prose.

`python -m bench.session --prose`: a 120-step single-task agent loop (tests/support/
artifact_loop.py: each bash step's result holds its own file path, command, error line,
measured number and, for pytest runs, verdict line) on a 16k window, the default pipeline, and
a summarizer that writes plausible prose and copies no exact string (the fake upstream's
`summarizer: prose`). Reported per kind: the share of the folded steps' strings still in the
last forwarded request, and the task's rules; then the user's rules after 100 chat turns
(tests/support/rule_turns.py) at 8k and 32k. Each with the ledger as configured by default and
with `compaction.ledger.enabled: false`, side by side. Real processes, SQLite checkpoints.

A proxy whose configuration has no `compaction.ledger` key runs both columns without it (the
report says so): that is the "off" behaviour in both.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from compaction_proxy.compaction.settings import CompactionSettings
from tests.support.artifact_loop import KINDS, ArtifactLoop, is_ledger, run_artifact_loop
from tests.support.processes import tiktoken_cache_dir
from tests.support.rule_turns import RuleSession, run_rule_turns
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

WINDOW = 16_000
MODEL = "agent-16k"
RULE_WINDOWS = {"8k": 8_192, "32k": 32_768}
RULE_TURNS = 100
LEDGER_KNOWN = "ledger" in CompactionSettings.model_fields
"""Whether this proxy's configuration has the ledger's key at all."""


def _config(upstream: UpstreamServer, work: Path, model: str, window: int, ledger: bool) -> Any:
    compaction = {} if ledger or not LEDGER_KNOWN else {"ledger": {"enabled": False}}
    return proxy_config(
        upstream_entry(upstream),
        models={model: {"context_window": window, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization={"enabled": True, "maxSummaryTokens": 600, "retainRecent": {"turns": 2}},
        **({"compaction": compaction} if compaction else {}),
    )


def _servers(
    work: Path, window: int, model: str, ledger: bool
) -> tuple[UpstreamServer, ProxyServer]:
    upstream = UpstreamServer(work / "upstream.log", context_window=window).start()
    config = _config(upstream, work, model, window, ledger)
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    upstream.control(summarizer="prose")
    return upstream, proxy


def loop_run(steps: int, ledger: bool) -> ArtifactLoop:
    work = Path(tempfile.mkdtemp(prefix="session-prose-"))
    upstream, proxy = _servers(work, WINDOW, MODEL, ledger)
    try:
        with proxy.openai_client() as client:
            return run_artifact_loop(client, upstream, model=MODEL, steps=steps)
    finally:
        proxy.stop()
        upstream.stop()


def rules_run(label: str, ledger: bool) -> RuleSession:
    work = Path(tempfile.mkdtemp(prefix=f"session-prose-rules-{label}-"))
    model = f"rules-{label}"
    upstream, proxy = _servers(work, RULE_WINDOWS[label], model, ledger)
    try:
        with proxy.openai_client() as client:
            return run_rule_turns(client, upstream, model=model, turns=RULE_TURNS)
    finally:
        proxy.stop()
        upstream.stop()


@dataclass
class Column:
    loop: ArtifactLoop
    rules: dict[str, RuleSession]


def _share(kept: int, total: int) -> str:
    return f"{kept}/{total} ({kept / total:.1%})" if total else "-"


def _loop_rows(columns: dict[str, Column]) -> list[str]:
    tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
        "o200k_base"
    )
    loops = {name: c.loop for name, c in columns.items()}
    survival = {name: loop.survival() for name, loop in loops.items()}

    def row(label: str, values: dict[str, str]) -> str:
        return f"| {label} | " + " | ".join(values[name] for name in loops) + " |"

    def every(kind: str) -> dict[str, str]:
        return {n: _share(*survival[n][kind]) for n in loops}

    def total(name: str) -> str:
        kept = sum(k for k, _ in survival[name].values())
        return _share(kept, sum(t for _, t in survival[name].values()))

    def ledger_tokens(loop: ArtifactLoop) -> str:
        found = [m for m in loop.last.forwarded if is_ledger(m)]
        return f"{sum(tokenizer.count_messages([m]) for m in found):,}" if found else "none"

    return [
        row("requests (all answered)", {n: str(len(lp.steps)) for n, lp in loops.items()}),
        row(
            "compaction events",
            {n: str(sum(s.checkpoint == "new" for s in lp.steps)) for n, lp in loops.items()},
        ),
        row(
            "summarizer calls",
            {n: str(sum(s.summarizer_calls for s in lp.steps)) for n, lp in loops.items()},
        ),
        row("folded steps", {n: str(len(lp.folded())) for n, lp in loops.items()}),
        *(row(f"{kind} strings of folded steps still forwarded", every(kind)) for kind in KINDS),
        row("all of them", {n: total(n) for n in loops}),
        row(
            "the task's rules forwarded verbatim",
            {n: _share(*lp.rules_kept()) for n, lp in loops.items()},
        ),
        row(
            "last request's prompt tokens (upstream usage)",
            {n: f"{lp.last.prompt_tokens:,}" for n, lp in loops.items()},
        ),
        row("its `<ledger>` message, tokens", {n: ledger_tokens(lp) for n, lp in loops.items()}),
    ]


def prose_report(args: argparse.Namespace) -> str:
    columns: dict[str, Column] = {}
    for name, ledger in (("ledger on (default)", True), ("ledger off", False)):
        loop = loop_run(args.requests, ledger)
        rules = {label: rules_run(label, ledger) for label in RULE_WINDOWS}
        columns[name] = Column(loop, rules)
        print(f"{name}: done", flush=True)
    names = list(columns)
    rule_rows = [
        f"| {label} | " + " | ".join(columns[n].rules[label].figure() for n in names) + " |"
        for label in RULE_WINDOWS
    ]
    known = (
        "`compaction.ledger.enabled: false` in the second column."
        if LEDGER_KNOWN
        else "this proxy has no `compaction.ledger` key: both columns ran the same configuration "
        "(no ledger), which is the off behaviour."
    )
    lines = [
        "# A new user's agent loop with a summarizer that writes prose",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `python -m bench.session --prose --requests {args.requests}`",
        f"- Agent loop: one task (it states {4} rules), then one bash step per request in the "
        f"same turn, {args.requests} requests; each step's result (a pytest run, a compiler "
        "error, a script's traceback, a benchmark; ~400 tokens) holds its own file path, "
        "command, error line, measured number with its unit and, for pytest runs, verdict "
        f"line. Window {WINDOW:,} tokens (enforced by the fake upstream), max output 1,000; "
        "the default pipeline with `summarization: {enabled: true, maxSummaryTokens: 600, "
        "retainRecent: {turns: 2}}`, recall off (the default), SQLite checkpoints; real "
        "processes.",
        "- The summarizer (the fake upstream's `summarizer: prose`) answers every summary call "
        "with the same plausible prose (goal, progress, next steps) and copies no exact string "
        "it was shown.",
        f"- Ledger: {known}",
        "- A folded step: one whose tool result the last request did not forward as sent. A "
        "string counts when it appears, whole, anywhere in the last forwarded request.",
        "",
        "| figure | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *_loop_rows(columns),
        "",
        f"Rules stated in the system message (3) and in every third of {RULE_TURNS} user turns "
        "(tests/support/rule_turns.py: never / always / must / don't / make sure / IMPORTANT / "
        "numbered requirements; ~900-token tool results between turns), the same summarizer, "
        "forwarded verbatim in the last request:",
        "",
        "| window | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *rule_rows,
    ]
    return "\n".join(lines) + "\n"
