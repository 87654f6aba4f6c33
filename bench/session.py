"""The simulated agent session of the checkpoint tests, run longer and reported.

Real processes on loopback: the fake upstream (8k window, also the summarizer) and the proxy
with SQLite checkpoints. Each tool step of the agent is a new request. Reports what issue 4
asks for: requests, summarizer calls, compaction events, forwarded tokens against the raw
conversation's tokens, and the share of requests whose forwarded messages extend the previous
request's unchanged (what keeps an upstream prompt cache warm).

    python -m bench.session [--requests 300] [--out bench/results/session.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import tempfile
from pathlib import Path

from proxy.compaction import EncodingLoader, TokenizerProvider
from tests.support.agent_session import run_session
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

WINDOW = 8_000
MODEL = "agent-8k"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tool-output-chars", type=int, default=300)
    parser.add_argument("--turn-every", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="session-bench-"))
    upstream = UpstreamServer(work / "upstream.log", context_window=WINDOW).start()
    config = proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(work / "checkpoints.db")},
        summarization={"enabled": True, "maxSummaryTokens": 800, "retainRecent": {"turns": 2}},
    )
    proxy = ProxyServer(write_config(work / "proxy.yaml", config), work / "proxy.log").start()
    try:
        report = run_session(
            proxy.openai_client(),
            upstream,
            model=MODEL,
            requests=args.requests,
            tool_output_chars=args.tool_output_chars,
            turn_every=args.turn_every,
        )
    finally:
        proxy.stop()
        upstream.stop()

    tokenizer = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get(
        "o200k_base"
    )
    raw_total = forwarded_total = 0
    for step in report.steps:
        forwarded_total += step.prompt_tokens
    # The raw conversation of request i is the first `sent` messages of the final one.
    final = report.final_conversation
    for step in report.steps:
        raw_total += tokenizer.count_messages(final[: step.sent]) + tokenizer.reply_priming
    flags = report.prefix_stable()
    over_window = sum(
        1
        for step in report.steps
        if tokenizer.count_messages(final[: step.sent]) + tokenizer.reply_priming > WINDOW
    )
    lines = [
        "# Simulated agent session through the proxy",
        "",
        f"- Date: {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}",
        f"- Command: `python -m bench.session --requests {args.requests} "
        f"--tool-output-chars {args.tool_output_chars} --turn-every {args.turn_every}`",
        f"- Upstream window {WINDOW:,} tokens (enforced: the upstream answers 400 past it), max output 1,000; "
        "default pipeline (fire at 0.8, compact to 0.5), summarization with "
        "retainRecent 2 turns, SQLite checkpoints.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {len(report.steps)} |",
        f"| requests whose raw conversation exceeds the window | {over_window} |",
        "| requests that failed | 0 (run_session raises on any error) |",
        f"| compaction events (X-Compaction-Checkpoint: new) | {report.compaction_events} |",
        f"| summarizer calls | {report.summarizer_calls} |",
        f"| checkpoint hits | {sum(1 for s in report.steps if s.checkpoint == 'hit')} |",
        f"| raw prompt tokens, summed over requests | {raw_total:,} |",
        f"| forwarded prompt tokens (upstream usage), summed | {forwarded_total:,} |",
        f"| forwarded / raw | {forwarded_total / raw_total:.1%} |",
        f"| requests extending the previous forwarded request unchanged | "
        f"{sum(flags)} of {len(flags)} ({report.stable_share():.1%}) |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
