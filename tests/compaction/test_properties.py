"""Property tests: DESIGN section 3 invariants 1-4, 6 and 7 for truncation and sliding window.

Conversations are generated with system/developer messages (also mid-conversation), parallel
tool calls, results that arrive after unrelated messages or even after the next user message,
legacy function calls, unanswered calls and orphan results; half of them end in a long
single-turn agent loop (one user message, then tens of tool steps), where only the task
message and the newest step are protected.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    Mode,
    ModelFacts,
    Pipeline,
    compact,
)
from compaction_proxy.compaction.ledger import is_ledger
from compaction_proxy.compaction.strategies import (
    SlidingWindowStrategy,
    Strategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.triggers import GroupsExceed, OverBudget, TokenRatio, TurnsExceed

Msg = dict[str, Any]
TOK = CharacterEstimatorTokenizer()
SYSTEM = ("system", "developer")

text = st.text(alphabet="abcdefgh ", min_size=0, max_size=60)


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    ids = iter(range(10_000))
    msgs: list[Msg] = [
        {"role": draw(st.sampled_from(SYSTEM)), "content": draw(text)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    delayed: list[Msg] = []  # results that arrive late (after later messages)
    turns = draw(st.integers(0, 6))
    loop = draw(st.booleans())  # the newest turn is a long agent loop
    for turn in range(turns):
        if turn > 0 or draw(st.booleans()):
            msgs.append({"role": "user", "content": draw(text), "x-extra": turn})
        newest = turn == turns - 1
        for _ in range(draw(st.integers(8, 40) if loop and newest else st.integers(0, 3))):
            kind = draw(
                st.sampled_from(["text", "tools", "tools", "legacy", "orphan", "dev", "flush"])
            )
            if kind == "text":
                msgs.append({"role": "assistant", "content": draw(text)})
            elif kind == "dev":
                msgs.append({"role": "developer", "content": draw(text)})
            elif kind == "orphan":
                msgs.append(
                    {"role": "tool", "tool_call_id": f"ghost{next(ids)}", "content": draw(text)}
                )
            elif kind == "flush":
                msgs.extend(delayed)
                delayed.clear()
            elif kind == "legacy":
                name = draw(st.sampled_from(["f", "g"]))
                msgs.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "function_call": {"name": name, "arguments": draw(text)},
                    }
                )
                if draw(st.booleans()):
                    msgs.append({"role": "function", "name": name, "content": draw(text)})
            else:
                call_ids = [f"call{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
                msgs.append(
                    {
                        "role": "assistant",
                        "content": draw(st.none() | text),
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {"name": "t", "arguments": draw(text)},
                            }
                            for i in call_ids
                        ],
                    }
                )
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
    choice = draw(
        st.sampled_from(
            ["trunc_n", "trunc_trigger", "window_groups", "window_turns", "window_trigger"]
        )
    )
    floor = draw(st.integers(0, 3))
    if choice == "trunc_n":
        max_n = draw(st.integers(1, 400))
        return TruncationStrategy(
            max_n=max_n,
            compact_to=draw(st.integers(1, max_n)),
            metric=draw(st.sampled_from(["tokens", "messages"])),
            preserve_first_user_group=draw(st.booleans()),
            minimum_preserved=floor,
        )
    if choice == "trunc_trigger":
        trigger = draw(st.sampled_from([OverBudget(), TokenRatio(0.5), GroupsExceed(3)]))
        return TruncationStrategy(trigger=trigger, minimum_preserved=floor)
    if choice == "window_groups":
        return SlidingWindowStrategy(keep_last_groups=draw(st.integers(1, 6)))
    if choice == "window_turns":
        return SlidingWindowStrategy(
            keep_last_turns=draw(st.integers(1, 4)), minimum_preserved=floor
        )
    return SlidingWindowStrategy(
        trigger=TurnsExceed(draw(st.integers(0, 3))), minimum_preserved=floor
    )


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


def newest_user_and_step(msgs: list[Msg]) -> set[int]:
    """Indices invariant 4 protects, computed without the view: the newest user message, and
    the newest step (the last non-system message with its call and that call's results)."""
    out: set[int] = set()
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if users:
        out.add(users[-1])
    last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i]["role"] not in SYSTEM), None)
    if last is None:
        return out
    out.add(last)
    paired = pairs(msgs)
    call = next((c for c, r in paired if r == last), last)
    out.add(call)
    out.update(r for c, r in paired if c == call)
    return out


def run(
    msgs: list[Msg], strategy: Strategy | Pipeline, window: int, fallback: bool, mode: Mode
) -> Any:
    """``strategy`` alone in a pipeline, or a whole pipeline (its own composition)."""
    if isinstance(strategy, Pipeline):
        pipeline = dataclasses.replace(strategy, fallback=fallback)
    else:
        pipeline = Pipeline((strategy,), fallback=fallback)
    return compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=pipeline,
            tokenizer=TOK,
            facts=ModelFacts(window, 0),
            reserve_ratio=0,
            mode=mode,
        )
    )


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
    # 4. the newest user message and the newest step kept verbatim
    for index in newest_user_and_step(msgs):
        assert any(o is msgs[index] for o in out), index


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    strategies(),
    st.integers(30, 3000),
    st.booleans(),
    st.sampled_from([Mode.NORMAL, Mode.FORCE]),
)
def test_invariants_hold(
    msgs: list[Msg], strategy: Strategy, window: int, fallback: bool, mode: Mode
) -> None:
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


# ----------------------------------------------------------------------------------------
# Phase 2: every strategy alone and the default pipeline, over richer conversations (images,
# unicode, huge tool outputs, text-part arrays).  Strategies may now edit messages (pruning,
# clearing) or replace a group by a summary, so output messages are matched to the input by
# identity, or by a unique ``x-id`` field an edited copy must keep (invariant 5).

from compaction_proxy.compaction import CompactionSettings, SummarizationSettings, build_pipeline  # noqa: E402
from compaction_proxy.compaction.strategies import (  # noqa: E402
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    PipelineStrategy,
    SelectiveToolCallsStrategy,
    ToolResultCompactionStrategy,
)
from compaction_proxy.compaction.triggers import Always, TokensExceed  # noqa: E402

uni = st.text(alphabet="abc xyzé日本😀\n", min_size=0, max_size=40)
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}


@st.composite
def rich_conversations(draw: st.DrawFn) -> list[Msg]:
    ids = iter(range(10_000))

    def big() -> str:
        size = draw(st.sampled_from([0, 10, 200, 3000, 9000]))
        return (draw(uni) + "x" * size + draw(uni)) if size else draw(uni)

    def tool_content() -> Any:
        shape = draw(st.sampled_from(["text", "text", "parts", "image"]))
        if shape == "text":
            return big()
        parts: list[Any] = [
            {"type": "text", "text": big()},
            {"type": "text", "text": draw(uni), "cache_control": {"t": 1}},
        ]
        if shape == "image":
            parts.insert(1, IMAGE)
        return parts

    msgs: list[Msg] = [
        {"role": draw(st.sampled_from(SYSTEM)), "content": draw(uni)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    delayed: list[Msg] = []
    turns = draw(st.integers(0, 7))
    loop = draw(st.booleans())  # the newest turn is a long agent loop
    for turn in range(turns):
        if turn > 0 or draw(st.booleans()):
            content: Any = draw(uni)
            if draw(st.integers(0, 3)) == 0:
                content = [{"type": "text", "text": draw(uni)}, IMAGE]
            msgs.append({"role": "user", "content": content, "x-extra": {"turn": turn}})
        newest = turn == turns - 1
        for _ in range(draw(st.integers(8, 30) if loop and newest else st.integers(0, 3))):
            kind = draw(
                st.sampled_from(
                    ["text", "tools", "tools", "tools", "legacy", "orphan", "dev", "flush"]
                )
            )
            if kind == "text":
                msgs.append({"role": "assistant", "content": draw(uni), "refusal": None})
            elif kind == "dev":
                msgs.append({"role": "developer", "content": draw(uni)})
            elif kind == "orphan":
                msgs.append({"role": "tool", "tool_call_id": f"ghost{next(ids)}", "content": big()})
            elif kind == "flush":
                msgs.extend(delayed)
                delayed.clear()
            elif kind == "legacy":
                name = draw(st.sampled_from(["f", "g"]))
                msgs.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "function_call": {"name": name, "arguments": '{"a": 1}'},
                    }
                )
                if draw(st.booleans()):
                    msgs.append({"role": "function", "name": name, "content": big()})
            else:
                call_ids = [f"call{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
                msgs.append(
                    {
                        "role": "assistant",
                        "content": draw(st.none() | uni),
                        "reasoning_content": draw(uni),
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {
                                    "name": draw(st.sampled_from(["read", "search", "run"])),
                                    "arguments": draw(st.sampled_from(["{}", '{"q": "日本"}'])),
                                },
                            }
                            for i in call_ids
                        ],
                    }
                )
                for call_id in call_ids:
                    where = draw(st.sampled_from(["now", "now", "now", "later", "never"]))
                    result = {"role": "tool", "tool_call_id": call_id, "content": tool_content()}
                    if where == "now":
                        msgs.append(result)
                    elif where == "later":
                        delayed.append(result)
    if draw(st.booleans()):
        msgs.extend(delayed)
    for index, message in enumerate(msgs):
        message["x-id"] = index
    return msgs


def small_pruning(draw: st.DrawFn, **kwargs: Any) -> ContextPruningStrategy:
    return ContextPruningStrategy(
        keep_last_assistants=draw(st.integers(0, 3)),
        soft_trim_ratio=draw(st.sampled_from([0.0, 0.2, 0.3, 0.6])),
        hard_clear_ratio=draw(st.sampled_from([0.3, 0.5, 0.8, 1.0])),
        min_prunable_tool_chars=draw(st.sampled_from([0, 0, 50, 2000])),
        soft_trim_max_chars=draw(st.sampled_from([0, 100, 4000])),
        soft_trim_head_chars=draw(st.sampled_from([0, 20, 1500])),
        soft_trim_tail_chars=draw(st.sampled_from([0, 20, 1500])),
        hard_clear_enabled=draw(st.booleans()),
        **kwargs,
    )


def maybe_trigger(draw: st.DrawFn) -> dict[str, Any]:
    choice = draw(st.sampled_from(["none", "always", "ratio", "tokens"]))
    if choice == "always":
        return {"trigger": Always()}
    if choice == "ratio":
        return {"trigger": TokenRatio(0.8), "target": TokenRatio(0.5)}
    if choice == "tokens":
        return {"trigger": TokensExceed(draw(st.integers(0, 3000)))}
    return {}


@st.composite
def phase2_strategies(draw: st.DrawFn) -> tuple[str, Strategy | Pipeline]:
    choice = draw(
        st.sampled_from(
            [
                "pruning",
                "tool_result",
                "selective",
                "clear",
                "default",
                "plain_nested",
                "plain",
                "budget",
            ]
        )
    )
    if choice == "pruning":
        return choice, small_pruning(draw, **maybe_trigger(draw))
    if choice == "tool_result":
        return choice, ToolResultCompactionStrategy(
            keep_last_tool_call_groups=draw(st.integers(0, 2)),
            max_summary_chars=draw(st.sampled_from([20, 4096])),
            minimum_preserved=draw(st.integers(0, 2)),
            **maybe_trigger(draw),
        )
    if choice == "selective":
        return choice, SelectiveToolCallsStrategy(
            keep_last_tool_call_groups=draw(st.integers(0, 2)), **maybe_trigger(draw)
        )
    if choice == "clear":
        return choice, ClearToolUsesStrategy(
            keep=draw(st.integers(0, 3)),
            exclude_tools=draw(st.sampled_from([(), ("read",)])),
            clear_at_least=draw(st.sampled_from([0, 100, 5000])),
            clear_tool_inputs=draw(st.booleans()),
            **maybe_trigger(draw),
        )
    if choice == "budget":
        return choice, PipelineStrategy(
            [
                ToolResultCompactionStrategy(keep_last_tool_call_groups=draw(st.integers(0, 2))),
                TruncationStrategy(max_n=draw(st.integers(1, 3000))),
            ],
            token_budget=draw(st.integers(0, 5000)),
        )
    block = SummarizationSettings.model_validate(
        {
            "contextPruning": {
                "keepLastAssistants": draw(st.integers(0, 3)),
                "minPrunableToolChars": 100,
                "softTrim": {"maxChars": 200, "headChars": 50, "tailChars": 50},
            }
        }
    )
    if choice == "plain":
        # The Agent Framework's .NET pipeline as a config writes it (a plain pipeline: every
        # entry by its own trigger), thresholds drawn; summarization skips (no summarizer).
        settings = CompactionSettings.model_validate(
            {
                "pipeline": [
                    {
                        "strategy": "tool_result_compaction",
                        "trigger": {"tokens_exceed": draw(st.integers(0, 3000))},
                    },
                    {
                        "strategy": "summarization",
                        "trigger": {"tokens_exceed": draw(st.integers(0, 3000))},
                    },
                    {
                        "strategy": "sliding_window",
                        "trigger": {"turns_exceed": draw(st.integers(0, 4))},
                    },
                    {
                        "strategy": "truncation",
                        "trigger": {"tokens_exceed": draw(st.integers(0, 20_000))},
                    },
                ]
            }
        )
        return choice, build_pipeline(settings)
    default = build_pipeline(CompactionSettings(), block)
    if choice == "default":  # the token-budget composition with hysteresis, as it runs
        return choice, default
    return choice, PipelineStrategy(list(default.strategies))  # its entries, plain


def check_invariants_phase2(
    msgs: list[Msg], out: list[Msg], *, media_kept: bool, last_resort: bool = False
) -> None:
    by_id = {m["x-id"]: i for i, m in enumerate(msgs)}
    positions: list[int] = []
    for message in out:
        if "x-id" not in message and is_ledger(message.get("content")):  # the ledger
            # in the summary placement's role (user unless a pipeline places them elsewhere)
            assert set(message) == {"role", "content"}
            continue
        if "x-id" not in message:  # a synthetic [Tool results: ...] summary
            assert set(message) == {"role", "content"} and message["role"] == "assistant"
            assert message["content"].startswith("[Tool results: ")
            continue
        index = by_id[message["x-id"]]
        original = msgs[index]
        positions.append(index)
        if message is original:
            continue
        # 5. an edited copy keeps every field; only content / call arguments change
        assert set(message) == set(original)
        changed = {k for k in original if message[k] != original[k]}
        assert changed <= {"content", "tool_calls", "function_call"}
        assert message["role"] in ("tool", "function", "assistant")
        for new, old in zip(
            message.get("tool_calls") or [], original.get("tool_calls") or [], strict=True
        ):
            assert (new["id"], new["type"], new["function"]["name"]) == (
                old["id"],
                old["type"],
                old["function"]["name"],
            )
            json.loads(new["function"]["arguments"])
        if media_kept and "content" in changed and isinstance(original["content"], list):
            kept_media = [p for p in original["content"] if p.get("type") != "text"]
            if kept_media:  # pruning never hard-clears: media parts survive in order
                assert [p for p in message["content"] if p.get("type") != "text"] == kept_media
    # 2. relative order unchanged
    assert positions == sorted(set(positions))
    kept = set(positions)
    # 1. system/developer messages kept, byte for byte
    for m in msgs:
        if m["role"] in SYSTEM:
            assert any(o is m for o in out)
    # 3. calls and results live or die together; orphans are untouched when kept
    paired = pairs(msgs)
    for call_index, result_index in paired:
        assert (call_index in kept) == (result_index in kept)
    answered = {r for _, r in paired}
    for i, m in enumerate(msgs):
        if m["role"] in ("tool", "function") and i not in answered and i in kept:
            assert any(o is m for o in out)
    # 4. the newest user message and the newest step verbatim; only the last resort may
    # soft-trim a tool result of the step (never user or system text)
    for index in newest_user_and_step(msgs):
        original = msgs[index]
        if any(o is original for o in out):
            continue
        copy = next(o for o in out if o.get("x-id") == original["x-id"])
        assert last_resort and original["role"] in ("tool", "function"), index
        assert "soft-trimmed" in json.dumps(copy["content"], ensure_ascii=False)


@settings(
    max_examples=int(os.environ.get("PROPERTY_EXAMPLES", "500")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    rich_conversations(),
    phase2_strategies(),
    st.integers(50, 20_000),
    st.booleans(),
    st.sampled_from([Mode.NORMAL, Mode.FORCE]),
)
def test_phase2_invariants_hold(
    msgs: list[Msg],
    chosen: tuple[str, Strategy | Pipeline],
    window: int,
    fallback: bool,
    mode: Mode,
) -> None:
    name, strategy = chosen
    snapshot = orjson.dumps(msgs)
    result = run(msgs, strategy, window, fallback, mode)
    assert orjson.dumps(msgs) == snapshot  # the input is never mutated
    # clear_tool_uses clears a whole result, images included (Anthropic's edit does)
    last_resort = bool(result.report.last_resort and result.report.last_resort.changed)
    check_invariants_phase2(
        msgs, result.messages, media_kept=name != "clear", last_resort=last_resort
    )
    if not result.changed:
        assert all(x is y for x, y in zip(result.messages, msgs, strict=True))
    # 6. deterministic
    again = run(msgs, strategy, window, fallback, mode)
    assert orjson.dumps(again.messages) == orjson.dumps(result.messages)
    # 7. idempotent (position-aged pruning is settled on the final array by the pipeline)
    second = run(result.messages, strategy, window, fallback, mode)
    assert not second.changed, (name, second.report.to_dict(), result.report.to_dict())
    # 8. under budget whenever possible, else a warning
    report = result.report
    if fallback and report.tokens_after > report.budget:
        assert report.warnings
    event(f"{name}: changed={result.changed}")
