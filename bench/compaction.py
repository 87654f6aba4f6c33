"""Compaction-core latency benchmark (see bench/COMPACTION.md for the method).

    taskset -c 0 python -m bench.compaction [--quick] [--out bench/results/compaction.md]
    python -m bench.compaction --profile [--profile-out bench/results/compaction_profile.txt]

For each conversation size (bench/conversations.py) and each window (gpt-4o's 128k, and the
same model overridden to a 16k window so compaction fires early) it measures
``compaction_proxy.compaction.compact`` with the default pipeline:

* COLD: a new TokenizerProvider (empty count cache; the encoding is already loaded -- its load
  time is reported on its own), request N;
* WARM: right after, request N+1 (the same messages + the assistant reply + a new user message)
  through the same provider, so only the two new messages miss the count cache.

Windows: a 4M window where nothing ever fires (counting and viewing alone), gpt-4o's 128k and a
16k override (compaction fires from ~100k and ~16k tokens on). Sizes run to 6,500 messages, about
a million tokens, for the linearity target.

Side by side, agent-framework-core's ``apply_compaction`` with its closest equivalent
(TokenBudgetComposedStrategy[ToolResultCompaction(keep 1), Truncation(max_n 0.8 x budget,
compact_to 0.5 x budget)], the same budget) with its CharacterEstimatorTokenizer and with a
tiktoken (o200k) adapter.  Its COLD run gets freshly converted ``Message`` objects (conversion
timed separately, not included); its WARM run is request N+1 on the annotated list request N
left behind (AF keeps token counts in message annotations, as CompactionProvider does).

No timing is asserted; targets are reported against.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import importlib.metadata as md
import importlib.util
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_bodies import tokenizers
from bench.conversations import conversation, next_turn, stats, tools
from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionSettings,
    EncodingLoader,
    FactsOverride,
    ModelCatalog,
    TokenizerProvider,
    build_pipeline,
    compact,
)

MODEL = "gpt-4o"
ENCODING = "o200k_base"
SIZES = (10, 30, 100, 300, 620, 1000, 2000, 5000, 6500)
QUICK_SIZES = (10, 100, 620, 2000, 6500)
TARGET_TOKENS = 100_000
TARGET_COLD_MS = 30.0
TARGET_WARM_MS = 3.0
TARGET_WARM_FIRES_MS = 10.0
LINEAR_TOLERANCE = 1.25
"""'Linear to 1M tokens': the cost per 1k tokens at ~1M within this factor of that at ~100k."""
AF_MAX_SIZE = 1000
"""AF's compaction is quadratic in the message count (~30 s per call at 2,000 messages), so it
is measured up to this size only."""
AF_MAX_REPS_LARGE = 3
AF_TRIGGER_RATIO = 0.8
AF_TARGET_RATIO = 0.5

WINDOWS: dict[str, ModelCatalog] = {
    # Nothing fires at any size: the cost of counting and viewing alone.
    "4M": ModelCatalog({MODEL: FactsOverride(context_window=4_000_000, max_output_tokens=16_384)}),
    "128k": ModelCatalog(),
    "16k": ModelCatalog({MODEL: FactsOverride(context_window=16_384, max_output_tokens=4_096)}),
}


def new_loader() -> EncodingLoader:
    """A fresh offline loader of the real encoding files (see bench.agent_bodies.tokenizers:
    the default search path, else the files litellm ships); nothing is downloaded."""
    template = tokenizers().loader
    return EncodingLoader(
        directories=list(template.directories),
        include_env=template.include_env,
        include_default=template.include_default,
    )


def reps_for(size: int, quick: bool) -> int:
    if quick:
        return 3
    if size <= 1000:
        return 15
    return 7 if size <= 2000 else 5


# ------------------------------------------------------------------ timing helpers


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds for one call, with the cyclic GC off (as timeit does) and collected before."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        value = fn()
        return time.perf_counter() - start, value
    finally:
        gc.enable()


def run_sync(coro: Any) -> Any:
    """Drive a coroutine that never really awaits (AF compaction without a summarizer)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("coroutine suspended; use asyncio")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p90(xs: Sequence[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


@dataclass
class Series:
    """Durations in seconds of one measurement across repetitions."""

    values: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.values.append(seconds)

    @property
    def med_ms(self) -> float:
        return median(self.values) * 1e3

    @property
    def p90_ms(self) -> float:
        return p90(self.values) * 1e3

    def cell(self) -> str:
        return f"{fmt_ms(self.med_ms)} / {fmt_ms(self.p90_ms)}"


def fmt_ms(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


# ------------------------------------------------------------------ ours


@dataclass
class OursRow:
    size: int
    window: str
    messages: int
    chars: int
    tool_chars: int
    tokens: int
    budget: int
    cold: Series
    warm: Series
    fired: bool
    fired_warm: bool
    tokens_after: int
    messages_after: int


def bench_ours(
    size: int, window: str, msgs: list[dict], nxt: list[dict], loader: EncodingLoader, reps: int
) -> OursRow:
    catalog = WINDOWS[window]
    pipeline = build_pipeline(CompactionSettings())
    tool_defs = tools()

    def run(provider: TokenizerProvider, messages: list[dict]) -> Any:
        return compact(
            CompactionRequest(
                messages,
                model=MODEL,
                pipeline=pipeline,
                tokenizer=provider,
                facts=catalog,
                tools=tool_defs,
            )
        )

    cold, warm = Series(), Series()
    first = first_warm = None
    for _ in range(reps):
        provider = TokenizerProvider(loader)  # fresh count cache; encoding already built
        seconds, result = timed(lambda: run(provider, msgs))
        cold.add(seconds)
        seconds, result_warm = timed(lambda: run(provider, nxt))
        warm.add(seconds)
        first = first or result
        first_warm = first_warm or result_warm
    assert first is not None and first_warm is not None
    report = first.report
    s = stats(msgs)
    return OursRow(
        size,
        window,
        s["messages"],
        s["chars"],
        s["tool_chars"],
        report.tokens_before,
        report.budget,
        cold,
        warm,
        first.changed,
        first_warm.changed,
        report.tokens_after,
        report.messages_after,
    )


# ------------------------------------------------------------------ agent framework


class TiktokenAdapter:
    """AF TokenizerProtocol over a tiktoken encoding (exact counts of AF's JSON payload)."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    def count_tokens(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))


def to_af(msgs: Sequence[dict]) -> list[Any]:
    """OpenAI chat dicts -> agent_framework Messages (text, function calls, results)."""
    from agent_framework import Content, Message

    out = []
    for m in msgs:
        contents: list[Any] = []
        text = m.get("content")
        if m["role"] == "tool":
            contents.append(Content.from_function_result(call_id=m["tool_call_id"], result=text))
        else:
            if text:
                contents.append(text)
            for call in m.get("tool_calls") or ():
                contents.append(
                    Content.from_function_call(
                        call_id=call["id"],
                        name=call["function"]["name"],
                        arguments=call["function"]["arguments"],
                    )
                )
        out.append(Message(role=m["role"], contents=contents))
    return out


@dataclass
class AfRow:
    size: int
    window: str
    tokenizer: str
    tokens: int
    convert: Series
    cold: Series
    warm: Series
    fired: bool
    fired_warm: bool
    messages_after: int


def bench_af(
    size: int,
    window: str,
    tokenizer_name: str,
    msgs: list[dict],
    new: list[dict],
    encoding: Any,
    budget: int,
    reps: int,
) -> AfRow:
    from agent_framework._compaction import (
        CharacterEstimatorTokenizer,
        TokenBudgetComposedStrategy,
        ToolResultCompactionStrategy,
        TruncationStrategy,
        apply_compaction,
    )

    tok: Any = (
        CharacterEstimatorTokenizer() if tokenizer_name == "char" else TiktokenAdapter(encoding)
    )

    def strategy() -> Any:
        return TokenBudgetComposedStrategy(
            token_budget=budget,
            tokenizer=tok,
            strategies=[
                ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
                TruncationStrategy(
                    max_n=max(1, int(AF_TRIGGER_RATIO * budget)),
                    compact_to=max(1, int(AF_TARGET_RATIO * budget)),
                    tokenizer=tok,
                ),
            ],
        )

    convert, cold, warm = Series(), Series(), Series()
    fired = fired_warm = False
    tokens = messages_after = 0
    for rep in range(reps):
        seconds, af_msgs = timed(lambda: to_af(msgs))
        convert.add(seconds)
        af_new = to_af(new)
        strat = strategy()
        seconds, out = timed(
            lambda: run_sync(apply_compaction(af_msgs, strategy=strat, tokenizer=tok))
        )
        cold.add(seconds)
        if rep == 0:
            fired = len(out) != len(af_msgs)
            messages_after = len(out)
            tokens = sum(tok.count_tokens(_af_payload(m)) for m in to_af(msgs))
        af_msgs.extend(af_new)  # request N+1 on the annotated list (CompactionProvider-like)
        before = len([m for m in af_msgs if not _excluded(m)])
        seconds, out_warm = timed(
            lambda: run_sync(apply_compaction(af_msgs, strategy=strat, tokenizer=tok))
        )
        warm.add(seconds)
        if rep == 0:
            fired_warm = len(out_warm) != before
    return AfRow(
        size, window, tokenizer_name, tokens, convert, cold, warm, fired, fired_warm, messages_after
    )


def _af_payload(message: Any) -> str:
    from agent_framework._compaction import _serialize_message

    return _serialize_message(message)


def _excluded(message: Any) -> bool:
    from agent_framework._compaction import EXCLUDED_KEY

    return bool(message.additional_properties.get(EXCLUDED_KEY, False))


# ------------------------------------------------------------------ growth


def growth_exponent(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of log(time) against log(tokens): 1.0 is linear."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return float("nan")
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    num = sum((x - mx) * (y - my) for x, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return num / den if den else float("nan")


# ------------------------------------------------------------------ environment


def environment(argv: Sequence[str]) -> list[str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"

    def version(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- command: `{' '.join(argv)}`",
        f"- CPU: {cpu}; {os.cpu_count()} logical CPUs on the machine; pinned to {affinity}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- tiktoken {version('tiktoken')}, orjson {version('orjson')}, "
        f"agent-framework-core {version('agent-framework-core')}, "
        f"pydantic {version('pydantic')}",
        f"- proxy commit {commit}",
    ]


# ------------------------------------------------------------------ report


def render(ours: list[OursRow], af: list[AfRow], load: Series, env: list[str], quick: bool) -> str:
    lines = ["# Compaction core benchmark", ""]
    lines += env
    lines += [
        "",
        f"Repetitions per size: {'3 (--quick)' if quick else '15 up to 1,000 messages, 7 at 2,000, 5 from 5,000'}. "
        "Times are median / p90 in ms of one `compact()` call on one core, GC off "
        "during the call. Tokens are o200k (our count, incl. tools and priming); "
        "chars are message text + tool arguments.",
        "",
    ]
    lines += [
        f"Encoding load (o200k_base, a fresh EncodingLoader: read + sha256 + parse + "
        f"build): **{fmt_ms(load.med_ms)} ms** median, p90 {fmt_ms(load.p90_ms)} ms "
        f"({len(load.values)} runs). Paid once per process, excluded below.",
        "",
    ]

    for window in WINDOWS:
        rows = [r for r in ours if r.window == window]
        if not rows:
            continue
        lines += [
            f"## compaction_proxy.compaction, default pipeline, {MODEL} {window} window "
            f"(budget {rows[0].budget:,} tokens)",
            "",
            "| msgs | chars | tool chars | tokens | cold ms med / p90 | warm ms med / p90 "
            "| fired (N / N+1) | after: msgs / tokens | cold µs per 1k tok "
            "| warm µs per 1k tok |",
            "|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r.messages:,} | {r.chars:,} | {r.tool_chars:,} | {r.tokens:,} "
                f"| {r.cold.cell()} | {r.warm.cell()} "
                f"| {'yes' if r.fired else 'no'} / {'yes' if r.fired_warm else 'no'} "
                f"| {r.messages_after:,} / {r.tokens_after:,} "
                f"| {r.cold.med_ms * 1e3 / (r.tokens / 1e3):.0f} "
                f"| {r.warm.med_ms * 1e3 / (r.tokens / 1e3):.1f} |"
            )
        big = [r for r in rows if r.messages >= 100]
        lines += [
            "",
            f"Growth exponent (log-log slope of median time vs tokens, sizes >= 100 "
            f"messages; 1.0 = linear): cold {growth_exponent([(r.tokens, r.cold.med_ms) for r in big]):.2f}, "
            f"warm {growth_exponent([(r.tokens, r.warm.med_ms) for r in big]):.2f}.",
            "",
        ]

    if af:
        lines += [
            "## agent-framework-core apply_compaction, side by side",
            "",
            "TokenBudgetComposedStrategy(budget = our budget)[ToolResultCompaction(keep 1), "
            f"Truncation(max_n {AF_TRIGGER_RATIO} x budget, compact_to {AF_TARGET_RATIO} "
            f"x budget)]. Measured up to {AF_MAX_SIZE:,} messages (its cost is quadratic: "
            "~30 s per call at 2,000 messages in a --quick run), with at most "
            f"{AF_MAX_REPS_LARGE} repetitions from 500 messages up. AF tokens are counted on its JSON message payload "
            "(char = len/4; tiktoken = o200k of that payload). Conversion dict -> Message "
            "is timed separately and not included in cold/warm.",
            "",
            "| window | msgs | tokenizer | AF tokens | convert ms | cold ms med / p90 "
            "| warm ms med / p90 | fired (N / N+1) | after msgs | ours cold / warm ms |",
            "|:---|---:|:---|---:|---:|---:|---:|:---:|---:|---:|",
        ]
        by_key = {(r.window, r.size): r for r in ours}
        for a in af:
            o = by_key[(a.window, a.size)]
            lines.append(
                f"| {a.window} | {o.messages:,} | {a.tokenizer} | {a.tokens:,} "
                f"| {fmt_ms(a.convert.med_ms)} | {a.cold.cell()} | {a.warm.cell()} "
                f"| {'yes' if a.fired else 'no'} / {'yes' if a.fired_warm else 'no'} "
                f"| {a.messages_after:,} | {fmt_ms(o.cold.med_ms)} / {fmt_ms(o.warm.med_ms)} |"
            )
        lines.append("")

    near = min(ours, key=lambda r: abs(r.tokens - TARGET_TOKENS))
    lines += ["## Targets (reported, not asserted)", ""]
    lines += targets(ours, near)
    lines.append("")
    return "\n".join(lines)


def targets(ours: list[OursRow], near: OursRow) -> list[str]:
    """The compaction-time targets, each met or not met with its figure."""

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    rows = {r.window: r for r in ours if r.size == near.size}
    out = [
        f"A ~{TARGET_TOKENS // 1000}k-token conversation ({near.messages:,} messages, "
        f"{near.tokens:,} tokens), one core, median of the repetitions:",
        "",
    ]
    quiet, fires = rows.get("4M"), rows.get("128k")
    if quiet is not None:
        out.append(
            f"- Cold, nothing fires (4M window): {fmt_ms(quiet.cold.med_ms)} ms "
            f"({mark(quiet.cold.med_ms <= TARGET_COLD_MS)}, target <= {TARGET_COLD_MS:.0f} ms)."
        )
    if fires is not None:
        out.append(
            f"- Cold, fires (128k window): {fmt_ms(fires.cold.med_ms)} ms "
            f"({mark(fires.cold.med_ms <= TARGET_COLD_MS)}, target <= {TARGET_COLD_MS:.0f} ms)."
        )
    if quiet is not None:
        out.append(
            f"- Warm, nothing fires (4M window): {fmt_ms(quiet.warm.med_ms)} ms "
            f"({mark(quiet.warm.med_ms <= TARGET_WARM_MS)}, target <= {TARGET_WARM_MS:.0f} ms)."
        )
    if fires is not None:
        note = "" if fires.fired_warm else " (it did not fire: not the case the target is about)"
        out.append(
            f"- Warm, fires (128k window, request N+1 fires too){note}: "
            f"{fmt_ms(fires.warm.med_ms)} ms "
            f"({mark(fires.warm.med_ms <= TARGET_WARM_FIRES_MS)}, "
            f"target <= {TARGET_WARM_FIRES_MS:.0f} ms)."
        )
    for window in WINDOWS:
        rows_w = [r for r in ours if r.window == window and r.messages >= 100]
        if len(rows_w) < 2:
            continue
        top = max(rows_w, key=lambda r: r.tokens)
        base = min(rows_w, key=lambda r: abs(r.tokens - TARGET_TOKENS))
        for phase in ("cold", "warm"):
            per_top = getattr(top, phase).med_ms / top.tokens
            per_base = getattr(base, phase).med_ms / base.tokens
            ratio = per_top / per_base
            slope = growth_exponent([(r.tokens, getattr(r, phase).med_ms) for r in rows_w])
            out.append(
                f"- Linear to {top.tokens / 1e6:.2f}M tokens, {window} window, {phase}: cost per "
                f"1k tokens {per_top * 1e6:.0f} µs at {top.tokens:,} vs {per_base * 1e6:.0f} µs "
                f"at {base.tokens:,} tokens ({ratio:.2f}x; log-log slope {slope:.2f}) "
                f"({mark(ratio <= LINEAR_TOLERANCE)}, target: within {LINEAR_TOLERANCE}x)."
            )
    return out


# ------------------------------------------------------------------ profile


def profile(out: Path) -> None:
    import cProfile
    import io
    import pstats

    loader = new_loader()
    loader.load(ENCODING)
    size = min(SIZES, key=lambda n: abs(n - 620))
    msgs = conversation(size)
    nxt = msgs + next_turn(size)
    pipeline = build_pipeline(CompactionSettings())
    tool_defs = tools()
    buf = io.StringIO()
    for window, catalog in WINDOWS.items():
        for phase in ("cold", "warm"):
            prof = cProfile.Profile()
            for _ in range(5):
                provider = TokenizerProvider(loader)
                if phase == "warm":
                    compact(
                        CompactionRequest(
                            msgs,
                            model=MODEL,
                            pipeline=pipeline,
                            tokenizer=provider,
                            facts=catalog,
                            tools=tool_defs,
                        )
                    )
                prof.enable()
                compact(
                    CompactionRequest(
                        nxt if phase == "warm" else msgs,
                        model=MODEL,
                        pipeline=pipeline,
                        tokenizer=provider,
                        facts=catalog,
                        tools=tool_defs,
                    )
                )
                prof.disable()
            buf.write(f"\n===== {window} window, {phase}, {len(msgs):,} messages, 5 calls =====\n")
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    text = buf.getvalue().replace(str(Path.cwd()) + "/", "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    parser.add_argument("--no-af", action="store_true", help="skip agent-framework-core")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to CPU 0")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the ~100k-token case instead of benchmarking",
    )
    parser.add_argument(
        "--profile-out", type=Path, default=Path("bench/results/compaction_profile.txt")
    )
    args = parser.parse_args(argv)
    logging.getLogger("compaction_proxy.compaction").setLevel(logging.ERROR)
    logging.getLogger("agent_framework").setLevel(logging.ERROR)
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    if args.profile:
        profile(args.profile_out)
        return

    load = Series()
    for _ in range(3 if args.quick else 5):
        seconds, _enc = timed(lambda: new_loader().load(ENCODING))
        load.add(seconds)
    loader = new_loader()
    encoding = loader.load(ENCODING)

    af_ok = not args.no_af and importlib.util.find_spec("agent_framework") is not None
    ours: list[OursRow] = []
    af: list[AfRow] = []
    for size in QUICK_SIZES if args.quick else SIZES:
        msgs = conversation(size)
        new = next_turn(size)
        nxt = msgs + new
        reps = reps_for(size, args.quick)
        for window in WINDOWS:
            row = bench_ours(size, window, msgs, nxt, loader, reps)
            ours.append(row)
            print(
                f"ours {window:>4} {row.messages:>5} msgs {row.tokens:>8,} tok  "
                f"cold {row.cold.cell()} ms  warm {row.warm.cell()} ms  fired={row.fired}",
                file=sys.stderr,
                flush=True,
            )
            if af_ok and size <= AF_MAX_SIZE and window != "4M":
                af_reps = min(reps, AF_MAX_REPS_LARGE) if size >= 500 else reps
                for name in ("char", "tiktoken"):
                    a = bench_af(size, window, name, msgs, new, encoding, row.budget, af_reps)
                    af.append(a)
                    print(
                        f"  af {name:>8} cold {a.cold.cell()} ms  warm {a.warm.cell()} ms  "
                        f"convert {fmt_ms(a.convert.med_ms)} ms  fired={a.fired}",
                        file=sys.stderr,
                        flush=True,
                    )
    argv_shown = ["python", "-m", "bench.compaction", *(argv if argv is not None else sys.argv[1:])]
    text = render(ours, af, load, environment(argv_shown), args.quick)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
