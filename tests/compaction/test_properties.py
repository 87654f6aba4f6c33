"""Property tests: DESIGN section 3 invariants 1-4, 6 and 7 for truncation and sliding window.

Conversations are generated with system/developer messages (also mid-conversation), parallel
tool calls, results that arrive after unrelated messages or even after the next user message,
legacy function calls, unanswered calls and orphan results.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.compaction import (
    CharacterEstimatorTokenizer,
    Mode,
    ModelFacts,
    Pipeline,
    SlidingWindowStrategy,
    Strategy,
    TruncationStrategy,
    compact,
)
from proxy.compaction.triggers import GroupsExceed, OverBudget, TokenRatio, TurnsExceed

Msg = dict[str, Any]
TOK = CharacterEstimatorTokenizer()
SYSTEM = ("system", "developer")

text = st.text(alphabet="abcdefgh ", min_size=0, max_size=60)


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    ids = iter(range(10_000))
    msgs: list[Msg] = [{"role": draw(st.sampled_from(SYSTEM)), "content": draw(text)}
                       for _ in range(draw(st.integers(0, 2)))]
    delayed: list[Msg] = []  # results that arrive late (after later messages)
    for turn in range(draw(st.integers(0, 6))):
        if turn > 0 or draw(st.booleans()):
            msgs.append({"role": "user", "content": draw(text), "x-extra": turn})
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["text", "tools", "tools", "legacy", "orphan", "dev",
                                         "flush"]))
            if kind == "text":
                msgs.append({"role": "assistant", "content": draw(text)})
            elif kind == "dev":
                msgs.append({"role": "developer", "content": draw(text)})
            elif kind == "orphan":
                msgs.append({"role": "tool", "tool_call_id": f"ghost{next(ids)}",
                             "content": draw(text)})
            elif kind == "flush":
                msgs.extend(delayed)
                delayed.clear()
            elif kind == "legacy":
                name = draw(st.sampled_from(["f", "g"]))
                msgs.append({"role": "assistant", "content": None,
                             "function_call": {"name": name, "arguments": draw(text)}})
                if draw(st.booleans()):
                    msgs.append({"role": "function", "name": name, "content": draw(text)})
            else:
                call_ids = [f"call{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
                msgs.append({"role": "assistant", "content": draw(st.none() | text),
                             "tool_calls": [{"id": i, "type": "function",
                                             "function": {"name": "t", "arguments": draw(text)}}
                                            for i in call_ids]})
                if draw(st.booleans()):
                    msgs.append({"role": "assistant", "content": draw(text)})
                for call_id in call_ids:
                    where = draw(st.sampled_from(["now", "now", "later", "never"]))
                    result = {"role": "tool", "tool_call_id": call_id, "content": draw(text)}
                    if where == "now":
                        msgs.append(result)
                    elif where == "later":
                        delayed.append(result)
    if draw(st.booleans()):
        msgs.extend(delayed)
    return msgs


@st.composite
def strategies(draw: st.DrawFn) -> Strategy:
    choice = draw(st.sampled_from(["trunc_n", "trunc_trigger", "window_groups", "window_turns",
                                   "window_trigger"]))
    floor = draw(st.integers(0, 3))
    if choice == "trunc_n":
        max_n = draw(st.integers(1, 400))
        return TruncationStrategy(max_n=max_n, compact_to=draw(st.integers(1, max_n)),
                                  metric=draw(st.sampled_from(["tokens", "messages"])),
                                  preserve_first_user_group=draw(st.booleans()),
                                  minimum_preserved=floor)
    if choice == "trunc_trigger":
        trigger = draw(st.sampled_from([OverBudget(), TokenRatio(0.5), GroupsExceed(3)]))
        return TruncationStrategy(trigger=trigger, minimum_preserved=floor)
    if choice == "window_groups":
        return SlidingWindowStrategy(keep_last_groups=draw(st.integers(1, 6)))
    if choice == "window_turns":
        return SlidingWindowStrategy(keep_last_turns=draw(st.integers(1, 4)),
                                     minimum_preserved=floor)
    return SlidingWindowStrategy(trigger=TurnsExceed(draw(st.integers(0, 3))),
                                 minimum_preserved=floor)


def pairs(msgs: list[Msg]) -> list[tuple[int, int]]:
    """(call index, result index) pairs, computed independently of the view."""
    out: list[tuple[int, int]] = []
    pending: dict[str, int] = {}
    functions: dict[str, list[int]] = {}
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                pending[c["id"]] = i
            if m.get("function_call"):
                functions.setdefault(m["function_call"]["name"], []).append(i)
        elif m["role"] == "tool" and m["tool_call_id"] in pending:
            out.append((pending.pop(m["tool_call_id"]), i))
        elif m["role"] == "function" and functions.get(m["name"]):
            out.append((functions[m["name"]].pop(), i))
    return out


def run(msgs: list[Msg], strategy: Strategy, window: int, fallback: bool,
        mode: Mode) -> Any:
    return compact(msgs, model="m", pipeline=Pipeline((strategy,), fallback=fallback),
                   tokenizer=TOK, facts=ModelFacts(window, 0), reserve_ratio=0, mode=mode)


def check_invariants(msgs: list[Msg], out: list[Msg]) -> None:
    # 2. relative order unchanged (and every output message is an original, unedited dict)
    positions = [next(i for i, m in enumerate(msgs) if m is o) for o in out]
    assert positions == sorted(set(positions))
    kept = set(positions)
    # 1. system/developer messages all kept, byte for byte
    assert all(i in kept for i, m in enumerate(msgs) if m["role"] in SYSTEM)
    # 3. no new orphans: a call and its result live or die together
    for call_index, result_index in pairs(msgs):
        assert (call_index in kept) == (result_index in kept)
    # 4. the newest turn's user message and everything after it kept verbatim
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if users:
        tail = msgs[users[-1]:]
        assert len(out) >= len(tail)
        assert all(x is y for x, y in zip(out[len(out) - len(tail):], tail, strict=True))
    elif any(m["role"] not in SYSTEM for m in msgs):
        assert any(m["role"] not in SYSTEM for m in out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), strategies(), st.integers(30, 3000), st.booleans(),
       st.sampled_from([Mode.NORMAL, Mode.FORCE]))
def test_invariants_hold(msgs: list[Msg], strategy: Strategy, window: int, fallback: bool,
                         mode: Mode) -> None:
    snapshot = orjson.dumps(msgs)
    result = run(msgs, strategy, window, fallback, mode)
    assert orjson.dumps(msgs) == snapshot  # the input is never mutated
    check_invariants(msgs, result.messages)
    if not result.changed:
        assert all(x is y for x, y in zip(result.messages, msgs, strict=True))
    # 6. deterministic
    again = run(msgs, strategy, window, fallback, mode)
    assert orjson.dumps(again.messages) == orjson.dumps(result.messages)
    # 7. idempotent
    second = run(result.messages, strategy, window, fallback, mode)
    assert not second.changed, (second.report.to_dict(), result.report.to_dict())
    # 8 (in part): with the fallback on, over budget only when nothing removable remains
    report = result.report
    if fallback and report.tokens_after > report.budget:
        assert report.warnings
    event(f"changed={result.changed}")
    event(f"fallback={bool(report.fallback and report.fallback.changed)}")
