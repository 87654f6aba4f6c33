"""What applying Anthropic's ``context_management`` costs the proxy per request.

A Claude Code-shaped agent session on ``/v1/messages`` (a task, then steps that think, call a
tool and get its result, and a new user turn every 20 steps; each request the previous one
plus a step), compacted in process the
way the route does it (lift, the edits translated, the field stripped from the client's bytes,
the compactor with the edits, lowering, the body spliced), with a window where the configured
pipeline never fires. Three requests shapes:

* ``none``: no ``context_management`` (the proxy's own compaction only);
* ``keep all``: Claude Code's ``clear_thinking_20251015`` with ``keep: "all"``: nothing to clear,
  so the quiet path (no view) still serves it;
* ``keep 1``: ``keep: {type: thinking_turns, value: 1}``: the strategy fires on every request,
  so every request builds the view, and the thinking of every turn but the newest goes.

Thread CPU time per request (median over the last ``--requests`` requests, warm counts), and
the share of it the strip (``ClientBody.without``) takes. No checkpoint store: each request
starts from the client's whole history, as without one.

    python -m bench.context_management [--tokens 128000] [--requests 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

MODEL = "claude-sonnet-4-5"
TURN_STEPS = 20
SHAPES: dict[str, Any] = {
    "none": None,
    "keep all": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "keep 1": {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
        ]
    },
}


def _step(n: int) -> list[dict[str, Any]]:
    thinking = {"type": "thinking", "thinking": f"step {n} reasoning " * 30, "signature": "s" * 80}
    call = {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": "ls"}}
    output = "".join(f"step {n} line {k}: lorem ipsum dolor sit amet\n" for k in range(40))
    return [
        {"role": "assistant", "content": [thinking, {"type": "text", "text": f"Step {n}."}, call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": output}],
        },
    ]


def _grow(messages: list[dict[str, Any]], n: int) -> None:
    """One more step; every :data:`TURN_STEPS` steps the turn ends and the user asks again."""
    if n and n % TURN_STEPS == 0:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
        messages.append({"role": "user", "content": f"Now part {n // TURN_STEPS}."})
    messages.extend(_step(n))


def _bodies(tokens: int, requests: int, shape: Any) -> list[bytes]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    steps = max(1, tokens // 700)
    for n in range(steps):
        _grow(messages, n)
    out = []
    for n in range(steps, steps + requests):
        _grow(messages, n)
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 32000, "messages": messages}
        if shape is not None:
            body["context_management"] = shape
        body["stream"] = True
        out.append(orjson.dumps(body))
    return out


async def _request(compactor: Any, raw: bytes) -> tuple[float, float, bool]:
    from compaction_proxy.compaction import Mode
    from compaction_proxy.engine import RunExtras
    from compaction_proxy.wire import ClientBody, EditedView
    from compaction_proxy.wire.messages import MESSAGES

    start = time.thread_time_ns()
    body = MESSAGES.parse(raw)
    view = MESSAGES.lift(body)
    assert isinstance(view, EditedView)
    edits = view.context_edits(summarizer=False)
    client = ClientBody(raw, body, "messages")
    strip_start = time.thread_time_ns()
    if edits is not None:
        client = client.without(edits.strip)
    strip = time.thread_time_ns() - strip_start
    result = await compactor.run(
        view.chat,
        Mode.NORMAL,
        size_hint=len(raw),
        extras=RunExtras(tuple(edits.strategies), edits.key) if edits else None,
    )
    if result.changed:
        lowered = view.lower(result.messages)
        client.with_elements(lowered.items, copies=lowered.copies)
    total = time.thread_time_ns() - start
    return total / 1e6, strip / 1e6, result.changed


async def _run(tokens: int, requests: int) -> list[tuple[str, float, float, str]]:
    """Every shape's requests, taken in turn (one of each, then the next of each), so that a
    busy machine slows them alike."""
    from compaction_proxy.config import Settings
    from compaction_proxy.engine import Compactor

    settings = Settings.model_validate(
        {
            "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
            "models": {MODEL: {"context_window": tokens * 8}},
            "summarization": {"enabled": False},
        }
    )
    compactors = {name: Compactor(settings) for name in SHAPES}
    bodies = {name: _bodies(tokens, requests * 2, shape) for name, shape in SHAPES.items()}
    times: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in SHAPES}
    try:
        for compactor in compactors.values():
            compactor.warm_up()
        for n in range(requests * 2):
            for name in SHAPES:
                times[name].append(await _request(compactors[name], bodies[name][n]))
    finally:
        for compactor in compactors.values():
            compactor.close()
    rows = []
    for name in SHAPES:
        last = times[name][requests:]
        changed = sum(1 for _, _, c in last if c)
        rows.append(
            (
                name,
                statistics.median(t for t, _, _ in last),
                statistics.median(s for _, s, _ in last),
                f"{changed}/{len(last)}",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=128_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = asyncio.run(_run(args.tokens, args.requests))
    size = len(_bodies(args.tokens, 1, SHAPES["keep 1"])[0])
    lines = [
        f"Claude Code-shaped loop of ~{args.tokens:,} tokens ({size:,} bytes), "
        f"median of {args.requests} requests, thread CPU ms",
        "",
        "| context_management | per request | of which the strip | requests changed |",
        "|---|---|---|---|",
        *(f"| {n} | {t:.2f} | {s:.3f} | {c} |" for n, t, s, c in rows),
    ]
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
