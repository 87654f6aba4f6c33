"""What the Messages adapter adds to a request: blocks -> chat view -> blocks, no network.

    python -m bench.messages_adapter [--blocks 250 1000] [--repeat 20] [--out FILE]

A Claude Code-shaped session (bench/messages_bodies.py: three system blocks with breakpoints,
12 tools, one task, then tool steps of signed thinking, text and one or two ``tool_use`` and
their results) sized by its content blocks is checked (``validate_request``), shown to the
core (``lift``, the view the route compacts), compacted by the default pipeline on a 32k
window (counts warm, as on every request after the first), mapped back (``lower``) and
written as the body that goes upstream (the client's bytes with ``messages`` spliced,
compaction_proxy/wire/_forwarded.py). Also the mapping back, and the body, of a request whose
messages come from a checkpoint (the lifted messages through an orjson round trip: matched by
canonical bytes, not identity).

The same conversation as a chat-completions body goes through the chat route's steps in the
same run (its lift and lower are the identity; its body matches checkpoint copies by
equality), so the ratio shows what the Messages format costs over the core's own form.

Thread CPU time, median over ``--repeat`` runs: steadier than wall time on a shared machine.
No timing is asserted anywhere; figures are reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.harness import REPO, cpu_model, versions
from bench.messages_bodies import Conversation, by_blocks
from compaction_proxy.compaction import (
    CompactionRequest,
    EncodingLoader,
    ModelFacts,
    TokenizerProvider,
    build_pipeline,
    compact,
)
from compaction_proxy.compaction.settings import CompactionSettings, SummarizationSettings
from compaction_proxy.wire import ClientBody, validate_chat
from compaction_proxy.wire.chat import CHAT
from compaction_proxy.wire.messages import MessagesView, lift, validate_request

MODEL = "claude-sonnet-4-5"
WINDOW = 32_000
OUTPUT = 2_000
STEPS = ("validate", "lift", "compact", "lower", "lower (ckpt)", "body", "body (ckpt)")
REQUEST = ("validate", "lift", "compact", "lower", "body")
"""One compacted request: what the route does between parsing and sending."""


@dataclass(frozen=True, slots=True)
class Row:
    blocks: int
    route: str
    compacted: bool  # False: the session fits the window, nothing fired
    messages: int  # elements of the client's `messages`
    core: int  # chat messages the core sees
    tokens_before: int
    tokens_after: int
    ms: dict[str, float]

    @property
    def request(self) -> float:
        return sum(self.ms[s] for s in REQUEST)

    @property
    def outside(self) -> float:
        """The request without the core's compaction: the format's own steps."""
        return self.request - self.ms["compact"]


def median_ms(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.thread_time_ns()
        run()
        times.append((time.thread_time_ns() - started) / 1e6)
    return statistics.median(times)


class Bench:
    def __init__(self, repeat: int) -> None:
        self.repeat = repeat
        self.provider = TokenizerProvider(EncodingLoader())
        self.pipeline = build_pipeline(CompactionSettings(), SummarizationSettings(enabled=False))
        self.facts = ModelFacts(context_window=WINDOW, max_output_tokens=OUTPUT)

    def compactor(self, chat: dict[str, Any]) -> Callable[[], Any]:
        def run() -> Any:
            request = CompactionRequest(
                chat["messages"],
                model=MODEL,
                pipeline=self.pipeline,
                tokenizer=self.provider,
                facts=self.facts,
                tools=chat.get("tools"),
            )
            return compact(request)

        return run

    def messages_row(self, target: int, session: Conversation) -> Row:
        body = session.messages_body(MODEL)
        raw = orjson.dumps(body)
        assert validate_request(body) is None

        def view() -> MessagesView:
            lifted = lift(body)
            return MessagesView(lifted, lifted.chat_body(body), body)

        shown = view()
        run_compact = self.compactor(shown.chat)
        result = run_compact()  # warms the count cache, as earlier requests would have
        stored = orjson.loads(orjson.dumps(shown.lifted.messages))
        lowered = shown.lower(result.messages)
        from_checkpoint = shown.lower(stored)
        assert from_checkpoint.items == body["messages"], "a checkpoint copy did not map back"

        def spliced(items: Any) -> bytes:
            return ClientBody(raw, body, "messages").with_elements(items)

        ms = {
            "validate": median_ms(self.repeat, lambda: validate_request(body)),
            "lift": median_ms(self.repeat, view),
            "compact": median_ms(self.repeat, run_compact),
            "lower": median_ms(self.repeat, lambda: shown.lower(result.messages)),
            "lower (ckpt)": median_ms(self.repeat, lambda: shown.lower(stored)),
            "body": median_ms(self.repeat, lambda: spliced(lowered.items)),
            "body (ckpt)": median_ms(self.repeat, lambda: spliced(from_checkpoint.items)),
        }
        report = result.report
        return Row(
            target,
            "messages",
            result.changed,
            len(body["messages"]),
            len(shown.chat["messages"]),
            report.tokens_before,
            report.tokens_after,
            ms,
        )

    def chat_row(self, target: int, session: Conversation) -> Row:
        body = session.chat_body(MODEL)
        raw = orjson.dumps(body)
        validate_chat(body)
        shown = CHAT.lift(body, check=False)
        run_compact = self.compactor(shown.chat)
        result = run_compact()
        stored = orjson.loads(orjson.dumps(body["messages"]))
        lowered = shown.lower(result.messages)
        from_checkpoint = shown.lower(stored)

        def spliced(items: Any) -> bytes:
            return ClientBody(raw, body, "messages").with_elements(items, copies=True)

        ms = {
            "validate": median_ms(self.repeat, lambda: validate_chat(body)),
            "lift": median_ms(self.repeat, lambda: CHAT.lift(body, check=False)),
            "compact": median_ms(self.repeat, run_compact),
            "lower": median_ms(self.repeat, lambda: shown.lower(result.messages)),
            "lower (ckpt)": median_ms(self.repeat, lambda: shown.lower(stored)),
            "body": median_ms(self.repeat, lambda: spliced(lowered.items)),
            "body (ckpt)": median_ms(self.repeat, lambda: spliced(from_checkpoint.items)),
        }
        report = result.report
        return Row(
            target,
            "chat",
            result.changed,
            len(body["messages"]),
            len(body["messages"]),
            report.tokens_before,
            report.tokens_after,
            ms,
        )


def render(rows: list[Row], sessions: dict[int, Conversation], argv: list[str]) -> str:
    load = os.getloadavg()
    shown = ["python", "-m", "bench.messages_adapter", *argv]
    lines = [
        "# The Messages adapter's cost, in process",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores), {platform.system()} "
        f"{platform.release()}; load average at the end {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f} (1 / 5 / 15 min; other jobs shared the machine)",
        f"- Versions: {versions(None)}",
        f"- Command (from the repository root): `{' '.join(shown)}`",
        "- Session (bench/messages_bodies.py): Claude Code-shaped, three system blocks (two "
        "breakpoints), 12 tools (31.9k characters), one task, then tool steps: an assistant "
        "message (signed thinking, text, one or two `tool_use`) and a user message (the "
        "results, ~3,000 characters every other step, a reminder block every fifth), the "
        "third breakpoint on the newest result. `blocks`: content blocks in `messages`. The "
        "chat row is the same conversation as chat messages (thinking as "
        "`reasoning_content`, results as `tool` messages).",
        "- Steps: `validate` the format's checks; `lift` the view the route compacts (chat: "
        "the identity); `compact` the default pipeline, summarization off, a 32,000-token "
        f"window with a {OUTPUT:,}-token output reserve, every count cached (as on every "
        "request after the first); `lower` the result back in the format's messages (chat: "
        "the identity); `body` the forwarded body, the client's bytes with `messages` "
        "spliced (compaction_proxy/wire/_forwarded.py, scan included). `(ckpt)`: the same "
        "for a request whose messages all come from a checkpoint (the lifted messages "
        "through an orjson round trip). Thread CPU ms, median.",
        "- `request` = validate + lift + compact + lower + body; `outside compact` = request "
        "minus compact: the format's own steps. `messages vs chat`: the Messages row over "
        "the chat row of the same conversation.",
        "",
        "| blocks | route | messages | core messages | tokens before -> after | "
        + " | ".join(f"{s} ms" for s in STEPS)
        + " | request ms | outside compact ms | messages vs chat (request / outside) |",
        "|---:|---|---:|---:|---|" + "---:|" * (len(STEPS) + 3),
    ]
    by = {(r.blocks, r.route): r for r in rows}
    for row in rows:
        cells = [
            f"{sessions[row.blocks].blocks:,}",
            row.route,
            f"{row.messages:,}",
            f"{row.core:,}",
            f"{row.tokens_before:,} -> {row.tokens_after:,}"
            if row.compacted
            else f"{row.tokens_before:,} (nothing fired)",
            *(f"{row.ms[s]:.2f}" for s in STEPS),
            f"{row.request:.2f}",
            f"{row.outside:.2f}",
        ]
        chat = by.get((row.blocks, "chat"))
        if row.route == "messages" and chat is not None:
            cells.append(f"{row.request / chat.request:.2f}x / {row.outside / chat.outside:.2f}x")
        else:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/results/messages-adapter.md"))
    args = parser.parse_args(argv)
    bench = Bench(args.repeat)
    rows: list[Row] = []
    sessions: dict[int, Conversation] = {}
    for target in args.blocks:
        session = sessions[target] = by_blocks(target)
        rows.append(bench.messages_row(target, session))
        rows.append(bench.chat_row(target, session))
        print(f"# {target} blocks done", file=sys.stderr, flush=True)
    text = render(rows, sessions, argv if argv is not None else sys.argv[1:])
    print(text)
    out = args.out if args.out.is_absolute() else REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
