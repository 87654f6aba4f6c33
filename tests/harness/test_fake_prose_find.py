"""The fake upstream's prose summarizer and its FIND probe, in process (no proxy).

The ledger tests (tests/integration/test_ledger_loop.py) lean on both: a summary that copies
no exact string, and a model that says whether an exact string is in its prompt or recall
finds it.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from tests.fakes.upstream import PROSE_SUMMARY, create_app
from tests.support.artifact_loop import make_step

RECALL = {"type": "function", "function": {"name": "compaction_recall", "parameters": {}}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {}}}


async def _chat(client: httpx.AsyncClient, messages: list[Any], **extra: Any) -> dict[str, Any]:
    reply = await client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, **extra}
    )
    assert reply.status_code == 200, reply.text
    message: dict[str, Any] = reply.json()["choices"][0]["message"]
    return message


async def test_the_prose_summary_copies_no_exact_string_it_was_shown() -> None:
    step = make_step(7)
    transcript = "<conversation>\n" + step.result + "\n</conversation>"
    app = create_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
        assert (await c.post("/_control", json={"summarizer": "prose"})).is_success
        summary = (await _chat(c, [{"role": "user", "content": transcript}]))["content"]
        plain = await _chat(c, [{"role": "user", "content": "hello"}])
    assert summary == PROSE_SUMMARY
    assert [s for s in step.strings.values() if s in summary] == []
    assert "## Goal" in summary and "## Next Steps" in summary
    assert plain["content"] == "echo: hello"  # only summary calls are answered in prose


async def test_find_answers_from_the_prompt_else_recalls_by_query() -> None:
    wanted = "src/native/auth_007.c"
    ask = {"role": "user", "content": f"FIND: {wanted}"}
    app = create_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
        shown = await _chat(c, [{"role": "user", "content": f"see {wanted}"}, ask])
        offline = await _chat(c, [ask], tools=[BASH])
        called = await _chat(c, [ask], tools=[BASH, RECALL])
        call = called["tool_calls"][0]
        turn = {"role": "assistant", "content": None, "tool_calls": [call]}

        def answer(text: str) -> dict[str, Any]:
            return {"role": "tool", "tool_call_id": call["id"], "content": text}

        found = await _chat(c, [ask, turn, answer(f"[recall id r1]\n{wanted}:3: error")])
        lost = await _chat(c, [ask, turn, answer("no archived content")])
    assert shown["content"] == f"IN PROMPT: {wanted}"
    assert offline["content"] == f"NOT FOUND: {wanted}"
    assert call["function"]["name"] == "compaction_recall"
    assert orjson.loads(call["function"]["arguments"]) == {"query": wanted}
    assert found["content"] == f"RECALLED: {wanted}"
    assert lost["content"] == f"NOT FOUND: {wanted}"
