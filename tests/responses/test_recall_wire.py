"""The Responses API's side of the recall loop (compaction_proxy/wire/responses/_recall.py):
the tool offered in ``tools``, the model's calls read from real response shapes (JSON and
event streams, arguments split every way), a reply stripped of them that the official SDK's
stream helpers accept with the client's items intact, and the continuation."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_proxy.wire.recall import (
    RECALL_TOOL,
    RecallAnswer,
    RecallCall,
    RecallTool,
    RecallTurn,
    RecallWire,
)
from compaction_proxy.wire.responses import RESPONSES
from compaction_proxy.wire.responses._recall import RESPONSES_RECALL
from tests.support.responses_upstream import stream_events
from tests.support.sdk_replay import JSON, SSE, replaying
from tests.support.sse import sse_data

WIRE: RecallWire = RESPONSES.recall
TOOL = RecallTool(
    RECALL_TOOL,
    "Read compacted originals again.",
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}}},
)
READ_FILE: dict[str, Any] = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    "strict": False,
}
WEB_SEARCH = {"type": "web_search"}
RECALL_DECLARED = {
    "type": "function",
    "name": RECALL_TOOL,
    "description": TOOL.description,
    "parameters": dict(TOOL.parameters),
    "strict": False,
}
BODY: dict[str, Any] = {
    "model": "gpt-5",
    "instructions": "You are an agent.",
    "input": [{"role": "user", "content": "What did the build log say?"}],
    "tools": [READ_FILE, WEB_SEARCH],
    "store": False,
    "include": ["reasoning.encrypted_content"],
}
RECALL_ARGS = '{"ids":["rq72amlvh4xxa"]}'


# --------------------------------------------------------------------------- reply builders


def reasoning(n: int, encrypted: bool = True) -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"rs_{n:04d}", "type": "reasoning", "summary": []}
    if encrypted:
        item["encrypted_content"] = f"gAAAAABo-encrypted-{n}"
    return item


def message(n: int, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{n:04d}",
        "type": "message",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "role": "assistant",
    }


def function_call(n: int, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"fc_{n:04d}",
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": f"call_{n:04d}",
        "name": name,
    }


def web_search(n: int) -> dict[str, Any]:
    return {
        "id": f"ws_{n:04d}",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "build log"},
    }


def response(output: list[dict[str, Any]], tools: list[Any] | None = None) -> dict[str, Any]:
    """A response object as the API writes it (the request's tools echoed)."""
    return {
        "id": "resp_68de1f2a9c",
        "object": "response",
        "created_at": 1764650000,
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": "You are an agent.",
        "max_output_tokens": None,
        "model": "gpt-5-2025-08-07",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [READ_FILE, WEB_SEARCH, RECALL_DECLARED] if tools is None else tools,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 812,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 41,
            "output_tokens_details": {"reasoning_tokens": 16},
            "total_tokens": 853,
        },
        "user": None,
        "metadata": {},
    }


def split(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def opened(item: dict[str, Any]) -> dict[str, Any]:
    """An item as ``response.output_item.added`` shows it."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    if item["type"] == "reasoning":
        return {k: v for k, v in item.items() if k != "encrypted_content"}
    if item["type"] == "web_search_call":
        return {k: v for k, v in item.items() if k != "action"} | {"status": "in_progress"}
    return item


def responses_stream(
    whole: dict[str, Any],
    pieces: dict[int, list[str]] | None = None,
    *,
    final: bool = True,
) -> bytes:
    """The API's event stream for ``whole``: ``pieces[i]``, the argument (or text) deltas of
    output item ``i``; ``final``: whether ``response.completed`` ends it."""
    sequence = itertools.count()
    out: list[bytes] = []

    def event(kind: str, **fields: Any) -> None:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        out.append(f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n")

    opening = {**whole, "status": "in_progress", "output": [], "usage": None}
    event("response.created", response=opening)
    event("response.in_progress", response=opening)
    for index, item in enumerate(whole["output"]):
        event("response.output_item.added", output_index=index, item=opened(item))
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            event("response.content_part.added", **where, content_index=0, part=part)
            for piece in (pieces or {}).get(index) or split(text):
                event(
                    "response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[]
                )
            event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            event("response.content_part.done", **where, content_index=0, part=item["content"][0])
        elif item["type"] == "function_call":
            for piece in (pieces or {}).get(index) or split(item["arguments"]):
                event("response.function_call_arguments.delta", **where, delta=piece)
            event("response.function_call_arguments.done", **where, arguments=item["arguments"])
        elif item["type"] == "web_search_call":
            for stage in ("in_progress", "searching", "completed"):
                event(f"response.web_search_call.{stage}", **where)
        event("response.output_item.done", output_index=index, item=item)
    if final:
        event("response.completed", response=whole)
    return b"".join(out)


def sdk_final(body: bytes) -> Any:
    """The response the SDK's ``responses.stream`` helper accumulates from ``body``."""
    client = replaying(body, SSE)
    tools: Any = [READ_FILE]
    with client.responses.stream(model="gpt-5", input="hi", tools=tools) as stream:
        for _ in stream:
            pass
        return stream.get_final_response()


def sdk_events(body: bytes) -> list[Any]:
    """The events plain iteration of ``responses.create(stream=True)`` yields."""
    client = replaying(body, SSE)
    return list(client.responses.create(model="gpt-5", input="hi", stream=True))


def ids(items: list[Any]) -> list[str]:
    return [item["id"] if isinstance(item, dict) else item.id for item in items]


def event_data(body: bytes) -> Iterator[dict[str, Any]]:
    for data in sse_data(body):
        if data != "[DONE]":
            yield orjson.loads(data)


def check_numbering(body: bytes) -> None:
    """What a client of the API may rely on: sequence numbers 0, 1, ... and output indexes
    0, 1, ... opened in order."""
    data = list(event_data(body))
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    added = [d["output_index"] for d in data if d["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))


# --------------------------------------------------------------------------- tools


def test_the_format_names_its_recall_side() -> None:
    assert RESPONSES.recall is RESPONSES_RECALL


@pytest.mark.parametrize(
    ("tools", "declared"),
    [
        ([READ_FILE], True),
        ([WEB_SEARCH], True),  # a hosted tool is an agent's too
        ([{"type": "mcp", "server_label": "docs", "server_url": "https://x.test"}], True),
        ([], False),
        (None, False),
        ("read_file", False),
    ],
)
def test_any_tool_is_what_an_agent_declares(tools: Any, declared: bool) -> None:
    body = {"input": "hi"} if tools is None else {"input": "hi", "tools": tools}
    assert WIRE.declared(body) is declared


def test_a_clash_is_any_tool_of_the_name() -> None:
    assert not WIRE.clashes(BODY, RECALL_TOOL)
    assert WIRE.clashes(BODY, "read_file")
    custom = {"type": "custom", "name": RECALL_TOOL, "format": {"type": "text"}}
    assert WIRE.clashes({"tools": [WEB_SEARCH, custom]}, RECALL_TOOL)
    assert not WIRE.clashes({"tools": [None, "x", WEB_SEARCH]}, RECALL_TOOL)


def test_the_offer_appends_a_function_tool_after_the_clients_own() -> None:
    members = WIRE.offer(BODY, TOOL)
    assert members == {"tools": [READ_FILE, WEB_SEARCH, RECALL_DECLARED]}
    assert members["tools"][0] is READ_FILE
    assert BODY["tools"] == [READ_FILE, WEB_SEARCH]
    assert WIRE.closing(BODY) == {"tool_choice": "none"}


# --------------------------------------------------------------------------- reading


MIXED_OUTPUT = [
    reasoning(1),
    function_call(2, "read_file", '{"path":"build.log"}'),
    function_call(3, RECALL_TOOL, RECALL_ARGS),
]


def test_a_mixed_json_reply_reads_as_its_recall_calls_and_the_whole_output() -> None:
    turn = WIRE.read(orjson.dumps(response(MIXED_OUTPUT)), stream=False, name=RECALL_TOOL)
    assert turn == RecallTurn(
        calls=(RecallCall("call_0003", RECALL_ARGS),), others=1, assistant=tuple(MIXED_OUTPUT)
    )


def test_hosted_calls_are_not_the_clients_and_namespaced_calls_are_not_recall() -> None:
    output = [
        web_search(1),
        {**function_call(2, RECALL_TOOL, "{}"), "namespace": "tools_of_mine"},
        function_call(3, RECALL_TOOL, RECALL_ARGS),
        message(4, "Searching."),
    ]
    turn = WIRE.read(orjson.dumps(response(output)), stream=False, name=RECALL_TOOL)
    assert turn is not None
    assert turn.calls == (RecallCall("call_0003", RECALL_ARGS),)
    assert turn.others == 1  # the namespaced function call is the client's
    output[1] = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "name": "x",
        "arguments": "{}",
        "server_label": "s",
    }
    turn = WIRE.read(orjson.dumps(response(output)), stream=False, name=RECALL_TOOL)
    assert turn is not None and turn.others == 1
    output[1] = {"type": "shiny_new_call", "id": "sn_1", "call_id": "call_sn"}
    turn = WIRE.read(orjson.dumps(response(output)), stream=False, name=RECALL_TOOL)
    assert turn is not None and turn.others == 1
    del output[1]
    turn = WIRE.read(orjson.dumps(response(output)), stream=False, name=RECALL_TOOL)
    assert turn is not None and turn.others == 0


@pytest.mark.parametrize(
    "reply",
    [
        orjson.dumps(response([reasoning(1), function_call(2, "read_file", "{}")])),
        orjson.dumps(response([message(1, "Done.")])),
        orjson.dumps({**response(MIXED_OUTPUT), "status": "failed"}),
        orjson.dumps({**response(MIXED_OUTPUT), "error": {"code": "server_error", "message": "x"}}),
        orjson.dumps({"error": {"message": "overloaded", "type": "server_error"}}),
        b"<html>502</html>",
        orjson.dumps({"output": "odd"}),
    ],
)
def test_a_json_reply_without_a_recall_call_reads_as_none(reply: bytes) -> None:
    assert WIRE.read(reply, stream=False, name=RECALL_TOOL) is None


def test_a_stream_reads_as_the_json_reply_it_stands_for() -> None:
    whole = response(MIXED_OUTPUT)
    streamed = WIRE.read(responses_stream(whole), stream=True, name=RECALL_TOOL)
    assert streamed == WIRE.read(orjson.dumps(whole), stream=False, name=RECALL_TOOL)


def test_a_stream_prefers_the_completed_output() -> None:
    whole = response(MIXED_OUTPUT)
    body = responses_stream(whole, {2: ['{"ids":', "[]}"]})  # deltas that disagree
    escaped = b'"arguments":"{\\"ids\\":[\\"rq72amlvh4xxa\\"]}"'
    assert body.count(escaped) == 3  # arguments.done, output_item.done, response.completed
    body = body.replace(escaped, b'"arguments":"{}"', 2)
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_0003", RECALL_ARGS),)


def test_a_stream_without_its_completed_event_is_rebuilt_from_its_items() -> None:
    whole = response(MIXED_OUTPUT)
    body = responses_stream(whole, final=False)
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn == WIRE.read(orjson.dumps(whole), stream=False, name=RECALL_TOOL)
    # Cut before the recall call's item was done: its arguments from the deltas.
    cut = body.rindex(b"event: response.function_call_arguments.done", 0, len(body))
    turn = WIRE.read(body[:cut], stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_0003", RECALL_ARGS),)
    assert turn.assistant[2]["status"] == "in_progress"


@pytest.mark.parametrize(
    "ending",
    [
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "code": "server_error", "message": "x", "param": None})
        + b"\n\n",
        b"event: response.failed\ndata: "
        + orjson.dumps({"type": "response.failed", "response": {"status": "failed", "output": []}})
        + b"\n\n",
    ],
)
def test_a_stream_that_failed_reads_as_none(ending: bytes) -> None:
    body = responses_stream(response(MIXED_OUTPUT), final=False) + ending
    assert WIRE.read(body, stream=True, name=RECALL_TOOL) is None


# --------------------------------------------------------------------------- stripping


def test_a_stripped_json_reply_keeps_the_clients_items_for_the_sdk() -> None:
    stripped = WIRE.strip(orjson.dumps(response(MIXED_OUTPUT)), stream=False, name=RECALL_TOOL)
    parsed = replaying(stripped, JSON).responses.create(model="gpt-5", input="hi")
    assert ids(parsed.output) == ["rs_0001", "fc_0002"]
    assert [t.type for t in parsed.tools] == ["function", "web_search"]
    assert RECALL_TOOL.encode() not in stripped
    assert orjson.loads(stripped) == response(MIXED_OUTPUT[:2], [READ_FILE, WEB_SEARCH])


def test_reasoning_that_led_only_to_recall_calls_goes_with_them() -> None:
    output = [
        reasoning(1),
        function_call(2, RECALL_TOOL, RECALL_ARGS),
        reasoning(3),
        function_call(4, "read_file", "{}"),
        function_call(5, RECALL_TOOL, "{}"),
    ]
    whole = response(output)
    stripped = orjson.loads(WIRE.strip(orjson.dumps(whole), stream=False, name=RECALL_TOOL))
    assert ids(stripped["output"]) == ["rs_0003", "fc_0004"]
    streamed = WIRE.strip(responses_stream(whole), stream=True, name=RECALL_TOOL)
    assert ids(sdk_final(streamed).output) == ["rs_0003", "fc_0004"]
    check_numbering(streamed)


def test_a_stripped_stream_gives_the_sdk_the_clients_items_renumbered() -> None:
    output = [
        reasoning(1),
        function_call(2, RECALL_TOOL, RECALL_ARGS),
        message(3, "Reading the log and searching."),
        function_call(4, "read_file", '{"path":"build.log"}'),
        web_search(5),
        function_call(6, RECALL_TOOL, '{"query":"build"}'),
    ]
    body = responses_stream(response(output))
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    final = sdk_final(stripped)
    assert ids(final.output) == ["rs_0001", "msg_0003", "fc_0004", "ws_0005"]
    assert final.output_text == "Reading the log and searching."
    assert final.output[2].arguments == '{"path":"build.log"}'
    assert RECALL_TOOL.encode() not in stripped
    check_numbering(stripped)
    raw = sdk_events(stripped)
    assert raw[-1].type == "response.completed"
    assert ids(raw[-1].response.output) == ids(final.output)
    by_item = {e.item_id: e.output_index for e in raw if getattr(e, "item_id", None)}
    assert by_item == {"msg_0003": 1, "fc_0004": 2, "ws_0005": 3}


def test_events_stripping_did_not_touch_keep_their_bytes() -> None:
    output = [
        message(1, "Hello."),
        function_call(2, "read_file", "{}"),
        function_call(3, RECALL_TOOL, "{}"),
    ]
    body = responses_stream(response(output, [READ_FILE]))  # nothing echoed to hide
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    kept = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    before = [e for e in kept if b'"output_index":2' not in e and b"response.completed" not in e]
    assert stripped.startswith(b"".join(before))  # every event before the call, byte for byte
    assert stripped.count(b"\n\n") == len(kept) - 4  # added, delta, done, item done


def test_a_reply_without_recall_and_no_echo_is_stripped_to_its_own_bytes() -> None:
    whole = response([reasoning(1), function_call(2, "read_file", "{}")], [READ_FILE])
    body = responses_stream(whole)
    assert WIRE.strip(body, stream=True, name=RECALL_TOOL) is body
    reply = orjson.dumps(whole)
    assert WIRE.strip(reply, stream=False, name=RECALL_TOOL) is reply


def test_the_echoed_recall_tool_is_hidden_even_without_a_call() -> None:
    whole = response([message(1, "Done.")])
    body = responses_stream(whole)
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    assert RECALL_TOOL.encode() not in stripped
    assert [t.type for t in sdk_final(stripped).tools] == ["function", "web_search"]
    check_numbering(stripped)


def test_the_fake_upstreams_stream_is_stripped_for_the_sdk() -> None:
    """The shapes tests/support/responses_upstream.py streams (one delta per call)."""
    whole = response(
        [
            reasoning(7),
            function_call(8, "read_file", '{"index":0}'),
            function_call(9, RECALL_TOOL, "{}"),
        ]
    )

    async def collect() -> bytes:
        return b"".join([piece async for piece in stream_events(whole)])

    body = asyncio.run(collect())
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    assert turn is not None and turn.calls == (RecallCall("call_0009", "{}"),) and turn.others == 1
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    assert ids(sdk_final(stripped).output) == ["rs_0007", "fc_0008"]
    check_numbering(stripped)


def test_malformed_and_unknown_events_are_left_as_they_came() -> None:
    output = [
        function_call(1, "read_file", "{}"),
        function_call(2, RECALL_TOOL, "{}"),
        message(3, "ok"),
    ]
    body = responses_stream(response(output))
    odd = [
        b": keep-alive\n\n",
        b"event: response.output_text.delta\ndata: {not json\n\n",
        b'event: ping\ndata: {"type":"ping"}\n\n',
    ]
    future, gone = (
        b"event: response.future\ndata: "
        + orjson.dumps({"type": "response.future", "output_index": i, "sequence_number": 7})
        + b"\n\n"
        for i in (2, 1)
    )
    cut = body.index(b"event: response.completed")
    body = body[:cut] + b"".join(odd) + future + gone + body[cut:] + b"data: [DONE]\n\ndata: {"
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    for piece in odd:
        assert piece in stripped
    assert stripped.endswith(b"data: [DONE]\n\ndata: {")
    assert b'{"type":"response.future","output_index":1,"sequence_number":' in stripped  # shifted
    assert stripped.count(b"response.future") == 2  # the event of the dropped call went
    assert RECALL_TOOL.encode() not in stripped


# --------------------------------------------------------------------------- properties


def items() -> st.SearchStrategy[list[dict[str, Any]]]:
    kinds = st.sampled_from(["reasoning", "message", "read_file", RECALL_TOOL, "grep", "web"])
    return st.lists(kinds, min_size=1, max_size=7).flatmap(
        lambda names: st.tuples(*(_item(n, name) for n, name in enumerate(names, 1))).map(list)
    )


def _item(n: int, name: str) -> st.SearchStrategy[dict[str, Any]]:
    if name == "reasoning":
        return st.just(reasoning(n))
    if name == "message":
        return st.text(min_size=1, max_size=20).map(lambda text: message(n, text))
    if name == "web":
        return st.just(web_search(n))
    arguments = st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=3)
    return arguments.map(lambda a: function_call(n, name, orjson.dumps(a).decode()))


@settings(max_examples=60, deadline=None)
@given(items(), st.lists(st.integers(0, 30), max_size=30))
def test_any_output_and_split_reads_and_strips_to_the_clients_items(
    output: list[dict[str, Any]], cuts: list[int]
) -> None:
    pieces: dict[int, list[str]] = {}
    for index, item in enumerate(output):
        if item["type"] == "function_call":
            text = item["arguments"]
            points = sorted({min(c, len(text)) for c in cuts[index::3]})
            pieces[index] = [
                text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)
            ]
    body = responses_stream(response(output), pieces)
    recall = [i for i in output if i["type"] == "function_call" and i["name"] == RECALL_TOOL]
    turn = WIRE.read(body, stream=True, name=RECALL_TOOL)
    if not recall:
        assert turn is None
    else:
        assert turn is not None
        assert turn.calls == tuple(RecallCall(i["call_id"], i["arguments"]) for i in recall)
        assert turn.assistant == tuple(output)
    stripped = WIRE.strip(body, stream=True, name=RECALL_TOOL)
    expected = orjson.loads(
        WIRE.strip(orjson.dumps(response(output)), stream=False, name=RECALL_TOOL)
    )
    final = sdk_final(stripped)
    assert ids(final.output) == ids(expected["output"])
    assert [i for i in expected["output"] if i["type"] == "function_call"] == [
        {k: v for k, v in i.to_dict().items() if k != "parsed_arguments"}
        for i in final.output
        if i.type == "function_call"
    ]
    kept = [i for i in output if not (i["type"] == "function_call" and i["name"] == RECALL_TOOL)]
    assert [i["id"] for i in kept if i["type"] != "reasoning"] == [
        i for i in ids(expected["output"]) if not i.startswith("rs_")
    ]
    assert RECALL_TOOL.encode() not in stripped
    check_numbering(stripped)


# --------------------------------------------------------------------------- continuation


def test_the_continuation_appends_the_output_and_one_output_item_per_answer() -> None:
    turn = WIRE.read(orjson.dumps(response(MIXED_OUTPUT)), stream=False, name=RECALL_TOOL)
    assert turn is not None
    answers = [RecallAnswer("call_0003", "[recall id rq72amlvh4xxa: tool read_file]\nBUILD OK")]
    assert WIRE.continuation(BODY, turn, answers) == {
        "input": [
            *BODY["input"],
            *MIXED_OUTPUT,
            {"type": "function_call_output", "call_id": "call_0003", "output": answers[0].text},
        ]
    }


def test_a_string_input_becomes_its_user_message_first() -> None:
    turn = RecallTurn((RecallCall("call_1", "{}"),), 0, (function_call(1, RECALL_TOOL, "{}"),))
    members = WIRE.continuation(
        {"input": "hi", "tools": [READ_FILE]}, turn, [RecallAnswer("call_1", "x")]
    )
    assert members["input"][0] == {"role": "user", "content": "hi"}
    assert members["input"][1:] == [
        turn.assistant[0],
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
    ]


def test_unstored_reasoning_without_its_encrypted_content_is_left_out() -> None:
    output = (reasoning(1, encrypted=False), function_call(2, RECALL_TOOL, "{}"))
    turn = RecallTurn((RecallCall("call_0002", "{}"),), 0, output)
    answers = [RecallAnswer("call_0002", "x")]
    unstored = WIRE.continuation({**BODY, "store": False}, turn, answers)["input"]
    assert [i.get("id") for i in unstored[1:]] == ["fc_0002", None]
    stored = WIRE.continuation({**BODY, "store": True}, turn, answers)["input"]
    assert [i.get("id") for i in stored[1:]] == ["rs_0001", "fc_0002", None]
