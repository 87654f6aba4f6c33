"""The recall loop's edges through real processes (docs/recall.md): recall by id, a mixed turn,
the round cap, a client tool of the proxy's name, a request without tools, and an archive
store that goes down mid-session (recall degrades to "not available"; the request succeeds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.recall_policy import MARK, planted
from tests.support.agent_loop import SYSTEM, TASK
from tests.support.agent_session import CHAT, TOOLS, is_summarizer_text, tool_output
from tests.support.in_thread import InThreadServers
from tests.support.redis_server import RedisServer
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry

WINDOW = 8_000
MODEL = "agent-8k"
STEPS = 50
FACT_STEP = 3


def loop_config(upstream: UpstreamControl, store: dict[str, Any], **recall: Any) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 500}},
        store=store,
        summarization={
            "enabled": True,
            "maxSummaryTokens": 400,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
        # What recall alone brings back: the ledger (on in the default pipeline) would keep the
        # planted facts in view (tests/compaction/test_ledger_pipeline.py).
        compaction={
            "ledger": {"enabled": False},
            "recall": {"enabled": True, "max_rounds": 2, **recall},
        },
    )


def build_conversation() -> tuple[list[dict[str, Any]], str, str]:
    conversation: list[dict[str, Any]] = [SYSTEM, TASK]
    key, value = planted(FACT_STEP)
    for index in range(STEPS):
        call_id = f"call_{index}"
        conversation.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"src/m{index}.py"}),
                        },
                    }
                ],
            }
        )
        content = tool_output(index, 0, 1_200 if index % 2 == 0 else 150)
        if index == FACT_STEP:
            content = f"config says {key} = {value}\n{content}"
        conversation.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return conversation, key, value


def play(client: openai.OpenAI, upstream: UpstreamControl) -> list[dict[str, Any]]:
    """The session's steps one request at a time (so compaction happens as in an agent)."""
    conversation, _, _ = build_conversation()
    for end in range(4, len(conversation) + 1, 2):
        client.chat.completions.create(model=MODEL, messages=conversation[:end], tools=TOOLS)
    upstream.clear()
    return conversation


def forwarded(upstream: UpstreamControl) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.take(CHAT) if not is_summarizer_text(r.text)]


@pytest.fixture(scope="module")
def upstream(in_thread: InThreadServers) -> UpstreamControl:
    """The loop needs only HTTP: the fake and the proxies run in this process
    (tests/support/in_thread.py); the outage below stops a real redis-server."""
    return in_thread.upstream(WINDOW)


@pytest.fixture(scope="module")
def played(
    upstream: UpstreamControl, in_thread: InThreadServers, tmp_path_factory: pytest.TempPathFactory
) -> tuple[openai.OpenAI, list[dict[str, Any]]]:
    db: Path = tmp_path_factory.mktemp("recall-loop") / "checkpoints.db"
    proxy = in_thread.proxy(loop_config(upstream, {"backend": "sqlite", "path": str(db)}))
    client = proxy.openai_client()
    return client, play(client, upstream)


def ask(
    client: openai.OpenAI, conversation: list[dict[str, Any]], question: str, **extra: Any
) -> tuple[Any, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[*conversation, {"role": "user", "content": question}],
        **{"tools": TOOLS, **extra},
    )
    return raw, raw.parse()


def test_recall_by_the_ids_the_marks_name(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    client, conversation = played
    key, value = planted(FACT_STEP)
    raw, completion = ask(client, conversation, f"QUESTION: what is {key}? (by id)")
    assert completion.choices[0].message.content == f"{key} = {value}"
    assert completion.choices[0].message.tool_calls is None
    header = raw.headers["x-compaction-recall"]
    assert header.startswith("rounds=") and "rounds=0" not in header
    rounds = forwarded(upstream)
    # The first round was offered the tool; the model called it with ids its prompt named.
    first_call = rounds[1]["messages"][-2]
    assert first_call["tool_calls"][0]["function"]["name"] == "compaction_recall"
    ids = json.loads(first_call["tool_calls"][0]["function"]["arguments"])["ids"]
    assert ids and all(i[0] in "rs" and len(i) == 12 for i in ids)
    answer = rounds[1]["messages"][-1]
    assert answer["role"] == "tool" and f"{key} = {value}" in answer["content"]


def test_a_mixed_turn_gives_the_client_only_its_own_call(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    client, conversation = played
    key, _ = planted(FACT_STEP)
    raw, completion = ask(client, conversation, f"QUESTION: what is {key}? (mixed)")
    message = completion.choices[0].message
    names = [c.function.name for c in message.tool_calls or ()]
    assert names == ["read_file"]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert "deferred=1" in raw.headers["x-compaction-recall"]
    assert len(forwarded(upstream)) == 1  # no hidden round: the recall waits for the next turn


def test_the_round_cap_ends_a_model_that_never_stops_recalling(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    client, conversation = played
    key, _ = planted(FACT_STEP)
    raw, completion = ask(client, conversation, f"QUESTION: what is {key}? (forever)")
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content  # an answer, not a call
    header = raw.headers["x-compaction-recall"]
    assert "rounds=3" in header and "limited" in header  # 2 answered + 1 closing round
    rounds = forwarded(upstream)
    assert len(rounds) == 4
    assert rounds[-1]["tool_choice"] == "none"
    assert all("tool_choice" not in r for r in rounds[:-1])


def test_a_request_without_tools_is_not_offered_recall(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    client, conversation = played
    key, _ = planted(FACT_STEP)
    plain = [m for m in conversation if m["role"] in ("system", "user")]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[*plain, {"role": "user", "content": f"QUESTION: what is {key}?"}]
    )
    assert "x-compaction-recall" not in raw.headers
    assert all("tools" not in r for r in forwarded(upstream))


def test_a_client_tool_of_the_proxys_name_is_refused(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    client, conversation = played
    own = {
        "type": "function",
        "function": {"name": "compaction_recall", "parameters": {"type": "object"}},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=conversation, tools=[*TOOLS, own])
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "tools" and error["code"] == "tool_name_reserved"
    assert "compaction_recall" in error["message"]
    assert forwarded(upstream) == []


def test_an_archive_store_outage_degrades_recall_not_the_request(
    upstream: UpstreamControl, in_thread: InThreadServers, own_redis: RedisServer
) -> None:
    proxy = in_thread.proxy(loop_config(upstream, {"backend": "redis", "url": own_redis.url}))
    client = proxy.openai_client()
    conversation = play(client, upstream)
    key, _ = planted(FACT_STEP)
    own_redis.stop()
    raw, completion = ask(client, conversation, f"QUESTION: what is {key}?")
    assert raw.status_code == 200
    assert completion.choices[0].message.content == f"{key} is not in what I can see"
    assert "unavailable" in raw.headers["x-compaction-recall"]
    rounds = forwarded(upstream)
    assert "not available" in rounds[-1]["messages"][-1]["content"]


def test_another_conversations_ids_are_not_recalled_even_under_one_key(
    played: tuple[openai.OpenAI, list[dict[str, Any]]], upstream: UpstreamControl
) -> None:
    """Conversation A's archive is the tenant's (the people's endpoint reads it with the same
    key), but a model in conversation B cannot recall A's ids: they are not in B's index."""
    client, conversation = played
    key, value = planted(FACT_STEP)
    ask(client, conversation, "no question")  # one more request of A: its forwarded marks
    marks = [m for r in forwarded(upstream) for m in MARK.findall(json.dumps(r))]
    assert marks
    # B: another task, tool results of its own (so its ids are its own), long enough to be
    # compacted, and so offered the tool, on this one request.
    other: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Another task: B."}]
    for message in conversation[2:]:
        if message["role"] == "tool":
            message = {**message, "content": "B " + message["content"].replace(value, "gone")}
        other.append(message)
    raw, completion = ask(client, other, f"QUESTION: what is {key}? (ids: {','.join(marks)})")
    assert completion.choices[0].message.content == f"{key} is not in what I can see"
    assert "rounds=1" in raw.headers["x-compaction-recall"]
    rounds = forwarded(upstream)
    assert "compaction_recall" in json.dumps(rounds[0]["tools"])  # B was offered the tool
    answer = rounds[-1]["messages"][-1]
    assert answer["role"] == "tool" and "no archived content" in answer["content"]
    assert value not in json.dumps(rounds)
    # The same key reads what A archived through the people's endpoint.
    original = marks[0]
    got = client.get(
        f"/compaction/archive/{original}",
        cast_to=httpx.Response,
        options={"headers": {"authorization": f"Bearer {client.api_key}"}},
    )
    assert got.status_code == 200 and got.json()["id"] == original
    assert got.json()["kind"] == ("span" if original.startswith("s") else "original")
