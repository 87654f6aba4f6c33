"""Incremental requests (compaction_proxy/engine/_known.py): a body that extends its
conversation's previous one is parsed, validated, hashed and counted only in its new part,
and the answer is exactly the full path's.

Two properties, on generated sessions: the wire-level parse from the earlier body equals
orjson's parse of the whole (or declines), and, through the whole app (in process, respx as
the upstream), a proxy with the memory and one without forward the same bytes, answer the
same headers and statuses, and store the same checkpoint keys.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.config import Settings
from compaction_proxy.wire import parse_chat_body
from compaction_proxy.wire._increments import (
    common_prefix,
    extend,
    scanned,
    shared_items,
)
from compaction_proxy.wire._jsonspans import scan_object
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

UPSTREAM = "http://up.test/v1"
MODEL = "agent-model"
SYSTEM = "You are a careful coding agent. " + "Follow the repository's rules. " * 700

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


# --------------------------------------------------------------------------- sessions


def step(index: int, size: int) -> list[dict[str, Any]]:
    """One tool step: the call and its result (``size`` words)."""
    call_id = f"call_{index}"
    words = " ".join(f"w{index}_{j}" for j in range(size))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "f{index}.py"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": f"result {index}: {words}"},
    ]


def opening() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the build"}]


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def sdk_bytes(messages: list[dict[str, Any]]) -> bytes:
    """As the openai SDK writes a body: ``messages`` first, then ``model`` and ``tools``."""
    return json.dumps({"messages": messages, "model": MODEL, "tools": TOOLS}).encode()


Op = tuple[str, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.integers(1, 400)),
        st.tuples(st.just("big"), st.integers(9_000, 12_000)),  # a tail past the thread hop
        st.tuples(st.just("fork"), st.integers(0, 6)),
        st.tuples(st.just("edit"), st.integers(0, 6)),
        st.tuples(st.just("compact"), st.integers(0, 0)),  # orjson's formatting, model first
        st.tuples(st.just("duplicate"), st.integers(0, 0)),
        st.tuples(st.just("trailing_comma"), st.integers(0, 0)),
        st.tuples(st.just("bad_tail"), st.integers(0, 0)),
        st.tuples(st.just("unknown_role"), st.integers(0, 0)),
    ),
    min_size=4,
    max_size=14,
)


def labelled(ops: list[Op]) -> list[tuple[str, bytes]]:
    """The requests of one session, each with the op that made it: mostly a step at a time,
    with forks, edits and bodies the proxy must refuse or read differently."""
    messages = opening()
    out: list[tuple[str, bytes]] = [("open", sdk_bytes(messages))]
    for index, (op, value) in enumerate(ops):
        if op in ("step", "big"):
            messages = [*messages, *step(index, value)]
            out.append((op, sdk_bytes(messages)))
        elif op == "fork":
            keep = max(2, len(messages) - 2 * (value + 1))
            messages = [*messages[:keep], *step(index, 20)]
            out.append((op, sdk_bytes(messages)))
        elif op == "edit" and len(messages) > 3:
            at = max(2, len(messages) - 1 - value)
            edited = dict(messages[at])
            edited["content"] = f"edited {index}"
            messages = [*messages[:at], edited, *messages[at + 1 :]]
            out.append((op, sdk_bytes(messages)))
        elif op == "compact":
            out.append((op, orjson.dumps({"model": MODEL, "messages": messages, "tools": TOOLS})))
        elif op == "duplicate":  # a parser keeps the last `messages`
            raw = sdk_bytes([*messages, *step(index, 5)])
            again = b', "messages": ' + json.dumps(messages[:3]).encode()
            out.append((op, raw[:-1] + again + b"}"))
        elif op == "trailing_comma":
            raw = sdk_bytes(messages)
            cut = raw.rindex(b'], "model"')
            out.append((op, raw[:cut] + b",]" + raw[cut + 1 :]))
        elif op == "bad_tail":
            out.append((op, sdk_bytes([*messages, *step(index, 5)])[:-3]))
        elif op == "unknown_role":
            out.append((op, sdk_bytes([*messages, {"role": "narrator", "content": "x"}])))
    return out


def bodies(ops: list[Op]) -> list[bytes]:
    return [raw for _, raw in labelled(ops)]


# --------------------------------------------------------------------------- the wire level


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_a_body_parsed_from_the_earlier_one_is_the_whole_parse(ops: list[Op]) -> None:
    earlier = None
    extended = 0
    earlier_op = ""
    expected = 0  # steps on top of a body in the same (the SDK's) formatting
    for op, raw in labelled(ops):
        if op in ("step", "big") and earlier_op in ("open", "step", "big", "fork", "edit"):
            expected += 1
        try:
            whole: dict[str, Any] | None = orjson.loads(raw)
        except orjson.JSONDecodeError:
            whole = None
        if earlier is not None:
            made = extend(raw, earlier, parse_chat_body, shared_items(raw, earlier))
            if whole is None:
                assert made is None
            elif made is not None:
                extended += 1
                assert made.data == whole
                assert list(made.data) == list(whole)  # key order too
                full = scan_object(raw, expected=whole, elements_of="messages").elements
                assert full is not None
                assert (made.spans.starts, made.spans.ends) == (full.starts, full.ends)
                assert made.data["messages"][: made.shared] == earlier.items[: made.shared]
        if whole is not None and isinstance(whole.get("messages"), list):
            scan = scanned(raw, whole, "messages")
            if scan is not None:
                earlier, earlier_op = scan, op
    assert extended >= expected


def test_common_prefix_finds_the_first_difference() -> None:
    a = bytes(range(256)) * 1000
    for at in (0, 1, 65_535, 65_536, 100_000, len(a) - 1):
        b = bytearray(a)
        b[at] ^= 0xFF
        assert common_prefix(a, bytes(b), len(a)) == at
    assert common_prefix(a, a, len(a)) == len(a)
    assert common_prefix(a, a[:10], len(a)) == 10


def test_a_duplicate_key_written_with_an_escape_takes_the_full_path() -> None:
    messages = [*opening(), *step(1, 50)]
    earlier = scanned(sdk_bytes(messages), orjson.loads(sdk_bytes(messages)), "messages")
    assert earlier is not None
    raw = sdk_bytes([*messages, *step(2, 5)])
    raw = raw[:-1] + b', "mess\\u0061ges": [{"role": "user", "content": "other"}]}'
    assert orjson.loads(raw)["messages"] == [{"role": "user", "content": "other"}]
    assert extend(raw, earlier, parse_chat_body, shared_items(raw, earlier)) is None


# --------------------------------------------------------------------------- the whole app


class Edge:
    """One in-process proxy with its own SQLite store, respx as the upstream."""

    def __init__(self, path: Path, memory_mb: int) -> None:
        config = Settings(
            server={"conversation_memory_mb": memory_mb},
            upstreams=[{"name": "up", "base_url": UPSTREAM}],
            models={MODEL: {"context_window": 16_000, "max_output_tokens": 1_000}},
            store={"backend": "sqlite", "path": str(path)},
            # Summaries prepared in the background finish when they finish: the stores would
            # differ by timing, not by path.
            summarization={"prepare": False},
        )
        self.path = path
        self.mock = respx.MockRouter(assert_all_called=False)
        self.route = self.mock.post(f"{UPSTREAM}/chat/completions").respond(200, json=COMPLETION)
        self.upstream = httpx.AsyncClient(transport=_RespxTransport(self.mock))
        self.app = in_process(config, self.upstream)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://proxy"
        )

    async def send(self, raw: bytes) -> tuple[int, bytes, dict[str, str], bytes | None]:
        calls = self.route.call_count
        response = await self.client.post(
            "/v1/chat/completions", content=raw, headers={"authorization": "Bearer sk-a"}
        )
        forwarded = self.route.calls.last.request.content if self.route.call_count > calls else None
        headers = {k: v for k, v in response.headers.items() if k.startswith("x-compaction")}
        return response.status_code, response.content, headers, forwarded

    def keys(self) -> set[tuple[str, str]]:
        if not self.path.exists():
            return set()  # no request reached the store (a session of one short body)
        with sqlite3.connect(self.path) as db:
            return set(db.execute("SELECT namespace, key FROM checkpoints"))

    async def close(self) -> None:
        await self.client.aclose()
        await self.upstream.aclose()
        self.app.state.compactor.close()


async def both_ways(tmp: Path, ops: list[Op], seen: set[str] | None = None) -> tuple[int, int]:
    """Every body of the session to a proxy with the memory and one without: the same
    answers; returns the bodies sent and how many were parsed from an earlier one."""
    on, off = Edge(tmp / "on.db", 256), Edge(tmp / "off.db", 0)
    try:
        sent = 0
        for raw in bodies(ops):
            got, expected = await on.send(raw), await off.send(raw)
            assert got == expected
            if seen is not None:
                seen.add(got[2].get("x-compaction-checkpoint", "-"))
            sent += 1
        assert on.keys() == off.keys()
        return sent, on.app.state.compactor.memory.extended
    finally:
        await on.close()
        await off.close()


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(OPS)
def test_memory_on_and_off_forward_report_and_store_the_same(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Op]
) -> None:
    tmp = tmp_path_factory.mktemp("known")
    sent, extended = asyncio.run(both_ways(tmp, ops))
    assert sent == len(bodies(ops))
    steps = sum(1 for op, _ in ops if op in ("step", "big"))
    assert extended >= min(1, steps)


def test_a_long_session_compacts_alike_and_is_read_incrementally(tmp_path: Path) -> None:
    """Forty steps on a 16k window: compaction fires, checkpoints are hit, and every request
    after the first is parsed from the one before."""
    ops: list[Op] = [("step", 200 + (i * 37) % 300) for i in range(40)]
    seen: set[str] = set()
    sent, extended = asyncio.run(both_ways(tmp_path, ops, seen))
    assert extended == sent - 1
    assert {"none", "new", "hit"} <= seen
