"""Nothing compacted is lost for good: a 200-step agent session that asks, at its end, for facts
its tool results showed long before (issue 22; docs/recall.md).

Real processes: the proxy, the fake upstream (window enforced, summarizer played, and a
scripted model that calls ``compaction_recall`` when a fact it is asked for is not in its
prompt: tests/fakes/recall_policy.py), the official ``openai`` SDK. A fact counts only when the
model's final answer holds its value. The same session with recall off loses the facts that
compaction folded away: the summarizer stand-in keeps none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fakes.recall_policy import planted
from tests.support.agent_loop import SYSTEM, TASK
from tests.support.agent_session import (
    CHAT,
    TOOLS,
    assert_valid_pairing,
    is_summarizer_text,
    tool_output,
)
from tests.support.in_thread import InThreadServers
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry

WINDOW = 16_000
MODEL = "agent-16k"
STEPS = 200
FACT_EVERY = 20  # a fact in the result of steps 3, 23, 43, ...


def session_config(upstream: UpstreamControl, db: Path, recall: bool) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(db)},
        summarization={
            "enabled": True,
            "maxSummaryTokens": 600,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
        # What recall alone brings back: the ledger (on in the default pipeline) would keep the
        # planted facts in view (tests/compaction/test_ledger_pipeline.py).
        compaction={
            "ledger": {"enabled": False},
            "recall": {"enabled": recall, "max_rounds": 3, "max_tokens": 2_000},
        },
    )


@dataclass
class Session:
    conversation: list[dict[str, Any]]
    keys: list[tuple[str, str]] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)
    recall_headers: dict[str, str] = field(default_factory=dict)
    streamed: set[str] = field(default_factory=set)
    hidden_leaks: list[str] = field(default_factory=list)
    forwarded: list[dict[str, Any]] = field(default_factory=list)


def _step(conversation: list[dict[str, Any]], index: int, keys: list[tuple[str, str]]) -> None:
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
                        "arguments": json.dumps({"path": f"src/mod_{index}.py"}),
                    },
                }
            ],
        }
    )
    content = tool_output(index, 0, 1_200 if index % 2 == 0 else 150)
    if index % FACT_EVERY == 3:
        key, value = planted(index)
        keys.append((key, value))
        content = f"config says {key} = {value}\n{content}"
    conversation.append({"role": "tool", "tool_call_id": call_id, "content": content})


def run_session(client: openai.OpenAI, upstream: UpstreamControl) -> Session:
    """200 tool steps, then one question per planted fact (every other one streamed)."""
    session = Session([SYSTEM, TASK])
    upstream.clear()
    for index in range(STEPS):
        create_raw(client, model=MODEL, messages=session.conversation, tools=TOOLS)
        upstream.take(CHAT)
        _step(session.conversation, index, session.keys)
    for number, (key, _value) in enumerate(session.keys):
        session.conversation.append({"role": "user", "content": f"QUESTION: what is {key}?"})
        if number % 2:
            text, header = _streamed(client, session)
            session.streamed.add(key)
        else:
            raw = create_raw(client, model=MODEL, messages=session.conversation, tools=TOOLS)
            completion = raw.parse()
            message = completion.choices[0].message
            for call in message.tool_calls or ():
                session.hidden_leaks.append(call.model_dump_json())
            text = message.content or ""
            header = raw.headers.get("x-compaction-recall", "")
        session.answers[key] = text
        session.recall_headers[key] = header
        session.forwarded.extend(
            r.json() for r in upstream.take(CHAT) if not is_summarizer_text(r.text)
        )
        session.conversation.append({"role": "assistant", "content": text})
    return session


def _streamed(client: openai.OpenAI, session: Session) -> tuple[str, str]:
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=session.conversation, tools=TOOLS, stream=True
    ) as response:
        header = response.headers.get("x-compaction-recall", "")
        parts: list[str] = []
        for chunk in response.parse():
            for choice in chunk.choices:
                if choice.delta.tool_calls:
                    session.hidden_leaks.extend(
                        str(c.function.name if c.function else "") for c in choice.delta.tool_calls
                    )
                if choice.delta.content:
                    parts.append(choice.delta.content)
    return "".join(parts), header


@pytest.fixture(scope="module")
def session_upstream(in_thread: InThreadServers) -> UpstreamControl:
    return in_thread.upstream(WINDOW)


@pytest.fixture(scope="module")
def sessions(
    session_upstream: UpstreamControl,
    in_thread: InThreadServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[bool, Session]:
    out: dict[bool, Session] = {}
    for recall in (True, False):
        db = tmp_path_factory.mktemp(f"recall-{recall}") / "checkpoints.db"
        proxy = in_thread.proxy(session_config(session_upstream, db, recall))
        out[recall] = run_session(proxy.openai_client(), session_upstream)
    return out


def _known(session: Session, key: str, value: str) -> bool:
    return f"{key} = {value}" in session.answers[key]


def test_every_planted_fact_is_answered_from_the_archive(sessions: dict[bool, Session]) -> None:
    session = sessions[True]
    assert len(session.keys) == STEPS // FACT_EVERY
    missed = [key for key, value in session.keys if not _known(session, key, value)]
    assert missed == [], session.answers
    recalled = [k for k, h in session.recall_headers.items() if h and "rounds=0" not in h]
    # The early facts were folded away long ago: those answers needed a hidden round.
    assert len(recalled) >= len(session.keys) // 2, session.recall_headers
    assert {k for k in recalled if k in session.streamed}, "no streamed answer used recall"


def test_the_same_session_without_recall_loses_the_facts(sessions: dict[bool, Session]) -> None:
    on, off = sessions[True], sessions[False]
    lost = [key for key, value in off.keys if not _known(off, key, value)]
    recalled = {k for k, h in on.recall_headers.items() if h and "rounds=0" not in h}
    assert len(lost) >= len(off.keys) // 2, off.answers
    # Every fact lost without recall came back with it, and most through a hidden round (the
    # recall tool and the marks take budget too, so the two sessions fold slightly apart).
    assert all(_known(on, key, value) for key, value in on.keys if key in lost)
    assert len(recalled & set(lost)) >= len(lost) - 1, (recalled, lost)
    assert all(h == "" for h in off.recall_headers.values())


def test_the_recall_step_is_hidden_from_the_client(sessions: dict[bool, Session]) -> None:
    session = sessions[True]
    assert session.hidden_leaks == []
    for key, header in session.recall_headers.items():
        if header and "rounds=0" not in header:
            assert "calls=" in header and "tokens=" in header, (key, header)
    # The client's conversation holds only its own turns: no recall call, no recall result.
    assert not any("compaction_recall" in json.dumps(m) for m in session.conversation), (
        "a hidden step reached the client's history"
    )


def test_forwarded_rounds_keep_the_pairs_and_the_tool(sessions: dict[bool, Session]) -> None:
    session = sessions[True]
    rounds = [f for f in session.forwarded if "messages" in f and "tools" in f]
    assert rounds
    for body in rounds:
        names = [t["function"]["name"] for t in body["tools"]]
        assert names[: len(TOOLS)] == [t["function"]["name"] for t in TOOLS]
        assert names[-1] == "compaction_recall"
        assert_valid_pairing(body["messages"])
