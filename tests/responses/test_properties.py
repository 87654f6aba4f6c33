"""Property tests of the Responses adapter on generated conversations.

Conversations mix what stateless Responses clients send: system and developer messages (also
mid-conversation), user turns with text and image parts, reasoning items with encrypted
content, parallel function calls whose outputs come at once or later, custom tool calls,
hosted calls (web search, MCP) that carry their own result, computer and shell calls with
their outputs, and item types the proxy does not know (one pair of them linked by a
``call_id``). Half end in a long single-turn agent loop.

Properties: with nothing to compact, items -> messages -> items gives back the client's own
objects (through a checkpoint's JSON too); and whatever the pipeline does, the items forwarded
keep invariants 1-8 of compaction_proxy/compaction/README.md ("Groups and invariants"), stated on
items:
system messages in place, order kept, every call with its output, reasoning with its item,
the newest user message and step verbatim, unknown fields untouched, deterministic,
idempotent, and under budget whenever the protected items alone fit.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    Mode,
    ModelFacts,
    Pipeline,
    compact,
)
from compaction_proxy.compaction.strategies import (
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    SlidingWindowStrategy,
    Strategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.triggers import OverBudget, TokenRatio
from compaction_proxy.wire.responses import Lowered, lift, lower
from compaction_proxy.wire.responses._items import CALL_KEYS, OUTPUT_KEYS, item_type
from compaction_proxy.wire.responses._lift import build_units

Item = dict[str, Any]
TOK = CharacterEstimatorTokenizer()
EXAMPLES = int(os.environ.get("RESPONSES_PROPERTY_EXAMPLES", "150"))

text = st.text(alphabet="abcdefgh ", min_size=0, max_size=40)
big = st.integers(0, 900).map(lambda n: "r" * n)


@st.composite
def conversations(draw: st.DrawFn) -> list[Item]:
    ids = itertools.count()
    items: list[Item] = [
        {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(text)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    late: list[Item] = []
    turns = draw(st.integers(1, 5))
    loop = draw(st.booleans())
    for turn in range(turns):
        items.append(draw(user_messages(turn)))
        newest = turn == turns - 1
        for _ in range(draw(st.integers(6, 24) if loop and newest else st.integers(0, 4))):
            if draw(st.integers(0, 3)) == 0:
                n = next(ids)
                items.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{n}",
                        "summary": [],
                        "encrypted_content": "e" * 30,
                    }
                )
            kind = draw(
                st.sampled_from(
                    [
                        "text",
                        "calls",
                        "calls",
                        "custom",
                        "hosted",
                        "computer",
                        "shell",
                        "other",
                        "dev",
                        "flush",
                    ]
                )
            )
            if kind == "text":
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": draw(text), "annotations": []}],
                    }
                )
            elif kind == "dev":
                items.append({"role": "developer", "content": draw(text)})
            elif kind == "flush":
                items.extend(late)
                late.clear()
            elif kind == "hosted":
                n = next(ids)
                if draw(st.booleans()):
                    items.append(
                        {
                            "type": "web_search_call",
                            "id": f"ws_{n}",
                            "status": "completed",
                            "action": {"query": draw(text)},
                        }
                    )
                else:
                    items.append(
                        {
                            "type": "mcp_call",
                            "id": f"mcp_{n}",
                            "server_label": "s",
                            "name": "t",
                            "arguments": "{}",
                            "output": draw(big),
                        }
                    )
            elif kind == "other":
                n = next(ids)
                if draw(st.booleans()):
                    items.append({"type": "future_thing", "n": n, "payload": draw(text)})
                else:
                    items.append(
                        {"type": "program", "id": f"p{n}", "call_id": f"prog{n}", "code": "x"}
                    )
                    result = {
                        "type": "program_output",
                        "id": f"po{n}",
                        "call_id": f"prog{n}",
                        "result": draw(text),
                    }
                    (items if draw(st.booleans()) else late).append(result)
            else:
                pairs = draw(st.integers(1, 3)) if kind == "calls" else 1
                for _ in range(pairs):
                    call_id = f"call{next(ids)}"
                    call, result = tool_pair(kind, call_id, draw(text), draw(big))
                    items.append(call)
                    if draw(st.sampled_from(["now", "now", "now", "now", "later"])) == "now":
                        items.append(result)
                    else:
                        late.append(result)
    items.extend(late)
    return items


@st.composite
def user_messages(draw: st.DrawFn, turn: int) -> Item:
    shape = draw(st.sampled_from(["easy", "parts", "image"]))
    words = draw(text)
    if shape == "easy":
        return {"role": "user", "content": f"{turn} {words}"}
    parts: list[Item] = [{"type": "input_text", "text": f"{turn} {words}"}]
    if shape == "image":
        parts.append(
            {"type": "input_image", "image_url": "https://example.com/i.png", "detail": "low"}
        )
    return {"type": "message", "role": "user", "content": parts, "x-extra": turn}


def tool_pair(kind: str, call_id: str, arguments: str, result: str) -> tuple[Item, Item]:
    if kind == "custom":
        return (
            {"type": "custom_tool_call", "call_id": call_id, "name": "patch", "input": arguments},
            {"type": "custom_tool_call_output", "call_id": call_id, "output": result},
        )
    if kind == "computer":
        return (
            {
                "type": "computer_call",
                "id": f"cu_{call_id}",
                "call_id": call_id,
                "action": {"type": "wait"},
                "pending_safety_checks": [],
            },
            {
                "type": "computer_call_output",
                "call_id": call_id,
                "output": {"type": "computer_screenshot", "image_url": "https://example.com/s.png"},
            },
        )
    if kind == "shell":
        return (
            {
                "type": "local_shell_call",
                "id": f"ls_{call_id}",
                "call_id": call_id,
                "action": {"type": "exec", "command": ["ls"]},
                "status": "completed",
            },
            {"type": "local_shell_call_output", "id": call_id, "output": result},
        )
    output: Any = result if len(result) % 2 else [{"type": "input_text", "text": result}]
    return (
        {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": "read",
            "arguments": arguments,
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": call_id, "output": output},
    )


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[Strategy, ...]:
    choice = draw(st.sampled_from(["trunc", "window", "collapse", "clear", "prune", "mixed"]))
    if choice == "trunc":
        return (TruncationStrategy(trigger=OverBudget()),)
    if choice == "window":
        return (SlidingWindowStrategy(keep_last_groups=draw(st.integers(1, 6))),)
    if choice == "collapse":
        return (ToolResultCompactionStrategy(keep_last_tool_call_groups=draw(st.integers(0, 2))),)
    if choice == "clear":
        return (
            ClearToolUsesStrategy(
                keep=draw(st.integers(0, 3)), clear_tool_inputs=draw(st.booleans())
            ),
        )
    prune = ContextPruningStrategy(
        keep_last_assistants=draw(st.integers(0, 2)),
        min_prunable_tool_chars=200,
        soft_trim_max_chars=300,
        soft_trim_head_chars=50,
        soft_trim_tail_chars=50,
    )
    if choice == "prune":
        return (prune,)
    return (prune, ToolResultCompactionStrategy(trigger=TokenRatio(0.8)), TruncationStrategy())


def run(
    items: list[Item], strategies: tuple[Strategy, ...], window: int
) -> tuple[CompactionResult, Lowered]:
    body = {"model": "m", "instructions": "be brief", "input": items}
    lifted = lift(body)
    result = compact(
        CompactionRequest(
            lifted.messages,
            model="m",
            pipeline=Pipeline(strategies),
            tokenizer=TOK,
            facts=ModelFacts(context_window=window, max_output_tokens=64),
            reserve_ratio=0.0,
            mode=Mode.NORMAL,
        )
    )
    return result, lower(lifted, result.messages)


def origin(items: list[Item], lowered: list[Any]) -> list[int | None]:
    """For each forwarded item, the index of the client item it is or was edited from."""
    by_identity = {id(item): index for index, item in enumerate(items)}
    found: list[int | None] = []
    for item in lowered:
        index = by_identity.get(id(item))
        if index is None and isinstance(item, dict):
            index = next(
                (
                    i
                    for i, original in enumerate(items)
                    if item_type(original) == item_type(item)
                    and original.get("call_id", original.get("id")) is not None
                    and original.get("call_id", original.get("id"))
                    == item.get("call_id", item.get("id"))
                    and {k for k in original if original[k] != item.get(k)}
                    <= {"output", "arguments"}
                    and set(original) == set(item)
                ),
                None,
            )
        found.append(index)
    return found


# ------------------------------------------------------------------ the round trip


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_items_messages_items_is_the_identity(items: list[Item]) -> None:
    lifted = lift({"model": "m", "input": items, "instructions": "x"})
    back = lower(lifted, lifted.messages)
    assert back.notes == ()
    assert len(back.items) == len(items)
    assert all(a is b for a, b in zip(back.items, items, strict=True))
    stored = orjson.loads(orjson.dumps(lifted.messages))
    again = lower(lifted, stored)
    assert all(a is b for a, b in zip(again.items, items, strict=True))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_units_are_contiguous_runs_covering_every_item(items: list[Item]) -> None:
    units, _ = build_units(items)
    flat = [entry.item for unit in units for entry in unit.entries]
    assert len(flat) == len(items) and all(a is b for a, b in zip(flat, items, strict=True))


# ------------------------------------------------------------------ invariants after compaction


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), pipelines(), st.integers(200, 6_000))
def test_compacted_items_keep_the_invariants(
    items: list[Item], strategies: tuple[Strategy, ...], window: int
) -> None:
    result, lowered = run(items, strategies, window)
    out = lowered.items
    sources = origin(items, out)
    kept = {index for index in sources if index is not None}
    new = [item for item, index in zip(out, sources, strict=True) if index is None]

    # 1. system and developer messages: all kept, the same objects, in their relative order
    systems = [i for i, item in enumerate(items) if item.get("role") in ("system", "developer")]
    assert [i for i in sources if i in systems] == systems
    assert all(out[sources.index(i)] is items[i] for i in systems)
    # 2. what is kept keeps its order; what the proxy wrote is a plain text message
    kept_order = [i for i in sources if i is not None]
    assert kept_order == sorted(kept_order)
    assert all(
        item.get("type") == "message" and isinstance(item.get("content"), str) for item in new
    )
    # 3. a kept call has its output and a kept output its call (pairs the client sent)
    for key, members in pairs(items).items():
        present = [m in kept for m in members]
        assert all(present) or not any(present), (key, members, present)
    # reasoning is never edited and never separated from the unit it rides with
    for unit in build_units(items)[0]:
        indices = [index_of(items, entry.item) for entry in unit.entries]
        present = [i in kept for i in indices]
        assert all(present) or not any(present), indices
    assert all(
        out[sources.index(i)] is items[i] for i in kept if item_type(items[i]) == "reasoning"
    )
    # 4. the newest user message is forwarded verbatim, and the newest item is kept
    users = [i for i, item in enumerate(items) if item.get("role") == "user"]
    assert users[-1] in kept and out[sources.index(users[-1])] is items[users[-1]]
    assert len(items) - 1 in kept
    # 5. an item kept is the client's object, or differs only in its output or arguments
    for item, index in zip(out, sources, strict=True):
        if index is not None and item is not items[index]:
            changed = {k for k in items[index] if items[index][k] != item.get(k)}
            assert changed <= {"output", "arguments"}, changed
    # an unknown item is dropped only with its group, and the client is told
    gone = [o for o in items if item_type(o) == "future_thing" and index_of(items, o) not in kept]
    assert not gone or any("future_thing" in note for note in lowered.notes)
    # 6. deterministic
    _, lowered_again = run(items, strategies, window)
    assert orjson.dumps(lowered_again.items) == orjson.dumps(out)
    # 7. the forwarded items read back as exactly what the core returned, so compacting them
    # again is compacting the core's own output: idempotent wherever the core is (a pipeline
    # of one strategy; the core's early stop makes a mixed one settle in two rounds). Not
    # when an output came after other items (API clients answer calls at once): dropping what
    # sat between two calls makes them adjacent, and adjacent calls read back as one step.
    if not prompt_answers(items):
        return
    if not any("cannot be replaced" in note for note in lowered.notes):
        again = lift({"model": "m", "instructions": "be brief", "input": out}).messages
        assert orjson.dumps(again) == orjson.dumps(result.messages)
    if len(strategies) == 1:
        second, relowered = run(list(out), strategies, window)
        assert orjson.dumps(relowered.items) == orjson.dumps(out), second.report.changed_by
    # 8. under budget, unless the report says why not
    assert result.report.tokens_after <= result.report.budget or any(
        "over budget" in w for w in result.report.warnings
    )


def prompt_answers(items: list[Item]) -> bool:
    """Whether every output follows its call's step with only outputs between them."""
    unit_of: dict[int, int] = {}
    for number, unit in enumerate(build_units(items)[0]):
        for entry in unit.entries:
            unit_of[index_of(items, entry.item)] = number
    units = build_units(items)[0]
    for members in pairs(items).values():
        call = unit_of[members[0]]
        for index in range(members[0] + 1, members[-1]):
            if unit_of[index] != call and units[unit_of[index]].kind.value != "output":
                return False
    return True


def index_of(items: list[Item], item: Item) -> int:
    return next(i for i, candidate in enumerate(items) if candidate is item)


def pairs(items: list[Item]) -> dict[str, list[int]]:
    """Call id -> the indices of the call and every output naming it (known and unknown)."""
    found: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        kind = item_type(item)
        if kind in CALL_KEYS:
            key = item.get(CALL_KEYS[kind])
        elif kind in OUTPUT_KEYS:
            key = next((item[f] for f in OUTPUT_KEYS[kind] if isinstance(item.get(f), str)), None)
        else:
            key = item.get("call_id")
        if isinstance(key, str):
            found.setdefault(key, []).append(index)
    return {key: members for key, members in found.items() if len(members) > 1}
