"""The fake Responses upstream holds a client to the rules OpenAI's servers enforce.

The integration tests trust it to refuse what OpenAI would refuse (a call without its output,
reasoning cut from its item, a prompt over the window), so those refusals are checked here,
in process, along with the shapes of its replies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.upstream import detect_overflow
from tests.support.responses_upstream import create_app
from tests.support.sse import sse_data

TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(model_context_windows={"small": 300})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http:
        yield http


async def create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": "gpt-4o", **body})


async def test_a_tool_loop_round_trip(client: httpx.AsyncClient) -> None:
    items: list[Any] = [{"role": "user", "content": "please call tool read_file"}]
    first = await create(client, input=items, tools=TOOLS)
    assert first.status_code == 200, first.text
    output = first.json()["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call"]
    assert first.json()["usage"]["input_tokens"] > 0
    items += [
        *output,
        {"type": "function_call_output", "call_id": output[1]["call_id"], "output": "x"},
    ]
    second = await create(client, input=items, tools=TOOLS)
    assert second.status_code == 200, second.text
    text = second.json()["output"][-1]["content"][0]["text"]
    assert text == "echo tool results: x"


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (
            [
                {"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ],
            "No tool output found for function call c1",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"type": "function_call_output", "call_id": "c9", "output": "?"},
            ],
            "No tool call found for function_call_output with call_id c9",
        ),
    ],
)
async def test_pairing_is_enforced(client: httpx.AsyncClient, items: list[Any], words: str) -> None:
    response = await create(client, input=items)
    assert response.status_code == 400 and words in response.json()["error"]["message"]


async def test_reasoning_must_travel_with_its_item(client: httpx.AsyncClient) -> None:
    items: list[Any] = [{"role": "user", "content": "please call tool now"}]
    output = (await create(client, input=items, tools=TOOLS)).json()["output"]
    answer = {"type": "function_call_output", "call_id": output[1]["call_id"], "output": "x"}
    without = await create(client, input=[*items, output[1], answer], tools=TOOLS)
    assert without.status_code == 400
    assert "without its required 'reasoning' item" in without.json()["error"]["message"]
    cut = await create(client, input=[*items, output[0], {"role": "user", "content": "hm"}])
    assert cut.status_code == 400
    assert "without its required following item" in cut.json()["error"]["message"]


async def test_a_prompt_over_the_window_is_refused_as_openai_words_it(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/responses", json={"model": "small", "input": "word " * 400})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    overflow = detect_overflow(400, response.content)
    assert overflow is not None and overflow.family == "openai"


async def test_a_stream_is_the_typed_events(client: httpx.AsyncClient) -> None:
    response = await create(client, input="hello", stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert b"event: response.created\n" in response.content
    events = [orjson.loads(data) for data in sse_data(response.content)]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "echo: hello"
    assert events[-1]["response"]["usage"]["input_tokens"] > 0


# ------------------------------------------------------------------ the scripted model's recall

RECALL = {"type": "function", "name": "compaction_recall", "parameters": {"type": "object"}}


async def test_a_question_is_answered_from_the_prompt_or_by_a_recall_call(
    client: httpx.AsyncClient,
) -> None:
    seen: list[Any] = [
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "KEY-3 = VALUE-seen"},
        {"role": "user", "content": "QUESTION: what is KEY-3?"},
    ]
    shown = (await create(client, input=seen, tools=[*TOOLS, RECALL])).json()["output"]
    assert shown[-1]["content"][0]["text"] == "KEY-3 = VALUE-seen"
    items: list[Any] = [{"role": "user", "content": "QUESTION: what is KEY-3?"}]
    first = (await create(client, input=items, tools=[*TOOLS, RECALL])).json()["output"]
    assert [o["type"] for o in first] == ["reasoning", "function_call"]
    call = first[1]
    assert call["name"] == "compaction_recall" and orjson.loads(call["arguments"]) == {
        "query": "KEY-3"
    }
    # Not offered, or offered with tool_choice none: no call, the fact is not known.
    for extra in ({"tools": TOOLS}, {"tools": [*TOOLS, RECALL], "tool_choice": "none"}):
        reply = (await create(client, input=items, **extra)).json()["output"]
        assert reply[-1]["content"][0]["text"] == "KEY-3 is not in what I can see"
    answered = [
        *items,
        *first,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "KEY-3 = VALUE-x"},
    ]
    second = await create(client, input=answered, tools=[*TOOLS, RECALL])
    assert second.status_code == 200, second.text  # the reasoning travelled with its call
    assert second.json()["output"][-1]["content"][0]["text"] == "KEY-3 = VALUE-x"


async def test_a_mixed_recall_turn_streams_both_calls(client: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": "QUESTION: what is KEY-9? (mixed)"}]
    response = await create(client, input=items, tools=[*TOOLS, RECALL], stream=True)
    events = [orjson.loads(data) for data in sse_data(response.content)]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["type"], i.get("name")) for i in done] == [
        ("reasoning", None),
        ("function_call", "compaction_recall"),
        ("function_call", "read_file"),
    ]
    assert events[-1]["response"]["output"] == done


async def test_an_agent_loop_does_not_call_the_recall_tool(client: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": "please call tool read_file"}]
    output = (await create(client, input=items, tools=[*TOOLS, RECALL])).json()["output"]
    assert [o.get("name") for o in output] == [None, "read_file"]
