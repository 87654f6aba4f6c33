"""Conformance with the Agent Framework's Python implementation (agent-framework-core 1.23).

Where a strategy carries the anchor's name and parameters its output must match the anchor's
on the same messages (DESIGN section 10), except where DESIGN's invariants say otherwise: the
Agent Framework may drop the newest turn's user message, we never do.  So: when the oracle's
output keeps the whole newest turn, ours must be identical; otherwise ours must be the
oracle's output plus the newest-turn messages it dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

af = pytest.importorskip("agent_framework")
afc = pytest.importorskip("agent_framework._compaction")

from proxy.compaction import (  # noqa: E402
    CharacterEstimatorTokenizer,
    ModelFacts,
    Pipeline,
    SlidingWindowStrategy,
    Strategy,
    TruncationStrategy,
    compact,
)

Msg = dict[str, Any]


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    msgs: list[Msg] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "S"})
    counter = 0
    for _ in range(draw(st.integers(1, 6))):
        msgs.append({"role": "user", "content": ""})
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                msgs.append({"role": "assistant", "content": ""})
            else:
                ids = [f"c{counter + k}" for k in range(draw(st.integers(1, 2)))]
                counter += len(ids)
                msgs.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "t", "arguments": "{}"}}
                    for i in ids]})
                msgs.extend({"role": "tool", "tool_call_id": i, "content": ""} for i in ids)
    for index, message in enumerate(msgs):  # a unique label per message
        if message["content"] is not None:
            message["content"] = f"m{index}"
        message["label"] = f"m{index}"
    return msgs


def to_af(msgs: list[Msg]) -> list[Any]:
    out = []
    for m in msgs:
        if m.get("tool_calls"):
            contents = [afc.Content.from_function_call(call_id=c["id"], name="t", arguments="{}")
                        for c in m["tool_calls"]]
        elif m["role"] == "tool":
            contents = [afc.Content.from_function_result(call_id=m["tool_call_id"],
                                                         result=m["content"])]
        else:
            contents = [m["content"]]
        out.append(af.Message(role=m["role"], contents=contents, message_id=m["label"]))
    return out


def oracle(msgs: list[Msg], strategy: Any) -> list[str]:
    result = asyncio.run(afc.apply_compaction(to_af(msgs), strategy=strategy))
    return [m.message_id for m in result]


def ours(msgs: list[Msg], strategy: Strategy) -> list[str]:
    result = compact(msgs, model="m", pipeline=Pipeline((strategy,), fallback=False),
                     tokenizer=CharacterEstimatorTokenizer(),
                     facts=ModelFacts(1_000_000, 0), reserve_ratio=0)
    return [m["label"] for m in result.messages]


def assert_conforms(msgs: list[Msg], expected: list[str], actual: list[str]) -> None:
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    tail = [m["label"] for m in msgs[last_user:]]
    if all(label in expected for label in tail):
        assert actual == expected
    else:  # the anchor dropped part of the newest turn; we keep it (invariant 4)
        order = {m["label"]: i for i, m in enumerate(msgs)}
        assert actual == sorted(set(expected) | set(tail), key=order.__getitem__)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(1, 20), st.integers(1, 20), st.booleans())
def test_truncation_matches_the_agent_framework(msgs: list[Msg], max_n: int, compact_to: int,
                                                first_user: bool) -> None:
    compact_to = min(compact_to, max_n)
    expected = oracle(msgs, afc.TruncationStrategy(max_n=max_n, compact_to=compact_to,
                                                   preserve_first_user_group=first_user))
    actual = ours(msgs, TruncationStrategy(max_n=max_n, compact_to=compact_to,
                                           metric="messages",
                                           preserve_first_user_group=first_user))
    assert_conforms(msgs, expected, actual)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(1, 8))
def test_sliding_window_matches_the_agent_framework(msgs: list[Msg], keep: int) -> None:
    expected = oracle(msgs, afc.SlidingWindowStrategy(keep_last_groups=keep))
    actual = ours(msgs, SlidingWindowStrategy(keep_last_groups=keep))
    assert_conforms(msgs, expected, actual)
