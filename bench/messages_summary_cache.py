"""Cache reads of the Messages prefix-form summary call, against the fake Anthropic upstream.

A Claude-Code-shaped session (two system breakpoints, a breakpoint on the newest tool result,
adaptive thinking with signed blocks sent back) is driven against tests/fakes/messages (a real
process that caches at breakpoints the way Anthropic documents it, and keys cached messages on
``thinking`` and ``tool_choice``); then the summarizer, bound to the last request, folds its
first steps in the cache-aligned Messages form (compaction_proxy/wire/messages/_summary.py).
The table gives the summary call's prompt as the fake billed it, for the call as built and for
two variants it was built against: ``thinking`` left out of the call, and no breakpoint at the
prefix's end. The view is the summarizer tests' stand-in for the Messages format's
(tests/support/messages_view.py).

    python -m bench.messages_summary_cache [--steps 6] [--out bench/results/messages-summary-cache.md]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import compaction_proxy.wire.messages._summary as messages_call
from compaction_proxy.compaction.summarizer_contract import SummaryRequest
from compaction_proxy.summarizer import SummarizerStats
from compaction_proxy.summarizer._prefix import ForwardedRequest
from tests.integration.test_messages_prefix_cache import MODEL, answered, session, summarizer
from tests.support.messages_upstream import MessagesUpstreamServer
from tests.support.messages_view import STAND_IN, ensure_messages_api, lift


@contextmanager
def patched(name: str, value: Callable[..., Any] | None) -> Iterator[None]:
    if value is None:
        yield
        return
    saved = getattr(messages_call, name)
    setattr(messages_call, name, value)
    try:
        yield
    finally:
        setattr(messages_call, name, saved)


async def measure(fake: MessagesUpstreamServer, steps: int) -> dict[str, int]:
    fake.reset()
    last = session(fake, {"type": "adaptive"}, steps)
    view = lift(last)
    # the task and the first steps but the last two (each a call and its result)
    folded = tuple(view.chat["messages"][1 : 2 * (steps - 2) + 2])
    async with httpx.AsyncClient(trust_env=False) as client:
        bound = summarizer(fake, client, SummarizerStats()).bind(
            caller_key=None,
            request=ForwardedRequest.from_body(view.chat, "anthropic", view.native_request()),
            wire=STAND_IN,
            upstream="anthropic",
        )
        await bound.summarize(SummaryRequest(folded, None, MODEL))
    usage: dict[str, int] = answered(fake)["usage"]
    return usage


VARIANTS: list[tuple[str, str, Callable[..., Any] | None]] = [
    ("as built: the request's thinking, a breakpoint at the prefix's end", "", None),
    ("thinking left out of the call", "kept_thinking", lambda thinking: None),
    ("no breakpoint at the prefix's end", "with_end_breakpoint", lambda s, t, m: m),
]


async def run(steps: int) -> str:
    undo = ensure_messages_api()
    fake = MessagesUpstreamServer(Path(tempfile.mkdtemp()) / "fake.log")
    fake.start()
    rows = []
    try:
        for label, name, value in VARIANTS:
            with patched(name, value):
                usage = await measure(fake, steps)
            read = usage["cache_read_input_tokens"]
            written = usage["cache_creation_input_tokens"]
            whole = usage["input_tokens"] + read + written
            rows.append(f"| {label} | {whole:,} | {read:,} | {written:,} | {read / whole:.1%} |")
    finally:
        fake.stop()
        undo()
    return "\n".join(
        [
            "# The Messages prefix-form summary call: cache reads",
            "",
            f"`python -m bench.messages_summary_cache --steps {steps}`: a {steps}-step session,",
            f"the summary folds the task and the first {steps - 2} steps (the fake's token rule,",
            "o200k_base; the cache's minimum 1,024 tokens).",
            "",
            "| call | prompt tokens | read from the cache | written to it | read share |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = asyncio.run(run(args.steps))
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
