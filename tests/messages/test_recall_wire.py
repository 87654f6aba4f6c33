"""The recall tool on the Messages API (compaction_proxy/wire/messages/_recall.py,
compaction_proxy/wire/messages/_stream.py).

Replies come from the fake Anthropic upstream (tests/fakes/messages, in process) with a policy
that calls the recall tool, so their shapes are the ones the fake renders: signed thinking and
redacted thinking first, ``input_json_delta`` pieces, pings, cumulative usage. Continuations go
back to the same fake with preserved thinking enforced (a changed prefix, signature or a
missing thinking block is its 400), so "accepted" means what it means for the API. What the
client receives goes through the official ``anthropic`` SDK (an ``httpx.MockTransport`` serving
the bytes), which must put a stripped stream together as it puts together the API's own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from compaction_proxy.wire import ClientBody, UpstreamTraits
from compaction_proxy.wire.messages import (
    BINDING_BETA,
    MESSAGES,
    MESSAGES_RECALL,
    MessagesFormat,
    offer_binding,
)
from compaction_proxy.wire.messages._stream import index_of
from compaction_proxy.wire.recall import (
    RECALL_TOOL,
    RecallAnswer,
    RecallTool,
    RecallTurn,
)
from compaction_proxy.wire.sse import Event, events
from tests.fakes.messages import model
from tests.fakes.messages.app import Settings, create_app
from tests.fakes.messages.prompt import content_blocks
from tests.support.messages_upstream import anthropic_client

WIRE = MESSAGES.recall
RECALL = RecallTool(
    RECALL_TOOL,
    "Get back content compaction removed from this conversation, by recall id or query.",
    {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "string"}},
            "query": {"type": "string"},
            "page": {"type": "integer", "minimum": 1},
        },
    },
)
BASH = {
    "name": "Bash",
    "description": "Run a shell command in the working directory. " * 60,
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
    "cache_control": {"type": "ephemeral"},
}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
SYSTEM = [
    {
        "type": "text",
        "text": "You are a careful coding agent. " * 60,
        "cache_control": {"type": "ephemeral"},
    }
]
FACT = "FACT-ARCHIVED-4711"
MODEL = "claude-sonnet-4-5"


# --------------------------------------------------------------------------- the fake upstream

_calls = itertools.count(1)


def recall_policy(turn: model.Turn) -> model.Reply | None:
    """Calls the recall tool when it is offered (and Bash beside it with ``x-test-mixed``);
    answers from the recall results once they come back."""
    if RECALL_TOOL not in {tool.get("name") for tool in turn.tools}:
        return None
    last = turn.messages[-1]
    results = [
        block
        for block in content_blocks(last.get("content"))
        if block.get("type") == "tool_result"
        and str(block.get("tool_use_id", "")).startswith("toolu_recall")
    ]
    if results:
        return model.Reply([model.Text("From the archive: " + str(results[0].get("content")))])
    n = next(_calls)
    blocks: list[model.Block] = [
        model.Text("Let me look that up."),
        model.ToolUse(RECALL_TOOL, {"ids": ["rq72amlvh4xx"]}, f"toolu_recall_{n}"),
    ]
    if turn.headers.get("x-test-mixed"):
        blocks.append(model.ToolUse("Bash", {"command": "ls -la"}, f"toolu_bash_{n}"))
    return model.Reply(blocks)


@pytest.fixture
def fake() -> Iterator[TestClient]:
    app = create_app(
        policies=[recall_policy],
        settings=Settings(thinking_binding="enforce", redacted_thinking=True, cache_min_tokens=64),
    )
    with TestClient(app) as client:
        yield client


def client_body(*, stream: bool, thinking: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 2048,
        "system": SYSTEM,
        "tools": [WEB_SEARCH, BASH],
        "messages": [{"role": "user", "content": "What did the early build log say?"}],
        "stream": stream,
    }
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    return body


def offered(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, **WIRE.offer(body, RECALL)}


def post(fake: TestClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    return fake.post("/v1/messages", content=orjson.dumps(body), headers=headers)


def answered(body: dict[str, Any], turn: RecallTurn) -> dict[str, Any]:
    answers = [
        RecallAnswer(call.call_id, f"[recall id rq72amlvh4xx: tool Bash]\n{FACT}")
        for call in turn.calls
    ]
    return {**body, **WIRE.continuation(body, turn, answers)}


def read(reply: bytes, stream: bool) -> RecallTurn:
    turn = WIRE.read(reply, stream=stream, name=RECALL_TOOL)
    assert turn is not None
    return turn


# --------------------------------------------------------------------------- the SDK


class Served:
    """Answers every request with the bytes set last, as JSON or as a stream (through the
    HTTP package the SDK brings, ``httpx2``)."""

    def __init__(self) -> None:
        self.body = b""
        self.stream = False

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        kind = "text/event-stream" if self.stream else "application/json"
        return httpx2.Response(200, content=self.body, headers={"content-type": kind})


SERVED = Served()
SDK = anthropic_client(
    "http://upstream.invalid",
    http_client=anthropic.DefaultHttpxClient(
        transport=httpx2.MockTransport(SERVED), trust_env=False
    ),
)


def sdk_message(reply: bytes, *, stream: bool) -> anthropic.types.Message:
    """What the official SDK makes of ``reply``: ``messages.create``'s message, or the
    final message of ``messages.stream`` after every event was iterated."""
    SERVED.body, SERVED.stream = reply, stream
    question: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    if not stream:
        return SDK.messages.create(model=MODEL, max_tokens=64, messages=question)
    with SDK.messages.stream(model=MODEL, max_tokens=64, messages=question) as events_:
        for _ in events_:
            pass
        return events_.get_final_message()


def sdk_content(message: anthropic.types.Message) -> list[dict[str, Any]]:
    return [block.to_dict(mode="json") for block in message.content]


# --------------------------------------------------------------------------- declared, offer


def test_any_tool_of_the_client_declares_and_only_its_name_clashes() -> None:
    assert WIRE.declared({"tools": [BASH]})
    assert WIRE.declared({"tools": [WEB_SEARCH]})  # a server tool is the client's too
    for body in ({}, {"tools": []}, {"tools": None}, {"tools": "Bash"}, {"tools": [1, "x"]}):
        assert not WIRE.declared(body)
    assert WIRE.clashes({"tools": [WEB_SEARCH, {**BASH, "name": RECALL_TOOL}]}, RECALL_TOOL)
    assert WIRE.clashes({"tools": [{"type": "custom_type", "name": RECALL_TOOL}]}, RECALL_TOOL)
    assert not WIRE.clashes({"tools": [WEB_SEARCH, BASH]}, RECALL_TOOL)
    assert not WIRE.clashes({}, RECALL_TOOL)


def test_the_recall_tool_goes_last_and_the_client_tools_are_its_own() -> None:
    tools = [WEB_SEARCH, BASH]
    members = WIRE.offer({"tools": tools}, RECALL)
    assert list(members) == ["tools"]
    *own, recall = members["tools"]
    assert all(mine is theirs for mine, theirs in zip(own, tools, strict=True))
    assert recall == {
        "name": RECALL_TOOL,
        "description": RECALL.description,
        "input_schema": dict(RECALL.parameters),
    }
    assert BASH["cache_control"] == {"type": "ephemeral"}  # the client's breakpoint stays
    assert "cache_control" not in recall  # and none is added: the API allows four


def test_the_client_tools_keep_their_bytes_in_the_forwarded_body() -> None:
    # As the SDKs and Claude Code write a body: compact, as orjson writes it too.
    raw = orjson.dumps(client_body(stream=False))
    data = orjson.loads(raw)
    own = orjson.dumps(data["tools"])
    members = WIRE.offer(data, RECALL)
    written = ClientBody(raw, data, "messages").with_members(members)
    assert own[:-1] + b"," + orjson.dumps(members["tools"][-1]) + b"]" in written
    # As a person might write it (spacing, an escape): spliced as the array's elements,
    # each client tool goes as its very bytes.
    spaced = (
        b'{"model": "claude-sonnet-4-5", "max_tokens": 64, "tools": [ {"name": "Bash",'
        b' "description": "caf\\u00e9", "input_schema": {"type": "object"},'
        b' "cache_control": {"type": "ephemeral"}} ], "messages": []}'
    )
    data = orjson.loads(spaced)
    members = WIRE.offer(data, RECALL)
    spliced = ClientBody(spaced, data, "tools").with_elements(members["tools"])
    tool = spaced[spaced.index(b'{"name"') : spaced.index(b"} ]") + 1]
    assert tool + b"," + orjson.dumps(members["tools"][-1]) in spliced
    assert orjson.loads(spliced)["tools"] == members["tools"]


def test_the_client_cache_entry_on_its_tools_is_still_read(fake: TestClient) -> None:
    body = client_body(stream=False, thinking=False)
    first = post(fake, body).json()["usage"]
    assert first["cache_creation_input_tokens"] > 0
    offer = offered(body)
    second = post(fake, offer).json()["usage"]
    third = post(fake, offer).json()["usage"]
    again = post(fake, body).json()["usage"]
    # The tools' breakpoint covers the same tools: read at once. The system's breakpoint
    # covers the recall tool too: written when it first appears, read from then on.
    tools_part = second["cache_read_input_tokens"]
    assert 0 < tools_part < first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] > 0
    assert third["cache_read_input_tokens"] > tools_part
    assert third["cache_creation_input_tokens"] == 0
    assert again["cache_read_input_tokens"] == first["cache_creation_input_tokens"]


# --------------------------------------------------------------------------- read


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_recall_reply_is_read_with_its_whole_signed_turn(fake: TestClient, stream: bool) -> None:
    reply = post(fake, offered(client_body(stream=stream)))
    assert reply.status_code == 200, reply.text
    turn = read(reply.content, stream)
    (call,) = turn.calls
    assert call.call_id.startswith("toolu_recall_")
    assert orjson.loads(call.arguments) == {"ids": ["rq72amlvh4xx"]}
    assert turn.others == 0
    (assistant,) = turn.assistant
    assert assistant["role"] == "assistant"
    content = assistant["content"]
    kinds = [block["type"] for block in content]
    assert kinds == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert content[0]["signature"] and content[0]["thinking"]
    assert content[1]["data"]
    assert content[3] == {
        "type": "tool_use",
        "id": call.call_id,
        "name": RECALL_TOOL,
        "input": {"ids": ["rq72amlvh4xx"]},
    }
    # The blocks the API sent, as its SDK reads them (JSON, or put together from the stream).
    assert content == sdk_content(sdk_message(reply.content, stream=stream))
    if not stream:
        assert content == reply.json()["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_mixed_turn_counts_the_client_calls(fake: TestClient, stream: bool) -> None:
    reply = post(fake, offered(client_body(stream=stream)), **{"x-test-mixed": "1"})
    turn = read(reply.content, stream)
    assert len(turn.calls) == 1
    assert turn.others == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_reply_without_recall_calls_is_not_read_nor_changed(
    fake: TestClient, stream: bool
) -> None:
    body = client_body(stream=stream)
    body["messages"] = [{"role": "user", "content": "fake-loop: steps=3"}]
    reply = post(fake, body).content  # calls Bash, not offered recall
    assert b'"tool_use"' in reply
    assert WIRE.read(reply, stream=stream, name=RECALL_TOOL) is None
    assert WIRE.strip(reply, stream=stream, name=RECALL_TOOL) == reply


# --------------------------------------------------------------------------- continuation


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_continuation_is_accepted_and_answered(fake: TestClient, stream: bool) -> None:
    body = offered(client_body(stream=stream))
    turn = read(post(fake, body).content, stream)
    following = answered(body, turn)
    messages = following["messages"]
    assert messages[: len(body["messages"])] == body["messages"]
    assert messages[-2] == turn.assistant[0]
    assert messages[-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": turn.calls[0].call_id,
                "content": f"[recall id rq72amlvh4xx: tool Bash]\n{FACT}",
                "is_error": False,
            }
        ],
    }
    reply = post(fake, following)
    assert reply.status_code == 200, reply.text
    final = sdk_message(reply.content, stream=stream)
    assert final.stop_reason == "end_turn"
    assert FACT in "".join(block.text for block in final.content if block.type == "text")
    # The closing round: no tool may be called, which thinking allows.
    closing = WIRE.closing(following)
    assert closing == {"tool_choice": {"type": "none"}}
    assert post(fake, {**following, **closing}).status_code == 200


def test_continuation_results_follow_the_answers_with_their_errors() -> None:
    turn = RecallTurn(
        calls=(),
        others=0,
        assistant=({"role": "assistant", "content": [{"type": "text", "text": "t"}]},),
    )
    answers = [RecallAnswer("a", "no archived content for id rX"), RecallAnswer("b", "ok")]
    answers[0] = RecallAnswer("a", "archive not available right now", is_error=True)
    body = {"messages": [{"role": "user", "content": "q"}]}
    out = WIRE.continuation(body, turn, answers)
    assert out["messages"][0] is body["messages"][0]
    assert [(r["tool_use_id"], r["is_error"]) for r in out["messages"][-1]["content"]] == [
        ("a", True),
        ("b", False),
    ]


def test_the_fake_refuses_a_continuation_that_breaks_the_api_rules(fake: TestClient) -> None:
    """The acceptance above means something: what the continuation must keep is checked."""
    body = offered(client_body(stream=False))
    turn = read(post(fake, body).content, False)
    content = turn.assistant[0]["content"]

    def with_content(blocks: list[dict[str, Any]]) -> RecallTurn:
        return RecallTurn(turn.calls, 0, ({"role": "assistant", "content": blocks},))

    edited = [{**content[0], "thinking": content[0]["thinking"] + "!"}, *content[1:]]
    refused = post(fake, answered(body, with_content(edited)))
    assert refused.status_code == 400 and "signature" in refused.text
    unthought = [block for block in content if "thinking" not in block["type"]]
    refused = post(fake, answered(body, with_content(unthought)))
    assert refused.status_code == 400 and "Expected `thinking`" in refused.text
    # The turn's thinking is bound to the tools it was made under, recall tool included.
    without_recall = {**answered(body, turn), "tools": body["tools"][:-1]}
    refused = post(fake, without_recall)
    assert refused.status_code == 400 and "bound to a different conversation" in refused.text


# --------------------------------------------------------------------------- preserved thinking

NATIVE = UpstreamTraits(native=True)


def test_an_offer_after_signed_thinking_drops_only_the_older_blocks(fake: TestClient) -> None:
    """``tools`` is in every signed block's prefix: a block made before the tool was offered
    is refused by a preserved-thinking API unless the request asks ``drop_block``; a block
    made since is bound to the offered tools and kept."""
    body = client_body(stream=False)
    body["messages"] = [{"role": "user", "content": "fake-loop: steps=5"}]
    step = post(fake, body).json()  # the client's own step: thinking, text, a Bash call
    (bash,) = [block for block in step["content"] if block["type"] == "tool_use"]
    body["messages"] += [
        {"role": "assistant", "content": step["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": bash["id"], "content": "ok"}],
        },
    ]
    assert post(fake, body).status_code == 200  # as the client sent it
    offer = offered(body)
    refused = post(fake, offer)
    assert refused.status_code == 400 and "bound to a different conversation" in refused.text
    older = ["messages.1.content.0", "messages.1.content.1"]  # thinking, redacted thinking

    amendment = offer_binding(offer, offer["messages"], NATIVE)
    assert amendment is not None
    assert amendment.members == {
        "thinking": {
            **body["thinking"],
            "block_binding": {"prefix_mismatch_behavior": "drop_block"},
        }
    }
    assert amendment.listed == (("anthropic-beta", BINDING_BETA),)
    beta = {"anthropic-beta": BINDING_BETA}
    amended = {**offer, **amendment.members}
    reply = post(fake, amended, **beta)
    assert reply.status_code == 200, reply.text
    dropped = [entry["path"] for entry in reply.json()["input_transformations"]]
    assert dropped == older

    # The continuation is accepted with the same ask. (The fake binds the recall turn's
    # thinking to the prompt the model saw, without the dropped blocks, so with those still
    # in the messages it drops that one too: the final-turn rule is then not asked for.)
    following = answered(amended, read(reply.content, False))
    assert offer_binding(following, following["messages"], NATIVE) is None  # already asked
    reply = post(fake, following, **beta)
    assert reply.status_code == 200, reply.text
    dropped = [entry["path"] for entry in reply.json()["input_transformations"]]
    assert dropped[:2] == older
    assert FACT in reply.text


def test_offer_binding_leaves_what_thinking_binding_leaves() -> None:
    signed = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "redacted_thinking", "data": "d"},
                {"type": "text", "text": "a"},
            ],
        },
        {"role": "user", "content": "more"},
    ]
    body = {"messages": signed, "tools": [BASH]}
    amendment = offer_binding(body, signed, NATIVE)
    assert amendment is not None
    assert amendment.members == {
        "thinking": {
            "type": "adaptive",
            "block_binding": {"prefix_mismatch_behavior": "drop_block"},
        }
    }
    assert (
        "the recall tool was added to the tools before 2 signed thinking blocks"
        in (amendment.notes[0])
    )
    assert offer_binding(body, signed, UpstreamTraits()) is None  # a local server
    assert offer_binding(body, signed[:1], NATIVE) is None  # nothing signed
    for thinking in (
        {"type": "disabled"},
        {"type": "enabled", "budget_tokens": 1024, "block_binding": {"x": 1}},
    ):
        assert offer_binding({**body, "thinking": thinking}, signed, NATIVE) is None


@pytest.mark.parametrize(
    ("binding", "offered_to"),
    [
        (None, True),
        ({"prefix_mismatch_behavior": "drop_block"}, True),
        ({"prefix_mismatch_behavior": "error"}, False),
        ({}, False),
        ("error", False),
    ],
)
def test_a_client_that_chose_its_binding_is_offered_recall_only_if_blocks_may_drop(
    binding: Any, offered_to: bool
) -> None:
    thinking: dict[str, Any] = {"type": "adaptive"}
    if binding is not None:
        thinking["block_binding"] = binding
    assert WIRE.declared({"tools": [BASH], "thinking": thinking}) is offered_to


# --------------------------------------------------------------------------- strip


def test_a_mixed_json_reply_keeps_the_client_call_and_every_other_byte(
    fake: TestClient,
) -> None:
    reply = post(fake, offered(client_body(stream=False)), **{"x-test-mixed": "1"}).content
    stripped = WIRE.strip(reply, stream=False, name=RECALL_TOOL)
    before, after = orjson.loads(reply), orjson.loads(stripped)
    assert after["content"] == [
        block for block in before["content"] if block.get("name") != RECALL_TOOL
    ]
    assert [b["type"] for b in after["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert after["stop_reason"] == "tool_use"
    assert {k: v for k, v in after.items() if k != "content"} == {
        k: v for k, v in before.items() if k != "content"
    }
    head = reply[: reply.index(b'"content":')]
    assert stripped.startswith(head)
    assert stripped.endswith(reply[reply.index(b',"stop_reason"') :])
    message = sdk_message(stripped, stream=False)
    assert [block.type for block in message.content][-1] == "tool_use"


def test_a_mixed_stream_renumbers_the_blocks_after_the_dropped_one(fake: TestClient) -> None:
    reply = post(fake, offered(client_body(stream=True)), **{"x-test-mixed": "1"}).content
    stripped = WIRE.strip(reply, stream=True, name=RECALL_TOOL)
    original, out = events(reply), events(stripped)
    dropped = {
        index_of(event)
        for event in original
        if event.kind == "content_block_start" and event.data is not None
        if event.data["content_block"].get("name") == RECALL_TOOL
    }
    assert dropped == {3}
    assert len(out) == len([e for e in original if index_of(e) not in dropped])
    starts = [index_of(event) for event in out if event.kind == "content_block_start"]
    assert starts == [0, 1, 2, 3]
    kept = [event for event in original if index_of(event) not in dropped]
    for was, now in zip(kept, out, strict=True):
        index = index_of(was)
        if index is not None and index > 3:
            assert index_of(now) == index - 1
            assert {**now.data, "index": index} == was.data  # type: ignore[dict-item]
            assert now.lines[0] == was.lines[0]  # its `event:` line
        else:
            assert now.raw == was.raw
    message = sdk_message(stripped, stream=True)
    assert message.stop_reason == "tool_use"
    whole = read(reply, True).assistant[0]["content"]
    assert sdk_content(message) == [b for b in whole if b.get("name") != RECALL_TOOL]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_client_sends_the_stripped_turn_back_and_it_is_accepted(
    fake: TestClient, stream: bool
) -> None:
    body = offered(client_body(stream=stream))
    reply = post(fake, body, **{"x-test-mixed": "1"}).content
    message = sdk_message(WIRE.strip(reply, stream=stream, name=RECALL_TOOL), stream=stream)
    (bash,) = [block for block in message.content if block.type == "tool_use"]
    assert bash.name == "Bash"
    following = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": sdk_content(message)},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": bash.id, "content": "ok"}],
            },
        ],
    }
    accepted = post(fake, following)
    assert accepted.status_code == 200, accepted.text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_turn_of_recall_calls_alone_is_stripped_to_an_end_turn(
    fake: TestClient, stream: bool
) -> None:
    reply = post(fake, offered(client_body(stream=stream))).content
    stripped = WIRE.strip(reply, stream=stream, name=RECALL_TOOL)
    message = sdk_message(stripped, stream=stream)
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "redacted_thinking", "text"]
    assert WIRE.read(stripped, stream=stream, name=RECALL_TOOL) is None


# --------------------------------------------------------------------------- odd replies


def sse(kind: str, data: Any, newline: str = "\n") -> bytes:
    return f"event: {kind}{newline}data: ".encode() + orjson.dumps(data) + (newline * 2).encode()


def start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": payload}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


OPENING = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    },
}
ENDING = [
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 20},
    },
    {"type": "message_stop"},
]


def stream_of(*middle: bytes | dict[str, Any], end: bool = True, newline: str = "\n") -> bytes:
    parts = [sse("message_start", OPENING, newline)]
    for item in middle:
        parts.append(item if isinstance(item, bytes) else sse(item["type"], item, newline))
    if end:
        parts += [sse(event["type"], event, newline) for event in ENDING]
    return b"".join(parts)


RECALL_START = {"type": "tool_use", "id": "toolu_r", "name": RECALL_TOOL, "input": {}}
TEXT_START = {"type": "text", "text": ""}


def test_events_of_unknown_kinds_go_with_their_block() -> None:
    future = {"type": "content_block_future", "index": 1, "note": "a kind added later"}
    reply = stream_of(
        start(0, TEXT_START),
        delta(0, {"type": "text_delta", "text": "Looking."}),
        delta(0, {"type": "future_delta", "text": "not text"}),  # adds nothing
        stop(0),
        b": keep-alive\n\n",
        start(1, RECALL_START),
        delta(1, {"type": "input_json_delta", "partial_json": '{"query": "bu'}),
        future,
        delta(1, {"type": "input_json_delta", "partial_json": 'ild log"}'}),
        stop(1),
        start(2, {"type": "tool_use", "id": "toolu_c", "name": "Bash", "input": {}}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"command": "ls"}'}),
        {**future, "index": 2},
        stop(2),
    )
    turn = read(reply, True)
    assert turn.calls[0].arguments == '{"query": "build log"}'
    assert turn.assistant[0]["content"] == [
        {"type": "text", "text": "Looking."},
        {**RECALL_START, "input": {"query": "build log"}},
        {"type": "tool_use", "id": "toolu_c", "name": "Bash", "input": {"command": "ls"}},
    ]
    stripped = WIRE.strip(reply, stream=True, name=RECALL_TOOL)
    assert b": keep-alive\n\n" in stripped
    futures = [e.data for e in events(stripped) if e.kind == "content_block_future"]
    assert futures == [{**future, "index": 1}]  # block 1's went with it, block 2's renumbered
    message = sdk_message(stripped, stream=True)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.stop_reason == "tool_use"


def test_events_that_do_not_parse_are_passed_over_and_kept() -> None:
    junk = [
        b"event: content_block_delta\ndata: {not json\n\n",
        b"event: future\ndata: [1, 2]\n\n",
        b"retry: 1000\n\n",
    ]
    reply = stream_of(
        start(0, TEXT_START),
        delta(0, {"type": "text_delta", "text": "Looking."}),
        delta(0, "a delta that is not an object"),  # type: ignore[arg-type]
        junk[0],
        stop(0),
        start(1, RECALL_START),
        junk[1],
        delta(1, {"type": "input_json_delta", "partial_json": "{}"}),
        delta(5, {"type": "text_delta", "text": "for a block that never started"}),
        stop(1),
        start(2, {"type": "tool_use", "id": "toolu_c", "name": "Bash", "input": {}}),
        junk[2],
        stop(2),
    )
    turn = read(reply, True)
    assert [block["type"] for block in turn.assistant[0]["content"]] == ["text", *["tool_use"] * 2]
    assert turn.assistant[0]["content"][0]["text"] == "Looking."
    stripped = WIRE.strip(reply, stream=True, name=RECALL_TOOL)
    for event in junk:  # they name no block: kept where they were
        assert stripped.count(event) == 1
    assert b'"index":4' in stripped  # the stray delta's block is renumbered with the rest
    assert b"toolu_r" not in stripped


def test_a_stream_with_crlf_line_ends_keeps_them() -> None:
    reply = stream_of(
        start(0, RECALL_START),
        delta(0, {"type": "input_json_delta", "partial_json": "{}"}),
        stop(0),
        start(1, {"type": "tool_use", "id": "toolu_c", "name": "Bash", "input": {}}),
        stop(1),
        newline="\r\n",
    )
    assert read(reply, True).calls[0].arguments == "{}"
    stripped = WIRE.strip(reply, stream=True, name=RECALL_TOOL)
    assert b"\n" not in stripped.replace(b"\r\n", b"")
    assert [index_of(e) for e in events(stripped) if e.kind == "content_block_start"] == [0]
    assert sdk_message(stripped, stream=True).content[0].type == "tool_use"


def test_an_input_cut_at_the_output_limit_keeps_what_the_model_wrote() -> None:
    reply = stream_of(
        start(0, RECALL_START),
        delta(0, {"type": "input_json_delta", "partial_json": '{"ids": ["rq72'}),
        stop(0),
    ).replace(b'"stop_reason":"tool_use"', b'"stop_reason":"max_tokens"')
    turn = read(reply, True)
    assert turn.calls[0].arguments == '{"ids": ["rq72'  # the loop answers it as malformed
    assert turn.assistant[0]["content"] == [RECALL_START]  # an input the API takes back


def test_an_empty_text_block_is_not_sent_back() -> None:
    reply = stream_of(
        start(0, TEXT_START),
        stop(0),
        start(1, RECALL_START),
        stop(1),
    )
    assert read(reply, True).assistant[0]["content"] == [RECALL_START]


@pytest.mark.parametrize(
    "reply",
    [
        stream_of(start(0, RECALL_START), stop(0), end=False),  # cut short
        stream_of(start(0, RECALL_START), stop(0), {"type": "error", "error": {}}),
        sse("content_block_start", start(0, RECALL_START)),  # no message_start
        stream_of(start(0, RECALL_START), stop(0)).replace(b'"content":[]', b'"content":[{}]'),
        b"",
        b"data: [DONE]\n\n",
    ],
    ids=["cut", "error", "headless", "prefilled", "empty", "not-anthropic"],
)
def test_a_stream_that_is_not_a_whole_message_is_not_read(reply: bytes) -> None:
    assert WIRE.read(reply, stream=True, name=RECALL_TOOL) is None


@pytest.mark.parametrize(
    "reply",
    [
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        b"not json",
        b"[]",
        b'{"type":"message","content":"text"}',
        b'{"type":"message","content":[{"type":"tool_use","name":"compaction_recall"}]}',
    ],
    ids=["error", "garbage", "array", "string-content", "call-without-id"],
)
def test_a_json_body_that_is_not_a_recall_reply_is_not_read(reply: bytes) -> None:
    assert WIRE.read(reply, stream=False, name=RECALL_TOOL) is None
    if not reply.endswith(b'"compaction_recall"}]}'):
        assert WIRE.strip(reply, stream=False, name=RECALL_TOOL) == reply


def test_server_tools_ride_in_the_turn_and_are_not_client_calls() -> None:
    content = [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": 1}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "Found it.", "citations": None},
        {"type": "tool_use", "id": "toolu_r", "name": RECALL_TOOL, "input": {"query": "x"}},
    ]
    reply = orjson.dumps({**OPENING["message"], "content": content, "stop_reason": "tool_use"})
    turn = read(reply, False)
    assert turn.others == 0
    assert turn.assistant[0]["content"] == content


def test_the_format_offers_its_recall_wire() -> None:
    assert MESSAGES.recall is MESSAGES_RECALL
    assert MessagesFormat.recall is MESSAGES_RECALL


# --------------------------------------------------------------------------- any delta split

CLIENT_TOOLS = ("Bash", "Read")
words = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
inputs = st.dictionaries(st.text(max_size=8), values, max_size=4)


@st.composite
def replies(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A reply's blocks: maybe thinking (shown or omitted) and redacted thinking, text and
    server tool steps, then one or more tool calls, recall's and the client's mixed."""
    blocks: list[dict[str, Any]] = []
    if draw(st.booleans()):
        thought = draw(st.one_of(st.just(""), words))
        blocks.append({"type": "thinking", "thinking": thought, "signature": "c2lnbmVk" * 4})
    if draw(st.booleans()):
        blocks.append({"type": "redacted_thinking", "data": "ZW5jcnlwdGVk" * 3})
    for step in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": draw(words)})
        else:
            server = f"srvtoolu_{step}"
            blocks += [
                {
                    "type": "server_tool_use",
                    "id": server,
                    "name": "web_search",
                    "input": draw(inputs),
                },
                {"type": "web_search_tool_result", "tool_use_id": server, "content": []},
            ]
    names = draw(st.lists(st.sampled_from((RECALL_TOOL, *CLIENT_TOOLS)), min_size=1, max_size=4))
    for n, name in enumerate(names):
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{n:02d}", "name": name, "input": draw(inputs)}
        )
    return blocks


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    cuts = draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=5)) if text else set()
    bounds = [0, *sorted(cut for cut in cuts if cut < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]


def rendered(draw: st.DrawFn, blocks: list[dict[str, Any]], newline: str) -> bytes:
    """The stream of ``blocks`` with every text, thinking and input cut where drawn."""
    out: list[bytes | dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            out.append(start(index, TEXT_START))
            out += [
                delta(index, {"type": "text_delta", "text": p}) for p in pieces(draw, block["text"])
            ]
        elif kind in ("tool_use", "server_tool_use"):
            out.append(start(index, {**block, "input": {}}))
            written = orjson.dumps(block["input"]).decode()
            if draw(st.booleans()):
                out.append(delta(index, {"type": "input_json_delta", "partial_json": ""}))
            out += [
                delta(index, {"type": "input_json_delta", "partial_json": p})
                for p in pieces(draw, written)
            ]
        elif kind == "thinking":
            out.append(start(index, {"type": "thinking", "thinking": "", "signature": ""}))
            if block["thinking"]:
                out += [
                    delta(index, {"type": "thinking_delta", "thinking": p})
                    for p in pieces(draw, block["thinking"])
                ]
            out.append(delta(index, {"type": "signature_delta", "signature": block["signature"]}))
        else:
            out.append(start(index, block))
        out.append(stop(index))
        if draw(st.booleans()):
            out.append({"type": "ping"})
    return stream_of(*out, newline=newline)


def json_reply(blocks: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({**OPENING["message"], "content": blocks, "stop_reason": "tool_use"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=replies(), newline=st.sampled_from(["\n", "\r\n"]), data=st.data())
def test_a_stream_reads_and_strips_as_its_json_twin_whatever_its_deltas(
    blocks: list[dict[str, Any]], newline: str, data: st.DataObject
) -> None:
    stream = rendered(data.draw, blocks, newline)
    whole = json_reply(blocks)
    from_stream = WIRE.read(stream, stream=True, name=RECALL_TOOL)
    from_json = WIRE.read(whole, stream=False, name=RECALL_TOOL)
    recalls = [b for b in blocks if b["type"] == "tool_use" and b["name"] == RECALL_TOOL]
    if not recalls:
        assert from_stream is None and from_json is None
    else:
        assert from_stream is not None and from_json is not None
        assert (
            from_stream.assistant
            == from_json.assistant
            == ({"role": "assistant", "content": blocks},)
        )
        assert (
            from_stream.others
            == from_json.others
            == sum(1 for b in blocks if b["type"] == "tool_use" and b["name"] in CLIENT_TOOLS)
        )
        assert [c.call_id for c in from_stream.calls] == [b["id"] for b in recalls]
        for a, b in zip(from_stream.calls, from_json.calls, strict=True):
            assert orjson.loads(a.arguments) == orjson.loads(b.arguments)

    stripped_stream = WIRE.strip(stream, stream=True, name=RECALL_TOOL)
    stripped_json = WIRE.strip(whole, stream=False, name=RECALL_TOOL)
    expected = orjson.loads(stripped_json)
    assert expected["content"] == [b for b in blocks if b not in recalls]
    client_left = any(b["type"] == "tool_use" for b in expected["content"])
    assert expected["stop_reason"] == ("tool_use" if client_left else "end_turn")
    message = sdk_message(stripped_stream, stream=True)
    assert sdk_content(message) == expected["content"]
    assert message.stop_reason == expected["stop_reason"]
    assert sdk_content(sdk_message(stripped_json, stream=False)) == expected["content"]
    dropped = {index for index, b in enumerate(blocks) if b in recalls}
    _only_dropped_and_renumbered(events(stream), events(stripped_stream), dropped)


def _only_dropped_and_renumbered(
    before: list[Event], after: list[Event], dropped: set[int]
) -> None:
    """``after`` is ``before`` without the ``dropped`` blocks' events; every event kept is its
    bytes but for a lower ``index`` or the stop reason."""
    starts = [index_of(e) for e in after if e.kind == "content_block_start"]
    assert starts == list(range(len(starts)))
    kept = [event for event in before if index_of(event) not in dropped]
    for was, now in zip(kept, after, strict=True):
        assert now.lines[0] == was.lines[0]  # the `event:` line
        if now.raw == was.raw:
            continue
        assert now.data is not None and was.data is not None
        if now.kind == "message_delta":
            assert now.data["delta"]["stop_reason"] == "end_turn"
            assert {**now.data, "delta": was.data["delta"]} == was.data
        else:
            assert index_of(now) is not None and index_of(now) < index_of(was)  # type: ignore[operator]
            assert {**now.data, "index": was.data["index"]} == was.data
