"""What writing the forwarded body costs: the client's bytes spliced vs the parsed body re-dumped.

When compaction fires or a checkpoint stands in for the older messages, the proxy forwards a
body it changed. It used to serialize the parsed request whole (``orjson.dumps``), which also
rewrote every number orjson does not keep as written; it now splices the new messages into the
client's bytes (compaction_proxy/wire/_forwarded.py, on the spans of compaction_proxy/wire/_jsonspans.py).
This measures both on agent-session bodies (bench/agent_bodies.py), in process, with the
proxy's own flow making the messages (a checkpoint hit for every request, and the compaction
that made the checkpoint), for two spellings of the same body:

* ``compact``: what the SDKs send (no spaces: the spans are found by comparison);
* ``indented``: the same body pretty-printed (every span found by the regular-expression scan).

It also times reading ``model`` for ``X-Compaction: off`` (orjson, and the lenient scan a body
orjson refuses gets). Thread CPU time, median over the requests, in µs.

    python -m bench.forwarded_body [--sizes 8k,32k,128k,500k] [--requests 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.agent_bodies import SIZES, SessionBodies, agent_session, tokenizers
from bench.gateway_agent import ckpt_model, ckpt_window, proxy_config
from bench.request_cost import _edge

COLUMNS = ("dumps (before)", "splice (after)", "element spans", "elements")


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.thread_time_ns()
    value = fn()
    return (time.thread_time_ns() - start) / 1e3, value


def _measure(raw: bytes, data: dict[str, Any], messages: list[Any]) -> dict[str, float]:
    from compaction_proxy.wire import ClientBody, scan_object

    before, old = _cpu(lambda: orjson.dumps({**data, "messages": messages}))
    after, new = _cpu(
        lambda: ClientBody(raw, data, "messages").with_elements(messages, copies=True)
    )
    scan, _ = _cpu(lambda: scan_object(raw, expected=data, elements_of="messages"))
    assert orjson.loads(new) == orjson.loads(old), "the splice and the dump disagree"
    return {
        "dumps (before)": before,
        "splice (after)": after,
        "element spans": scan,
        "elements": float(len(messages)),
    }


async def _rows(size: str, requests: int, tmp: Path, env_dir: str | None) -> list[Any]:
    from compaction_proxy.compaction import Mode
    from compaction_proxy.engine import FlowRequest

    tok = tokenizers().get("o200k_base")
    session = agent_session(SIZES[size], tok)
    model = ckpt_model(size)
    bodies = SessionBodies.build(session, model)
    config = proxy_config(
        tmp / f"{size}.yaml", 1, tmp / f"{size}.db", {model: ckpt_window(session.base_tokens)}
    )
    _compactor, flow = _edge(config, env_dir)
    rows = []
    for spelling in ("compact", "indented"):

        def spelled(raw: bytes, spelling: str = spelling) -> bytes:
            return (
                raw if spelling == "compact" else json.dumps(orjson.loads(raw), indent=1).encode()
            )

        async def run(raw: bytes) -> Any:
            data = orjson.loads(raw)
            result = await flow.run(
                FlowRequest(
                    data,
                    Mode.NORMAL,
                    size_hint=len(raw),
                    credential=f"k-{spelling}",
                    caller_key=None,
                    upstream_name="mock",
                )
            )
            return data, result

        base = spelled(bodies.base())
        data, fired = await run(base)
        assert fired.messages is not None and fired.save is not None, "the base did not fire"
        await fired.save()
        rows.append(
            (
                size,
                "compaction fired",
                spelling,
                len(base),
                _measure(base, data, list(fired.messages)),
            )
        )
        samples: list[dict[str, float]] = []
        for i in range(requests):
            raw = spelled(bodies.body(i, 0, 1))
            data, hit = await run(raw)
            assert hit.checkpoint == "hit" and hit.messages is not None, hit.checkpoint
            samples.append(_measure(raw, data, list(hit.messages)))
        median = {c: statistics.median(s[c] for s in samples) for c in COLUMNS}
        rows.append((size, "checkpoint hit", spelling, len(raw), median))
    return rows


def _off_read(size: str) -> tuple[float, float]:
    """``X-Compaction: off``: reading ``model`` with orjson, and leniently (BOM-prefixed)."""
    from compaction_proxy.upstream import json_model

    tok = tokenizers().get("o200k_base")
    raw = SessionBodies.build(agent_session(SIZES[size], tok), "m").body(0)
    bom = b"\xef\xbb\xbf" + raw
    fast = statistics.median(_cpu(lambda: json_model(raw))[0] for _ in range(15))
    lenient = statistics.median(_cpu(lambda: json_model(bom))[0] for _ in range(15))
    assert json_model(bom).model == "m"
    return fast, lenient


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8k,32k,128k,500k")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    provider = tokenizers()
    env_dir = str(provider.loader.directories[0]) if provider.loader.directories else None
    tmp = Path(tempfile.mkdtemp(prefix="bench-forwarded-"))
    rows: list[Any] = []
    off: list[tuple[str, float, float]] = []
    for size in args.sizes.split(","):
        rows.extend(asyncio.run(_rows(size, args.requests, tmp, env_dir)))
        off.append((size, *_off_read(size)))
        print(size, "done", file=sys.stderr)
    lines = [
        "# Writing the forwarded body: client bytes spliced vs the parsed body re-dumped",
        "",
        f"Command: `python -m bench.forwarded_body {' '.join(argv or sys.argv[1:])}`; "
        f"thread CPU µs, median over {args.requests} requests per checkpoint-hit row (one "
        "compaction per fired row). `splice` includes the scan (a fresh `ClientBody`).",
        "",
        "| size | request | spelling | body bytes | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for size, request, spelling, nbytes, figures in rows:
        lines.append(
            f"| {size} | {request} | {spelling} | {nbytes:,} | "
            + " | ".join(f"{figures[c]:.0f}" for c in COLUMNS)
            + " |"
        )
    lines += [
        "",
        "`X-Compaction: off`, reading `model` to route (µs): orjson / lenient scan (BOM body)",
        "",
        "| size | orjson | lenient |",
        "|---|---:|---:|",
        *(f"| {size} | {fast:.0f} | {lenient:.0f} |" for size, fast, lenient in off),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
