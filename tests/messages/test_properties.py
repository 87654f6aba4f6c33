"""Property tests of the Messages adapter on generated sessions.

Sessions are what Claude Code and the Anthropic SDKs send: a top-level ``system`` (a string,
or text blocks with ``cache_control``), user turns (a string, text blocks, base64 and URL
images, documents, block types the proxy does not know), ``role: "system"`` notes between
turns, assistant turns opening with signed ``thinking`` / ``redacted_thinking`` blocks, then
text, one or several parallel ``tool_use`` blocks, server tools (``server_tool_use`` with its
``web_search_tool_result``) and unknown blocks; each ``tool_use`` answered in the next user
message (string results, text-block lists, images inside, ``is_error``), sometimes with text
blocks after the results (Claude Code's system reminders). Up to three ``cache_control``
breakpoints, one on the newest ``tool_result`` (it moves every turn). Half end in a long
single-turn tool loop.

Properties: with nothing to compact, messages -> chat -> messages gives back the client's own
objects (through a checkpoint's JSON too), and the chat messages are a pure function of what
the model reads (breakpoints moved or gone: the same bytes). Whatever each strategy does on a
small window, the forwarded messages are ones the API takes: every ``tool_use`` answered in the
very next message and every ``tool_result`` answering the message before; signed thinking
the client's own blocks, still first in its turn; ``role: "system"`` notes all kept in order;
the newest user message and the newest step verbatim; at most four breakpoints with TTLs in an
order the API accepts; the first message the user's; what the proxy wrote one text block;
deterministic; under budget unless the report says why not.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    Mode,
    ModelFacts,
    Pipeline,
    compact_async,
)
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.strategies import (
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    SlidingWindowStrategy,
    Strategy,
    SummarizationStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.triggers import OverBudget, TokenRatio
from compaction_proxy.wire.messages import MESSAGES, Lowered, lift, lower, validate_request
from compaction_proxy.wire.messages._lower import OMITTED_NOTE
from tests.compaction.summarizer_fakes import FakeSummarizer

Block = dict[str, Any]
Message = dict[str, Any]
Body = dict[str, Any]
TOK = CharacterEstimatorTokenizer()
EXAMPLES = int(os.environ.get("MESSAGES_PROPERTY_EXAMPLES", "100"))
PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

words = st.text(alphabet="abcdefgh ", min_size=1, max_size=40)  # the API refuses empty text
big = st.integers(0, 900).map(lambda n: "r" * n)
PNG = "iVBORw0KGgo" + "A" * 40
THINKING = ("thinking", "redacted_thinking")
TOOLS = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
]


# ------------------------------------------------------------------ generated sessions


@st.composite
def sessions(draw: st.DrawFn) -> Body:
    ids = itertools.count()
    messages: list[Message] = []
    turns = draw(st.integers(1, 4))
    loop = draw(st.booleans())
    for turn in range(turns):
        if draw(st.integers(0, 4)) == 0:
            messages.append(draw(system_notes()))
        messages.append(draw(prompts(turn)))
        newest = turn == turns - 1
        steps = draw(st.integers(6, 20) if loop and newest else st.integers(0, 3))
        for step in range(steps):
            # a turn ends with the model's answer; the request's own turn ends with results
            calls = draw(st.integers(1, 3)) if newest or step < steps - 1 else 0
            assistant, uses = draw(assistants(ids, calls))
            messages.append(assistant)
            if uses:
                messages.append(draw(results(uses)))
                if draw(st.integers(0, 9)) == 0 and not (newest and step == steps - 1):
                    messages.append(draw(system_notes()))
    body: Body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": messages,
        "tools": copy.deepcopy(TOOLS),
        "metadata": {"user_id": "user-1"},
    }
    system = draw(st.sampled_from(["none", "string", "blocks"]))
    if system == "string":
        body["system"] = draw(words)
    elif system == "blocks":
        body["system"] = [
            {"type": "text", "text": draw(words)} for _ in range(draw(st.integers(1, 3)))
        ]
    if any(block_type(b) in THINKING for m in messages for b in blocks(m)):
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    add_breakpoints(draw, body)
    return body


@st.composite
def system_notes(draw: st.DrawFn) -> Message:
    note = f"<system-reminder>{draw(words)}</system-reminder>"
    if draw(st.booleans()):
        return {"role": "system", "content": note}
    return {"role": "system", "content": [{"type": "text", "text": note}]}


@st.composite
def prompts(draw: st.DrawFn, turn: int) -> Message:
    shape = draw(st.sampled_from(["string", "blocks", "image", "image_url", "document", "other"]))
    task = f"task {turn}: {draw(words)}"
    if shape == "string":
        return {"role": "user", "content": task}
    content: list[Block] = [{"type": "text", "text": task}]
    if shape == "image":
        content.append(image())
    elif shape == "image_url":
        content.insert(0, {"type": "image", "source": {"type": "url", "url": "https://e.x/a.png"}})
    elif shape == "document":
        source = {"type": "text", "media_type": "text/plain", "data": draw(big)}
        content.append({"type": "document", "source": source, "title": "notes"})
    elif shape == "other":
        content.append({"type": "future_block", "payload": draw(words)})
    if draw(st.booleans()):
        content.append(
            {"type": "text", "text": f"<system-reminder>{draw(words)}</system-reminder>"}
        )
    return {"role": "user", "content": content}


def image() -> Block:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


@st.composite
def assistants(draw: st.DrawFn, ids: Iterator[int], calls: int) -> tuple[Message, list[str]]:
    if calls == 0 and draw(st.integers(0, 3)) == 0:  # the SDKs' plain answer
        return {"role": "assistant", "content": draw(words)}, []
    content: list[Block] = []
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.integers(0, 3)):
            content.append(
                {"type": "thinking", "thinking": draw(words), "signature": f"sig{next(ids)}=="}
            )
        else:
            content.append({"type": "redacted_thinking", "data": f"redacted{next(ids)}"})
    middle: list[Block] = []
    if calls == 0 or draw(st.booleans()):
        middle.append({"type": "text", "text": draw(words)})
    if draw(st.integers(0, 4)) == 0:
        server = f"srvtoolu_{next(ids)}"
        middle.append(
            {"type": "server_tool_use", "id": server, "name": "web_search", "input": {"query": "q"}}
        )
        found = {"type": "web_search_result", "url": "https://e.x", "title": "t"}
        found["encrypted_content"] = draw(big)
        middle.append({"type": "web_search_tool_result", "tool_use_id": server, "content": [found]})
    if draw(st.integers(0, 5)) == 0:
        middle.append({"type": "future_block", "n": next(ids)})
    content.extend(draw(st.permutations(middle)))
    uses: list[str] = []
    for _ in range(calls):
        use = f"toolu_{next(ids)}"
        uses.append(use)
        content.append(
            {"type": "tool_use", "id": use, "name": "Bash", "input": {"command": draw(words)}}
        )
    return {"role": "assistant", "content": content}, uses


@st.composite
def results(draw: st.DrawFn, uses: list[str]) -> Message:
    content: list[Block] = []
    for use in draw(st.permutations(uses)):
        block: Block = {"type": "tool_result", "tool_use_id": use}
        shape = draw(st.sampled_from(["string", "string", "texts", "image", "none"]))
        if shape == "string":
            block["content"] = draw(big)
        elif shape == "texts":
            block["content"] = [{"type": "text", "text": draw(big) or "ok"}]
        elif shape == "image":
            block["content"] = [{"type": "text", "text": draw(big) or "shot"}, image()]
        if draw(st.integers(0, 5)) == 0:
            block["is_error"] = True
        content.append(block)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        content.append(
            {"type": "text", "text": f"<system-reminder>{draw(words)}</system-reminder>"}
        )
    return {"role": "user", "content": content}


def add_breakpoints(draw: st.DrawFn, body: Body) -> None:
    """Up to three breakpoints: a tool, the system's blocks, an older message, the newest result;
    1h TTLs only before 5m ones (tools, system, messages is the order the API reads)."""
    spots: list[Block] = []
    if draw(st.integers(0, 4)) == 0:
        spots.append(body["tools"][0])
    system = body.get("system")
    if isinstance(system, list) and draw(st.booleans()):
        spots.append(system[-1])
        if len(system) > 1 and draw(st.booleans()):
            spots.insert(len(spots) - 1, system[0])  # after a tool's: the API's order
    older = [b for m in body["messages"][:-1] for b in blocks(m) if block_type(b) not in THINKING]
    if older and draw(st.booleans()):
        spots.append(draw(st.sampled_from(older)))
    newest = [b for b in blocks(body["messages"][-1]) if block_type(b) == "tool_result"]
    if newest and draw(st.booleans()):
        spots.append(newest[-1])
    long_ones = draw(st.integers(0, len(spots)))
    for number, spot in enumerate(spots[:3]):
        spot["cache_control"] = (
            {"type": "ephemeral", "ttl": "1h"} if number < long_ones else {"type": "ephemeral"}
        )


def block_type(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


# ------------------------------------------------------------------ strategies and runs


KINDS = ["trunc", "window", "collapse", "clear", "prune", "mixed", "summary"]


@st.composite
def pipelines(draw: st.DrawFn, choice: str) -> tuple[Strategy, ...]:
    if choice == "trunc":
        return (TruncationStrategy(trigger=OverBudget()),)
    if choice == "window":
        return (SlidingWindowStrategy(keep_last_groups=draw(st.integers(1, 6))),)
    if choice == "collapse":
        keep = draw(st.integers(0, 2))
        return (ToolResultCompactionStrategy(keep_last_tool_call_groups=keep),)
    if choice == "clear":
        strategy = ClearToolUsesStrategy(
            keep=draw(st.integers(0, 3)), clear_tool_inputs=draw(st.booleans())
        )
        return (strategy,)
    if choice == "summary":  # the stub summarizer of the core's tests answers
        summary = SummarizationStrategy(
            retain_turns=draw(st.integers(0, 2)),
            placement=draw(st.sampled_from(["user", "assistant", "system"])),
        )
        return (summary, TruncationStrategy())
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
    body: Body, strategies: tuple[Strategy, ...], window: int
) -> tuple[CompactionResult, Lowered]:
    lifted = lift(body)
    chat = lifted.chat_body(body)
    request = CompactionRequest(
        chat["messages"],
        model=chat["model"],
        pipeline=Pipeline(strategies),
        tokenizer=TOK,
        facts=ModelFacts(context_window=window, max_output_tokens=64),
        tools=chat.get("tools"),
        max_completion_tokens=chat.get("max_completion_tokens"),
        reserve_ratio=0.0,
        mode=Mode.NORMAL,
    )
    result = asyncio.run(compact_async(request, summarizer=FakeSummarizer()))
    return result, lower(lifted, result.messages, body)


@dataclass(frozen=True)
class Origin:
    """Where a forwarded message came from: a client message (``source``, the positions of
    its blocks that went, and whether it is the client's own object) or nowhere (made up)."""

    source: int | None
    positions: tuple[int, ...] = ()
    same: bool = False


def origins(body: Body, out: list[Any]) -> list[Origin]:
    sources = body["messages"]
    by_identity = {id(m): i for i, m in enumerate(sources)}
    block_at: dict[int, tuple[int, int]] = {}
    keyed: dict[tuple[str, str], tuple[int, int]] = {}
    for index, message in enumerate(sources):
        for position, block in enumerate(blocks(message)):
            block_at[id(block)] = (index, position)
            if block_type(block) == "tool_use":
                keyed["tool_use", block["id"]] = (index, position)
            elif block_type(block) == "tool_result":
                keyed["tool_result", block["tool_use_id"]] = (index, position)
    found: list[Origin] = []
    for message in out:
        if id(message) in by_identity:
            index = by_identity[id(message)]
            found.append(Origin(index, tuple(range(len(blocks(sources[index])))), same=True))
            continue
        places: list[tuple[int, int]] = []
        for block in blocks(message):
            place = block_at.get(id(block))
            if place is None and block_type(block) == "tool_use":
                place = keyed.get(("tool_use", block["id"]))
            elif place is None and block_type(block) == "tool_result":
                place = keyed.get(("tool_result", block["tool_use_id"]))
            if place is not None:
                places.append(place)
        if not places:
            found.append(Origin(None))
            continue
        assert len(places) == len(blocks(message)), message  # all client blocks, or none
        assert len({index for index, _ in places}) == 1, places  # from one client message
        positions = tuple(position for _, position in places)
        assert list(positions) == sorted(set(positions)), positions  # in the client's order
        assert set(message) == set(sources[places[0][0]])  # the client's fields
        found.append(Origin(places[0][0], positions))
    return found


def breakpoint_ttls(body: Body, out: list[Any]) -> list[str]:
    """Every breakpoint's TTL, in the order the API reads them (tools, system, messages)."""
    ttls: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            control = value.get("cache_control")
            if control is not None:
                ttls.append(control.get("ttl", "5m"))
            for inner in value.values():
                visit(inner)
        elif isinstance(value, list):
            for element in value:
                visit(element)

    visit(body.get("tools"))
    visit(body.get("system"))
    visit(out)
    return ttls


def answers_of(message: Any) -> list[Any]:
    return [b for b in blocks(message) if block_type(b) == "tool_result"]


def uncached(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: uncached(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [uncached(v) for v in value]
    return value


# ------------------------------------------------------------------ the round trip


@PROPERTY
@given(sessions())
def test_lift_then_lower_is_the_identity(body: Body) -> None:
    assert validate_request(body) is None  # what the SDKs send passes the proxy's checks
    view = MESSAGES.lift(body)
    assert view.chat["messages"] is view.lifted.messages
    assert view.lower(view.chat["messages"]).items == body["messages"]
    lifted = lift(body)
    back = lower(lifted, lifted.messages, body)
    assert back.notes == ()
    assert len(back.items) == len(body["messages"])
    assert all(a is b for a, b in zip(back.items, body["messages"], strict=True))
    # a checkpoint stores the lifted messages as JSON and hands them back as new dicts
    stored = orjson.loads(orjson.dumps(lifted.messages))
    again = lower(lifted, stored, body)
    assert all(a is b for a, b in zip(again.items, body["messages"], strict=True))


@PROPERTY
@given(sessions(), st.data())
def test_the_lifted_messages_do_not_see_breakpoints(body: Body, data: st.DataObject) -> None:
    lifted = lift(body)
    hashed = [canonical_bytes(m) for m in lifted.messages]
    counted = canonical_bytes(lifted.chat_body(body))
    bare = uncached(body)
    assert [canonical_bytes(m) for m in lift(bare).messages] == hashed
    # the next turn's client moves its breakpoint to another block: the same bytes
    candidates = [b for m in bare["messages"] for b in blocks(m) if block_type(b) not in THINKING]
    candidates += [*bare["tools"], *(b for b in bare.get("system") or () if isinstance(b, dict))]
    for block in data.draw(st.lists(st.sampled_from(candidates), max_size=3)):
        block["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    again = lift(bare)
    assert [canonical_bytes(m) for m in again.messages] == hashed
    assert canonical_bytes(again.chat_body(bare)) == counted


# ------------------------------------------------------------------ invariants after compaction


@pytest.mark.parametrize("name", KINDS)
@settings(
    max_examples=max(1, EXAMPLES // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(body=sessions(), data=st.data())
def test_compacted_messages_are_ones_the_api_takes(
    name: str, body: Body, data: st.DataObject
) -> None:
    strategies = data.draw(pipelines(name), label="pipeline")
    # a window the session's messages fill from 90% to four times over
    fill = data.draw(st.floats(0.9, 4.0), label="fill")
    window = int(TOK.count_messages(lift(body).messages) / fill) + 64
    snapshot = orjson.dumps(body)
    result, lowered = run(body, strategies, window)
    assert orjson.dumps(body) == snapshot  # the client's body is never mutated
    assert validate_request({**body, "messages": list(lowered.items)}) is None
    if not result.changed:
        assert all(a is b for a, b in zip(lowered.items, body["messages"], strict=True))
    sources = body["messages"]
    out = list(lowered.items)
    found = origins(body, out)
    kept = [o.source for o in found if o.source is not None]
    trimmed = bool(result.report.last_resort and result.report.last_resort.changed)

    # every tool_use answered in the very next message, every result answering the one before
    for position, message in enumerate(out):
        uses = {b["id"] for b in blocks(message) if block_type(b) == "tool_use"}
        answers = {b["tool_use_id"] for b in blocks(message) if block_type(b) == "tool_result"}
        if answers:
            before = out[position - 1] if position else {}
            called = {b["id"] for b in blocks(before) if block_type(b) == "tool_use"}
            assert message["role"] == "user" and answers <= called, (name, position)
        if uses:
            after = out[position + 1] if position + 1 < len(out) else {}
            answered = {b["tool_use_id"] for b in blocks(after) if block_type(b) == "tool_result"}
            assert uses <= answered, (name, position)
    # kept messages keep their order, each one at most once
    assert kept == sorted(set(kept)), kept
    for message, origin in zip(out, found, strict=True):
        if origin.source is None:
            # what the proxy wrote: one text block of the user's or the model's
            assert message["role"] in ("user", "assistant")
            assert len(message["content"]) == 1 and message["content"][0]["type"] == "text"
            continue
        source = sources[origin.source]
        assert message["role"] == source["role"]
        if origin.same:
            continue
        # a client message goes whole or not at all (its server-tool, unknown and reminder
        # blocks with it); only a result's content or a call's input may have changed
        assert origin.positions == tuple(range(len(blocks(source)))), (name, origin)
        for new, old in zip(blocks(message), blocks(source), strict=True):
            if new is old:
                continue
            edited = {k for k in old if new.get(k) != old[k]} | (set(new) - set(old))
            if block_type(old) == "tool_result":
                assert edited <= {"content"}, edited
            else:
                assert block_type(old) == "tool_use" and edited <= {"input"}, edited
                assert isinstance(new["input"], dict)
    # thinking: the client's own blocks, and a turn that opened with it still does
    for message, origin in zip(out, found, strict=True):
        if origin.source is None:
            assert not any(block_type(b) in THINKING for b in blocks(message))
            continue
        source = sources[origin.source]
        mine = [b for b in blocks(source) if block_type(b) in THINKING]
        theirs = [b for b in blocks(message) if block_type(b) in THINKING]
        assert len(mine) == len(theirs) and all(a is b for a, b in zip(mine, theirs, strict=True))
        if blocks(source) and block_type(blocks(source)[0]) in THINKING:
            assert block_type(blocks(message)[0]) in THINKING
    # the API merges consecutive assistant messages: none may land in front of a thinking turn
    for before, message in itertools.pairwise(out):
        if blocks(message) and block_type(blocks(message)[0]) in THINKING:
            assert before["role"] != "assistant", name
    # role: "system" notes: all kept, the client's objects, in their order
    notes = [i for i, m in enumerate(sources) if m["role"] == "system"]
    assert [o.source for o in found if o.source in notes] == notes
    assert all(o.same for o in found if o.source in notes)
    # the newest user message and the newest step verbatim (the last resort may trim the
    # step's tool results, never user text)
    last = len(sources) - 1
    assert sources[last]["role"] == "user"
    protected = [last]
    if any(block_type(b) == "tool_result" for b in blocks(sources[last])):
        protected.append(last - 1)
    for index in protected:
        origin = next((o for o in found if o.source == index), None)
        assert origin is not None, (name, index)
        if not origin.same:
            assert trimmed and index == last, (name, index)
            assert origin.positions == tuple(range(len(blocks(sources[index]))))
    # the task too: the newest user message that answers no call
    tasks = [i for i, m in enumerate(sources) if m["role"] == "user" and not answers_of(m)]
    if tasks:
        assert any(o.source == tasks[-1] and o.same for o in found), name
    # breakpoints: the client's, where it put them; the proxy's own only on the checkpoint (its
    # first message other than the note that opens a conversation the compaction left headless)
    first_made = next(
        (
            p
            for p, o in enumerate(found)
            if o.source is None and out[p]["content"][0]["text"] != OMITTED_NOTE
        ),
        None,
    )
    for position, (message, origin) in enumerate(zip(out, found, strict=True)):
        for number, block in enumerate(blocks(message)):
            if "cache_control" not in block:
                continue
            if origin.source is None:
                assert position == first_made, (name, position)
            else:
                old = blocks(sources[origin.source])[origin.positions[number]]
                assert block["cache_control"] == old.get("cache_control"), (name, position)
    # at most four breakpoints, the longer TTLs first
    ttls = breakpoint_ttls(body, out)
    assert len(ttls) <= 4, ttls
    assert ttls == sorted(ttls, key=lambda ttl: ttl != "1h"), ttls
    # the conversation opens with the user's message, as the client's did
    if sources[0]["role"] == "user":
        assert next(m for m in out if m["role"] != "system")["role"] == "user", name
    made = sum(o.source is None for o in found)
    event(f"{name}: changed={result.changed}, made up={bool(made)}, trimmed={trimmed}")
    # deterministic
    _, again = run(body, strategies, window)
    assert orjson.dumps(again.items) == orjson.dumps(out)
    # under budget, unless the report says why not
    report = result.report
    assert report.tokens_after <= report.budget or any(
        "over budget" in warning for warning in report.warnings
    ), (name, report.to_dict())
