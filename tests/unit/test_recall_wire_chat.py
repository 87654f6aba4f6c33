"""Chat completions' side of the recall loop (compaction_proxy/wire/chat/_recall.py): the tool
offered as the API declares tools, the model's calls read from real reply shapes (JSON and
streams split every way), a reply stripped of them that the official SDK's parsers and stream
helpers accept with the client's calls intact, and the continuation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from compaction_proxy.wire.chat import CHAT
from compaction_proxy.wire.chat._recall import CHAT_RECALL
from compaction_proxy.wire.recall import (
    RECALL_TOOL,
    RecallAnswer,
    RecallCall,
    RecallTool,
    RecallTurn,
    RecallWire,
)
from tests.support.sdk_replay import JSON, SSE, replaying
from tests.support.sse import sse_data

WIRE: RecallWire = CHAT.recall
TOOL = RecallTool(
    RECALL_TOOL,
    "Read compacted originals again.",
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}}},
)
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
GREP = {
    "type": "function",
    "function": {"name": "grep", "parameters": {"type": "object", "properties": {}}},
}
BODY: dict[str, Any] = {
    "model": "gpt-4.1",
    "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "What did the build log say?"},
    ],
    "tools": [READ_FILE, GREP],
}
RECALL_ARGS = '{"ids":["rq72amlvh4xxa"]}'


# --------------------------------------------------------------------------- reply builders


def completion(message: dict[str, Any], finish: str = "tool_calls") -> dict[str, Any]:
    """A chat completion as OpenAI writes it."""
    return {
        "id": "chatcmpl-BxQ1a2b3c4",
        "object": "chat.completion",
        "created": 1764650000,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 812,
            "completion_tokens": 41,
            "total_tokens": 853,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_4a0b8f3c1d",
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": list(calls),
        "refusal": None,
        "annotations": [],
    }


MIXED = completion(
    assistant(
        tool_call("call_a1", "read_file", '{"path":"build.log"}'),
        tool_call("call_r1", RECALL_TOOL, RECALL_ARGS),
    )
)


def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-BxQ1a2b3c4",
        "object": "chat.completion.chunk",
        "created": 1764650000,
        "model": "gpt-4.1-2025-04-14",
        "service_tier": "default",
        "system_fingerprint": "fp_4a0b8f3c1d",
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "obfuscation": "Qk2x",
    }


def sse(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    pieces: tuple[str, ...]

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


def call_deltas(position: int, call: Call) -> list[dict[str, Any]]:
    """A call's deltas as OpenAI streams them: id, type and name first, then the arguments."""
    head = {
        "index": position,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [
        {"tool_calls": [head]},
        *({"tool_calls": [{"index": position, "function": {"arguments": p}}]} for p in call.pieces),
    ]


def chat_stream(
    calls: list[Call],
    *,
    text: tuple[str, ...] = (),
    picks: list[int] | None = None,
    finish: str = "tool_calls",
) -> bytes:
    """A streamed completion of ``calls`` (after ``text``), their deltas interleaved by
    ``picks`` (each pick chooses among the calls that may go next: the ones already open, and
    the next to open; calls open in index order, as every server streams them)."""
    queues = [call_deltas(i, c) for i, c in enumerate(calls)]
    deltas: list[dict[str, Any]] = []
    opened = 0
    choices = iter(picks or ())
    while any(queues):
        ready = [i for i in range(opened) if queues[i]]
        if opened < len(queues):
            ready.append(opened)
        at = ready[next(choices, 0) % len(ready)]
        if at == opened:
            opened += 1
        deltas.append(queues[at].pop(0))
    parts = [sse(chunk({"role": "assistant", "content": None, "refusal": None}))]
    parts += [sse(chunk({"content": piece})) for piece in text]
    parts += [sse(chunk(d)) for d in deltas]
    parts.append(sse(chunk({}, finish)))
    usage = {"prompt_tokens": 812, "completion_tokens": 41, "total_tokens": 853}
    parts.append(sse({**chunk({}), "choices": [], "usage": usage}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def sdk_stream(body: bytes) -> Any:
    """The completion the SDK's ``chat.completions.stream`` helper accumulates from ``body``."""
    client = replaying(body, SSE)
    with client.chat.completions.stream(
        model="gpt-4.1", messages=BODY["messages"], tools=BODY["tools"]
    ) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def sdk_iterated(body: bytes) -> Any:
    """The completion ``ChatCompletionStreamState`` accumulates from plain iteration."""
    client = replaying(body, SSE)
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for piece in client.chat.completions.create(
        model="gpt-4.1", messages=BODY["messages"], stream=True
    ):
        state.handle_chunk(piece)
    return state.get_final_completion()


def sdk_calls(completion: Any) -> list[tuple[str, str, str]]:
    calls = completion.choices[0].message.tool_calls or []
    return [(c.id, c.function.name, c.function.arguments) for c in calls]


# --------------------------------------------------------------------------- tools


def test_the_format_names_its_recall_side() -> None:
    assert CHAT.recall is CHAT_RECALL


@pytest.mark.parametrize(
    ("body", "declared"),
    [
        (BODY, True),
        ({"messages": [], "functions": [{"name": "f", "parameters": {}}]}, True),
        ({"messages": [], "tools": []}, False),
        ({"messages": []}, False),
        ({"messages": [], "tools": "read_file"}, False),
        ({"messages": [], "tools": None, "functions": []}, False),
    ],
)
def test_tools_or_legacy_functions_are_what_an_agent_declares(
    body: dict[str, Any], declared: bool
) -> None:
    assert WIRE.declared(body) is declared


def test_a_clash_is_a_function_custom_or_legacy_tool_of_the_name() -> None:
    assert not WIRE.clashes(BODY, RECALL_TOOL)
    assert WIRE.clashes(BODY, "grep")
    custom = {"type": "custom", "custom": {"name": RECALL_TOOL, "format": {"type": "text"}}}
    assert WIRE.clashes({"tools": [READ_FILE, custom]}, RECALL_TOOL)
    assert WIRE.clashes({"functions": [{"name": RECALL_TOOL}]}, RECALL_TOOL)
    assert WIRE.clashes({"tools": [{"type": "function", "name": RECALL_TOOL}]}, RECALL_TOOL)
    assert not WIRE.clashes({"tools": ["odd", None, {"type": "web_search"}]}, RECALL_TOOL)


def test_the_offer_appends_the_tool_after_the_clients_own() -> None:
    members = WIRE.offer(BODY, TOOL)
    assert list(members) == ["tools"]
    assert members["tools"][:2] == [READ_FILE, GREP]
    assert members["tools"][0] is READ_FILE  # the client's values, not copies of them
    assert members["tools"][2] == {
        "type": "function",
        "function": {
            "name": RECALL_TOOL,
            "description": TOOL.description,
            "parameters": dict(TOOL.parameters),
        },
    }
    assert BODY["tools"] == [READ_FILE, GREP]  # the request itself is not changed


def test_a_legacy_functions_request_is_offered_the_tool_as_a_function() -> None:
    body = {"messages": [], "functions": [{"name": "lookup", "parameters": {}}]}
    assert WIRE.offer(body, TOOL) == {
        "functions": [
            {"name": "lookup", "parameters": {}},
            {
                "name": RECALL_TOOL,
                "description": TOOL.description,
                "parameters": dict(TOOL.parameters),
            },
        ]
    }
    assert WIRE.closing(body) == {"function_call": "none"}
    assert WIRE.closing(BODY) == {"tool_choice": "none"}


# --------------------------------------------------------------------------- reading JSON


def test_a_mixed_json_reply_reads_as_its_recall_calls_beside_one_client_call() -> None:
    turn = WIRE.read(orjson.dumps(MIXED), stream=False, name=RECALL_TOOL)
    assert turn == RecallTurn(
        calls=(RecallCall("call_r1", RECALL_ARGS),),
        others=1,
        assistant=(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    tool_call("call_a1", "read_file", '{"path":"build.log"}'),
                    tool_call("call_r1", RECALL_TOOL, RECALL_ARGS),
                ],
            },
        ),
    )


def test_text_beside_the_calls_and_reasoning_fields_go_into_the_assistant_turn() -> None:
    message = {
        **assistant(tool_call("call_r1", RECALL_TOOL, RECALL_ARGS), content="Checking."),
        "reasoning_content": "I need the log.",
    }
    turn = WIRE.read(orjson.dumps(completion(message)), stream=False, name=RECALL_TOOL)
    assert turn is not None and turn.others == 0
    assert turn.assistant[0]["content"] == "Checking."
    assert turn.assistant[0]["reasoning_content"] == "I need the log."
    assert "refusal" not in turn.assistant[0] and "annotations" not in turn.assistant[0]


@pytest.mark.parametrize(
    "reply",
    [
        orjson.dumps(completion(assistant(tool_call("call_a1", "read_file", "{}")))),
        orjson.dumps(completion({"role": "assistant", "content": "Done."}, "stop")),
        orjson.dumps({"error": {"message": "overloaded", "type": "server_error"}}),
        b"<html>502 Bad Gateway</html>",
        b"",
        orjson.dumps([1, 2]),
        orjson.dumps({"choices": "none"}),
    ],
)
def test_a_reply_without_a_recall_call_reads_as_none(reply: bytes) -> None:
    assert WIRE.read(reply, stream=False, name=RECALL_TOOL) is None


def test_only_choice_zero_is_read() -> None:
    reply = completion(assistant(tool_call("call_a1", "read_file", "{}")))
    second = {
        "index": 1,
        "message": assistant(tool_call("call_r9", RECALL_TOOL, RECALL_ARGS)),
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    reply["choices"] = [second, *reply["choices"]]  # listed first, but index 1
    assert WIRE.read(orjson.dumps(reply), stream=False, name=RECALL_TOOL) is None
    reply["choices"] = [{**reply["choices"][1], "index": 1}, {**second, "index": 0}]
    turn = WIRE.read(orjson.dumps(reply), stream=False, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_r9", RECALL_ARGS),)


def test_a_legacy_function_call_reads_as_one_call_named_by_the_tool() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": RECALL_TOOL, "arguments": RECALL_ARGS},
    }
    reply = orjson.dumps(completion(message, "function_call"))
    turn = WIRE.read(reply, stream=False, name=RECALL_TOOL)
    assert turn == RecallTurn(
        (RecallCall(RECALL_TOOL, RECALL_ARGS),),
        0,
        ({"role": "assistant", "content": None, "function_call": message["function_call"]},),
    )
    answers = [RecallAnswer(RECALL_TOOL, "[recall id rq72amlvh4xxa: tool read_file]\nok")]
    assert WIRE.continuation({"messages": [{"role": "user", "content": "hi"}]}, turn, answers) == {
        "messages": [
            {"role": "user", "content": "hi"},
            turn.assistant[0],
            {"role": "function", "name": RECALL_TOOL, "content": answers[0].text},
        ]
    }
    stripped = orjson.loads(WIRE.strip(reply, stream=False, name=RECALL_TOOL))
    assert "function_call" not in stripped["choices"][0]["message"]
    assert stripped["choices"][0]["finish_reason"] == "stop"


def test_a_call_without_an_id_gets_one_its_answer_can_name() -> None:
    call = {"type": "function", "function": {"name": RECALL_TOOL, "arguments": RECALL_ARGS}}
    reply = orjson.dumps(completion(assistant(call)))
    turn = WIRE.read(reply, stream=False, name=RECALL_TOOL)
    assert turn is not None
    assert turn.calls[0].call_id == "call_recall_0"
    assert turn.assistant[0]["tool_calls"][0]["id"] == "call_recall_0"


# --------------------------------------------------------------------------- reading streams


def test_a_stream_reads_as_the_json_reply_it_stands_for() -> None:
    calls = [
        Call("call_a1", "read_file", ('{"pa', 'th":"bu', 'ild.log"}')),
        Call("call_r1", RECALL_TOOL, ('{"ids":', '["rq72amlvh4xxa"]}')),
    ]
    streamed = WIRE.read(chat_stream(calls), stream=True, name=RECALL_TOOL)
    whole = WIRE.read(orjson.dumps(MIXED), stream=False, name=RECALL_TOOL)
    assert streamed == whole


def test_streamed_text_is_the_turns_content_and_an_error_chunk_reads_as_none() -> None:
    calls = [Call("call_r1", RECALL_TOOL, (RECALL_ARGS,))]
    turn = WIRE.read(chat_stream(calls, text=("Let me ", "check.")), stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.assistant[0]["content"] == "Let me check."
    broken = chat_stream(calls).replace(b"data: [DONE]", b'data: {"error":{"message":"cut"}}')
    assert WIRE.read(broken, stream=True, name=RECALL_TOOL) is None


def test_entries_without_an_index_are_placed_by_their_id() -> None:
    """Some OpenAI-compatible servers send no ``index``: a new id opens a call, an entry
    without one continues the last."""
    deltas: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "id": "call_a1",
                    "type": "function",
                    "function": {"name": "grep", "arguments": "{"},
                }
            ]
        },
        {"tool_calls": [{"function": {"arguments": "}"}}]},
        {"tool_calls": [{"id": "call_r1", "type": "function", "function": {"name": RECALL_TOOL}}]},
        {"tool_calls": [{"function": {"arguments": RECALL_ARGS}}]},
    ]
    body = b"".join(sse(chunk(d)) for d in deltas) + b"data: [DONE]\n\n"
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None
    assert turn.calls == (RecallCall("call_r1", RECALL_ARGS),)
    assert turn.others == 1
    assert [c["function"]["arguments"] for c in turn.assistant[0]["tool_calls"]] == [
        "{}",
        RECALL_ARGS,
    ]


def test_a_name_split_over_deltas_is_read_as_the_sdk_joins_it() -> None:
    deltas: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"index": 0, "id": "call_", "type": "function", "function": {"name": "compaction_"}}
            ]
        },
        {
            "tool_calls": [
                {"index": 0, "id": "r1", "function": {"name": "recall", "arguments": "{}"}}
            ]
        },
        *call_deltas(1, Call("call_a1", "grep", ("{}",))),
    ]
    body = b"".join(sse(chunk(d)) for d in deltas) + b"data: [DONE]\n\n"
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_r1", "{}"),)
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    assert sdk_calls(sdk_iterated(stripped)) == [("call_a1", "grep", "{}")]


# --------------------------------------------------------------------------- stripping JSON


def test_a_stripped_json_reply_keeps_the_clients_call_for_the_sdk() -> None:
    stripped = WIRE.strip(orjson.dumps(MIXED), stream=False, name=RECALL_TOOL)
    parsed = replaying(stripped, JSON).chat.completions.create(
        model="gpt-4.1", messages=BODY["messages"], tools=BODY["tools"]
    )
    assert sdk_calls(parsed) == [("call_a1", "read_file", '{"path":"build.log"}')]
    assert parsed.choices[0].finish_reason == "tool_calls"
    assert RECALL_TOOL.encode() not in stripped
    expected = orjson.loads(orjson.dumps(MIXED))
    del expected["choices"][0]["message"]["tool_calls"][1]
    assert orjson.loads(stripped) == expected  # nothing else changed


def test_a_json_reply_left_without_calls_finishes_as_one_that_called_none() -> None:
    reply = orjson.dumps(
        completion(assistant(tool_call("call_r1", RECALL_TOOL, RECALL_ARGS), content="Hm."))
    )
    stripped = orjson.loads(WIRE.strip(reply, stream=False, name=RECALL_TOOL))
    choice = stripped["choices"][0]
    assert "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "Hm."


def test_a_reply_without_recall_calls_is_stripped_to_its_own_bytes() -> None:
    reply = orjson.dumps(
        completion(assistant(tool_call("call_a1", "grep", "{}"))), option=orjson.OPT_INDENT_2
    )
    assert WIRE.strip(reply, stream=False, name=RECALL_TOOL) is reply
    stream = chat_stream([Call("call_a1", "grep", ("{}",))])
    assert WIRE.strip(stream, stream=True, name=RECALL_TOOL) is stream
    assert WIRE.strip(b"not json", stream=False, name=RECALL_TOOL) == b"not json"


def test_every_choice_is_stripped() -> None:
    reply = completion(
        assistant(tool_call("call_a1", "grep", "{}"), tool_call("call_r1", RECALL_TOOL, "{}"))
    )
    reply["choices"].append(
        {
            "index": 1,
            "message": assistant(tool_call("call_r2", RECALL_TOOL, "{}")),
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    )
    stripped = orjson.loads(WIRE.strip(orjson.dumps(reply), stream=False, name=RECALL_TOOL))
    assert [c["id"] for c in stripped["choices"][0]["message"]["tool_calls"]] == ["call_a1"]
    assert "tool_calls" not in stripped["choices"][1]["message"]
    assert stripped["choices"][1]["finish_reason"] == "stop"


# --------------------------------------------------------------------------- stripping streams


def test_a_stripped_stream_gives_the_sdk_helpers_the_clients_calls_renumbered() -> None:
    calls = [
        Call("call_r1", RECALL_TOOL, ('{"ids":["rq72', 'amlvh4xxa"]}')),
        Call("call_a1", "read_file", ('{"path":', '"build.log"}')),
        Call("call_r2", RECALL_TOOL, ('{"query":"build"}',)),
        Call("call_g1", "grep", ('{"pattern":', '"error"}')),
    ]
    body = chat_stream(calls, text=("Looking.",))
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    expected = [
        ("call_a1", "read_file", '{"path":"build.log"}'),
        ("call_g1", "grep", '{"pattern":"error"}'),
    ]
    for parsed in (sdk_stream(stripped), sdk_iterated(stripped)):
        assert sdk_calls(parsed) == expected
        assert parsed.choices[0].message.content == "Looking."
        assert parsed.choices[0].finish_reason == "tool_calls"
    assert RECALL_TOOL.encode() not in stripped
    indexes = [
        e["index"]
        for data in sse_data(stripped)
        if data != "[DONE]"
        for choice in orjson.loads(data)["choices"]
        for e in choice["delta"].get("tool_calls", ())
    ]
    assert sorted(set(indexes)) == [0, 1]


def test_events_stripping_did_not_touch_keep_their_bytes() -> None:
    calls = [Call("call_a1", "read_file", ("{}",)), Call("call_r1", RECALL_TOOL, ("{", "}"))]
    body = chat_stream(calls, text=("a", "b"))
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    kept = [e + b"\n\n" for e in body.split(b"\n\n") if e and RECALL_TOOL.encode() not in e]
    # The recall call's deltas (its name, then arguments of index 1) went; everything else is
    # the upstream's bytes: the role chunk, text, the client's call, finish, usage, [DONE].
    assert stripped == b"".join(k for k in kept if b'"index":1,"function"' not in k)


def test_a_stream_left_without_calls_finishes_with_stop_and_drops_emptied_chunks() -> None:
    body = chat_stream([Call("call_r1", RECALL_TOOL, ('{"ids"', ":[]}"))], text=("Hm.",))
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    parsed = sdk_stream(stripped)
    assert parsed.choices[0].message.tool_calls is None
    assert parsed.choices[0].finish_reason == "stop"
    assert parsed.choices[0].message.content == "Hm."
    assert len(sse_data(stripped)) == len(sse_data(body)) - 3  # the call's three chunks
    assert parsed.usage is not None and parsed.usage.completion_tokens == 41


def test_a_legacy_streamed_function_call_is_stripped() -> None:
    deltas: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": RECALL_TOOL, "arguments": ""},
        },
        {"function_call": {"arguments": RECALL_ARGS}},
    ]
    body = (
        b"".join(sse(chunk(d)) for d in deltas)
        + sse(chunk({}, "function_call"))
        + b"data: [DONE]\n\n"
    )
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall(RECALL_TOOL, RECALL_ARGS),)
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    assert RECALL_TOOL.encode() not in stripped
    assert sdk_iterated(stripped).choices[0].finish_reason == "stop"


def test_n_choices_each_stripped_and_choice_zero_read() -> None:
    first = [sse(chunk(d)) for d in call_deltas(0, Call("call_a1", "grep", ("{}",)))]
    first += [sse(chunk(d)) for d in call_deltas(1, Call("call_r1", RECALL_TOOL, (RECALL_ARGS,)))]
    second = [sse(chunk(d, index=1)) for d in call_deltas(0, Call("call_r2", RECALL_TOOL, ("{}",)))]
    second += [
        sse(chunk(d, index=1)) for d in call_deltas(1, Call("call_b1", "read_file", ("{}",)))
    ]
    ends = [sse(chunk({}, "tool_calls")), sse(chunk({}, "tool_calls", index=1))]
    body = b"".join([*first, *second, *ends, b"data: [DONE]\n\n"])
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_r1", RECALL_ARGS),)
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    parsed = sdk_iterated(stripped)
    assert [[c.id for c in ch.message.tool_calls or ()] for ch in parsed.choices] == [
        ["call_a1"],
        ["call_b1"],
    ]


def test_malformed_and_unknown_events_are_left_as_they_came() -> None:
    calls = [Call("call_a1", "grep", ("{}",)), Call("call_r1", RECALL_TOOL, ("{}",))]
    odd = [
        b": keep-alive\n\n",
        b"data: {not json\n\n",
        b"event: ping\ndata: {}\n\n",
        b'data: {"choices":"odd"}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":"odd"}}]}\n\n',
    ]
    body = chat_stream(calls)
    cut = body.index(b"data: [DONE]")
    body = body[:cut] + b"".join(odd) + body[cut:] + b'data: {"after": "done"'  # unterminated
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    for piece in odd:
        assert piece in stripped
    assert stripped.endswith(b'data: [DONE]\n\ndata: {"after": "done"')
    assert RECALL_TOOL.encode() not in stripped
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.others == 1


def test_crlf_streams_keep_their_line_ends() -> None:
    calls = [Call("call_a1", "grep", ("{}",)), Call("call_r1", RECALL_TOOL, ("{}",))]
    body = chat_stream(calls, text=("x",)).replace(b"\n", b"\r\n")
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    assert b"\n" not in stripped.replace(b"\r\n", b"")
    assert sdk_calls(sdk_stream(stripped)) == [("call_a1", "grep", "{}")]
    assert WIRE.read(body, stream=True, name=RECALL_TOOL) is not None


# --------------------------------------------------------------------------- properties


names = st.sampled_from(["read_file", "grep", RECALL_TOOL, "compaction_recall_x"])
argument_texts = st.dictionaries(
    st.text(min_size=1, max_size=6), st.text(max_size=12) | st.integers(-(2**53), 2**53), max_size=3
).map(lambda d: orjson.dumps(d).decode())


@st.composite
def calls_split(draw: st.DrawFn) -> list[Call]:
    calls = []
    for number, name in enumerate(draw(st.lists(names, min_size=1, max_size=5))):
        text = draw(argument_texts)
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
        pieces = tuple(text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True))
        calls.append(Call(f"call_{number}", name, pieces))
    return calls


@settings(max_examples=60, deadline=None)
@given(
    calls_split(),
    st.lists(st.integers(0, 10), max_size=40),
    st.tuples() | st.tuples(st.text(min_size=1, max_size=8)),
)
def test_any_split_and_order_reads_and_strips_to_the_clients_calls(
    calls: list[Call], picks: list[int], text: tuple[str, ...]
) -> None:
    body = chat_stream(calls, text=text, picks=picks)
    recall = [c for c in calls if c.name == RECALL_TOOL]
    client = [(c.id, c.name, c.arguments) for c in calls if c.name != RECALL_TOOL]
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    if not recall:
        assert turn is None
        assert WIRE.strip(body, stream=True, name=RECALL_TOOL) == body
        return
    assert turn is not None
    assert turn.calls == tuple(RecallCall(c.id, c.arguments) for c in recall)
    assert turn.others == len(client)
    assert [c["id"] for c in turn.assistant[0]["tool_calls"]] == [c.id for c in calls]
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    for parsed in (sdk_stream(stripped), sdk_iterated(stripped)):
        assert sdk_calls(parsed) == client
        assert parsed.choices[0].finish_reason == ("tool_calls" if client else "stop")
        assert (parsed.choices[0].message.content or None) == ("".join(text) or None)
    assert f'"{RECALL_TOOL}"'.encode() not in stripped


# --------------------------------------------------------------------------- continuation


def test_the_continuation_appends_the_turn_and_one_tool_message_per_answer() -> None:
    turn = WIRE.read(orjson.dumps(MIXED), stream=False, name=RECALL_TOOL)
    assert turn is not None
    answers = [RecallAnswer("call_r1", "[recall id rq72amlvh4xxa: tool read_file]\nBUILD OK")]
    members = WIRE.continuation(BODY, turn, answers)
    assert members == {
        "messages": [
            *BODY["messages"],
            turn.assistant[0],
            {"role": "tool", "tool_call_id": "call_r1", "content": answers[0].text},
        ]
    }
    assert len(BODY["messages"]) == 2  # the body itself is not changed
