"""CPU cost of each step of the chat request path on agent-session bodies, in process.

The gateway benchmark gives the whole request's figure through real servers; this one says
where that CPU goes, step by step, with the proxy's own objects (built from the same YAML as
`bench.gateway --agent`) and no sockets, so a change to the core shows up as a steady figure
even on a busy machine. For each size, a session sends requests that each add one tool step
(bench/agent_bodies.py); every step is timed with the thread's CPU clock and the median over
the requests is reported.

Steps (what `compaction_proxy/api/_compacted.py` and `compaction_proxy/engine/_flow.py` do for one request):

* parse: `parse_chat_body` (orjson);
* validate: `validate_chat` (shape and nesting checks);
* chain: the checkpoint hash chain over the messages after the system block;
* store: the SQLite `find_longest` for those hashes (store thread included);
* quiet: the quiet check, `Compactor._quiet_result` on the (checkpoint) view: facts and budget
  resolved, then `prompt_bound` (compaction_proxy/compaction/prompt_bound.py), one
  serialization pass over the messages with every count cached but the new step's, which it
  counts. When its exact count is below the pipeline's quiet limit it is the whole compaction
  (run inline on the event loop up to 4 MiB and 2,000 messages); the `quiet answers` column
  says for how many of the measured requests it was;
* compact: the core's `compact_async` with every count cached (view, draft, triggers): the full
  path, which the flow takes only when the quiet check does not answer;
* flow: `CompactionFlow.run` as the edge calls it (lookup + quiet check or thread hop and
  compaction);
* body: writing the body that is forwarded for a checkpoint hit, the client's bytes with the
  checkpoint view's messages spliced in (compaction_proxy/wire/_forwarded.py; before it, `flow`
  serialized the view whole and this column did not exist).

    python -m bench.request_cost [--sizes 8k,32k,128k,500k] [--requests 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.agent_bodies import SIZES, SessionBodies, agent_session, tokenizers
from bench.gateway_agent import PLAIN_MODEL, PLAIN_WINDOW, ckpt_model, ckpt_window, proxy_config
from bench.harness import stamp

QUIET_ANSWERS = "quiet answers"
"""Measured requests (of ``--requests``) the quiet check answered (the rest take `compact`)."""
STEPS = ("parse", "validate", "chain", "store", "quiet", "compact", "flow", "body")


def _edge(config: Path, env_dir: str | None) -> tuple[Any, Any]:
    """The compactor and the flow `build_edge` would make for ``config``."""

    if env_dir:
        os.environ["TIKTOKEN_CACHE_DIR"] = env_dir
    import httpx

    from compaction_proxy.checkpoints import make_store
    from compaction_proxy.config import load_settings
    from compaction_proxy.engine import Compactor, build_flow

    settings = load_settings(config)
    compactor = Compactor(settings)
    compactor.warm_up()
    store = make_store(settings.store)
    flow = build_flow(settings, compactor, store, httpx.AsyncClient())
    return compactor, flow


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.thread_time_ns()
    value = fn()
    return (time.thread_time_ns() - start) / 1e3, value


async def _acpu(make: Callable[[], Any]) -> tuple[float, Any]:
    """Process CPU (every thread: the flow hops to the worker and the store's thread)."""
    start = time.process_time_ns()
    value = await make()
    return (time.process_time_ns() - start) / 1e3, value


async def measure(
    bodies: SessionBodies,
    configs: tuple[Path, Path],
    env_dir: str | None,
    requests: int,
    checkpoint: bool,
) -> dict[str, float]:
    """``configs``: one per pass (each its own store file, so pass 2 primes its own base)."""
    from compaction_proxy.checkpoints import chain, leading_system_count, scope_of
    from compaction_proxy.compaction import Mode, compact_async
    from compaction_proxy.engine import FlowRequest
    from compaction_proxy.wire import ClientBody, parse_chat_body, validate_chat

    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    answered = 0
    # Pass 1, the whole flow as the edge runs it; pass 2, its parts, on a fresh edge, so each
    # pass meets every step as new as the other.
    compactor, flow = _edge(configs[0], env_dir)
    if checkpoint:
        primed = await flow.run(
            FlowRequest(
                orjson.loads(bodies.base()),
                Mode.NORMAL,
                size_hint=1 << 20,
                credential="k",
                caller_key=None,
                upstream_name="mock",
            )
        )
        assert primed.save is not None, "the base did not fire"
        await primed.save()
    for i in range(requests + 5):
        raw = bodies.body(i, 0, 1)
        data = parse_chat_body(raw)

        async def whole(data: dict[str, Any] = data, raw: bytes = raw) -> Any:
            return await flow.run(
                FlowRequest(
                    data,
                    Mode.NORMAL,
                    size_hint=len(raw),
                    credential="k",
                    caller_key=None,
                    upstream_name="mock",
                )
            )

        cost, result = await _acpu(whole)
        body = 0.0
        if result.messages is not None:
            client = ClientBody(raw, data, "messages")
            messages = result.messages
            body, _ = _cpu(lambda c=client, m=messages: c.with_elements(m, copies=True))
        if i >= 5:
            samples["flow"].append(cost)
            samples["body"].append(body)
        assert result.checkpoint == ("hit" if checkpoint else "none"), result.checkpoint
        assert not result.result.changed
    compactor, flow = _edge(configs[1], env_dir)
    if checkpoint:
        primed = await flow.run(
            FlowRequest(
                orjson.loads(bodies.base()),
                Mode.NORMAL,
                size_hint=1 << 20,
                credential="k",
                caller_key=None,
                upstream_name="mock",
            )
        )
        assert primed.save is not None
        await primed.save()
    first = orjson.loads(bodies.body(0))
    namespace = flow.namespace(first["model"], "k", scope=scope_of(first))
    for i in range(requests + 5):
        raw = bodies.body(i, 0, 1)
        parse, data = _cpu(lambda raw=raw: parse_chat_body(raw))
        validate, _ = _cpu(lambda data=data: validate_chat(data))
        messages = data["messages"]
        rest = messages[leading_system_count(messages) :]
        hashing, hashes = _cpu(lambda rest=rest: chain(namespace, rest))
        assert flow.store is not None
        store, _ = await _acpu(lambda hashes=hashes: flow.store.find_longest(namespace, hashes))
        lookup = await flow.checkpoints.lookup(namespace, messages) if checkpoint else None
        view = {**data, "messages": lookup.messages} if lookup and lookup.hit else data
        request = compactor._request(view, Mode.NORMAL)
        quiet, (answer, _) = _cpu(lambda request=request: compactor._quiet_result(request))
        compact, _ = await _acpu(lambda request=request: compact_async(request))
        if i >= 5:
            for step, value in zip(
                STEPS[:-2], (parse, validate, hashing, store, quiet, compact), strict=True
            ):
                samples[step].append(value)
            answered += answer is not None
    figures = {step: statistics.median(values) for step, values in samples.items()}
    figures[QUIET_ANSWERS] = answered
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8k,32k,128k,500k")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    provider = tokenizers()
    tok = provider.get("o200k_base")
    env_dir = str(provider.loader.directories[0]) if provider.loader.directories else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-cost-"))
    rows: list[tuple[str, str, int, dict[str, float]]] = []
    load_at_start = os.getloadavg()[0]
    for size in args.sizes.split(","):
        session = agent_session(SIZES[size], tok)
        windows = {PLAIN_MODEL: PLAIN_WINDOW, ckpt_model(size): ckpt_window(session.base_tokens)}
        for checkpoint in (False, True):
            model = ckpt_model(size) if checkpoint else PLAIN_MODEL
            bodies = SessionBodies.build(session, model)
            configs = tuple(
                proxy_config(
                    tmp / f"{size}-{checkpoint}-{n}.yaml",
                    1,
                    tmp / f"{size}-{checkpoint}-{n}.db",
                    windows,
                )
                for n in (1, 2)
            )
            figures = asyncio.run(
                measure(bodies, configs, env_dir, args.requests, checkpoint)  # type: ignore[arg-type]
            )
            variant = "checkpoint hit" if checkpoint else "nothing fires"
            rows.append((size, variant, bodies.mean_bytes(), figures))
            print(size, variant, {k: round(v) for k, v in figures.items()}, file=sys.stderr)
    lines = [
        "# Request-path CPU by step, in process (µs, median over requests)",
        "",
        f"Command: `python -m bench.request_cost {' '.join(argv or sys.argv[1:])}`; "
        f"{args.requests} requests per row, each adding one tool step.",
        "",
        f"Measured {stamp()} on {platform.machine()}, {os.cpu_count()} CPUs (load average, "
        f"1 min: {load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end). "
        "Thread CPU of each "
        "step (process CPU for `store`, `compact` and `flow`, which hop to other threads); "
        "`flow` is measured in its own pass, so it is not the sum of the columns.",
        "",
        "| size | variant | body bytes | " + " | ".join(STEPS) + f" | {QUIET_ANSWERS} |",
        "|---|---|---:|" + "---:|" * (len(STEPS) + 1),
    ]
    for size, variant, nbytes, figures in rows:
        lines.append(
            f"| {size} | {variant} | {nbytes:,} | "
            + " | ".join(f"{figures[s]:.0f}" for s in STEPS)
            + f" | {figures[QUIET_ANSWERS]:.0f}/{args.requests} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
