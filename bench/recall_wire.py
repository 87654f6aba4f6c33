"""What reading and stripping a held reply costs the recall loop (compaction_proxy/wire/chat/
_recall.py, compaction_proxy/wire/responses/_recall.py), in process: a streamed reply of N text
deltas and two tool calls (one of them the recall tool's), and the same reply without calls
(an agent's answer: the common case, which a byte scan turns away before any parsing).

    python -m bench.recall_wire [--deltas 20000] [--runs 5] [--out F]

Thread CPU, best of ``--runs``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from compaction_proxy.wire.chat import CHAT
from compaction_proxy.wire.recall import RECALL_TOOL
from compaction_proxy.wire.responses import RESPONSES

CALLS = (("call_a", "read_file", '{"path":"build.log"}'), ("call_r", RECALL_TOOL, '{"ids":["r1"]}'))


def chat_stream(deltas: int, calls: bool) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": f"word{i} "}) for i in range(deltas)]
    for index, (call_id, name, arguments) in enumerate(CALLS if calls else ()):
        head = {"index": index, "id": call_id, "type": "function"}
        parts.append(chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        for piece in arguments:
            parts.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    parts.append(chunk({}, "tool_calls" if calls else "stop"))
    return b"".join([*parts, b"data: [DONE]\n\n"])


def responses_stream(deltas: int, calls: bool) -> bytes:
    sequence = itertools.count()
    parts: list[bytes] = []

    def event(kind: str, **fields: Any) -> None:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        parts.append(f"event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n")

    text = "".join(f"word{i} " for i in range(deltas))
    content = [{"type": "output_text", "text": text, "annotations": []}]
    output: list[dict[str, Any]] = [
        {"type": "message", "id": "msg_1", "role": "assistant", "content": content}
    ]
    for call_id, name, arguments in CALLS if calls else ():
        item = {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id}
        output.append({**item, "name": name, "arguments": arguments, "status": "completed"})
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": output}
    event("response.created", response={**response, "status": "in_progress", "output": []})
    for index, item in enumerate(output):
        event("response.output_item.added", output_index=index, item=item)
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            for i in range(deltas):
                event("response.output_text.delta", **where, content_index=0, delta=f"word{i} ")
        else:
            for piece in item["arguments"]:
                event("response.function_call_arguments.delta", **where, delta=piece)
        event("response.output_item.done", output_index=index, item=item)
    event("response.completed", response=response)
    return b"".join(parts)


def best_ms(run: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        run()
        best = min(best, time.thread_time() - start)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.recall_wire")
    parser.add_argument("--deltas", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [
        "| format | reply | MB | events | read ms | strip ms |",
        "|---|---|---|---|---|---|",
    ]
    for label, side, build in (
        ("chat completions", CHAT.recall, chat_stream),
        ("Responses", RESPONSES.recall, responses_stream),
    ):
        for calls in (True, False):
            body = build(args.deltas, calls)
            read = best_ms(lambda: side.read(body, stream=True, name=RECALL_TOOL), args.runs)
            strip = (
                f"{best_ms(lambda: side.strip(body, stream=True, name=RECALL_TOOL), args.runs):.1f}"
                if calls
                else "-"
            )
            what = "text + a client call + a recall call" if calls else "text only"
            count = body.count(b"\n\n")
            rows.append(
                f"| {label} | {what} | {len(body) / 1e6:.2f} | {count} | {read:.1f} | {strip} |"
            )
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out is not None:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
