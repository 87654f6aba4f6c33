"""Recall on the Responses API: a stateless agent session whose early tool outputs are compacted
away, then asked for facts those outputs showed (issue 22; docs/recall.md).

Real processes: the proxy, the fake Responses upstream (tests/support/responses_upstream.py:
the window, call/output pairing and reasoning attachment enforced as OpenAI enforces them,
the summarizer played on chat completions, and the scripted model of
tests/fakes/recall_policy.py, which calls ``compaction_recall`` when a fact it is asked for is
not in its input), and the official ``openai`` SDK, JSON and typed SSE events. The agent is
Codex-like: ``store: false``, the whole input re-sent each step, the model's reasoning and
parallel calls sent back as it gave them. A fact counts only when the answer holds its value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from tests.fakes import upstream as base
from tests.fakes.recall_policy import planted
from tests.support.agent_session import tool_output
from tests.support.responses_upstream import (
    RESPONSES,
    ResponsesUpstreamServer,
    count_input,
    input_items,
)
from tests.support.sdk_chat import post_raw
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

WINDOW = 8_000
MODEL = "agent-8k"
STEPS = 36
FACT_EVERY = 8  # a fact in the first output of steps 3, 11, 19, 27, 35
MAX_ROUNDS = 2
MAX_TOKENS = 700  # an answer's most: two of them still fit the window beside the prompt
RECALL_TOOL = "compaction_recall"
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file from the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "type": "function",
        "name": "grep",
        "description": "Search the repository",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
]
TASK = {
    "role": "user",
    "content": "call tool after tool (keep calling tools) until the parser tests pass. FACT-TASK.",
}
ROUNDS = re.compile(r"rounds=(\d+)")


def rounds_of(header: str) -> int:
    """The hidden rounds an ``X-Compaction-Recall`` header counts (0 without one)."""
    found = ROUNDS.search(header)
    return int(found.group(1)) if found else 0


def config(upstream: ResponsesUpstreamServer, db: Path, recall: bool) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 500}},
        store={"backend": "sqlite", "path": str(db)},
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
            "recall": {"enabled": recall, "max_rounds": MAX_ROUNDS, "max_tokens": MAX_TOKENS},
        },
    )


@dataclass
class Answer:
    """One question's outcome: what the client got, and what went upstream for it."""

    text: str
    header: str
    streamed: bool
    first_round: str  # the first forwarded request's input, as JSON text
    rounds: list[dict[str, Any]]  # every forwarded request of the question
    leaks: list[str]  # anything of the hidden step the client's SDK showed


@dataclass
class Session:
    items: list[dict[str, Any]] = field(default_factory=lambda: [dict(TASK)])
    steps: list[dict[str, Any]] = field(default_factory=list)  # the items before the questions
    keys: list[tuple[str, str]] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)

    def step(self, client: openai.OpenAI, n: int) -> None:
        response = post_raw(
            client, "/responses", Response, model=MODEL, input=self.items, tools=TOOLS, store=False
        ).parse()
        assert not _leaks_of(response), n
        self.items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        assert [c.name for c in calls] == ["read_file", "grep"], n
        for index, call in enumerate(calls):
            text = tool_output(n, index, 2_400 if index == 0 else 150)
            if n % FACT_EVERY == 3 and index == 0:
                key, value = planted(n)
                self.keys.append((key, value))
                text = f"config says {key} = {value}\n{text}"
            self.items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": text}
            )


def _leaks_of(value: Any) -> list[str]:
    """What of the hidden step an SDK object shows: a recall call, its output, the tool."""
    dumped = value.model_dump_json() if hasattr(value, "model_dump_json") else json.dumps(value)
    return [dumped] if RECALL_TOOL in dumped or "recall id" in dumped else []


def ask(
    client: openai.OpenAI,
    upstream: ResponsesUpstreamServer,
    items: list[dict[str, Any]],
    question: str,
    *,
    stream: bool,
) -> tuple[Answer, list[dict[str, Any]]]:
    """``items`` and the question, asked; the answer and the output items the client got."""
    asked = [*items, {"role": "user", "content": question}]
    leaks: list[str] = []
    if stream:
        with client.responses.with_streaming_response.create(
            model=MODEL, input=asked, tools=TOOLS, store=False, stream=True
        ) as raw:
            header = raw.headers.get("x-compaction-recall", "")
            events = list(raw.parse())
        for event in events:
            leaks += _leaks_of(event)
        assert events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [e.output_index for e in events if e.type == "response.output_item.done"] == list(
            range(len(done))
        )
        assert [i.model_dump() for i in done] == [i.model_dump() for i in response.output]
    else:
        raw_json = client.responses.with_raw_response.create(
            model=MODEL, input=asked, tools=TOOLS, store=False
        )
        header = raw_json.headers.get("x-compaction-recall", "")
        response = raw_json.parse()
        leaks += _leaks_of(raw_json.http_response.json())
    leaks += _leaks_of(response)
    assert [getattr(t, "name", None) for t in response.tools] == [t["name"] for t in TOOLS]
    rounds = [r.json() for r in upstream.take(RESPONSES)]
    assert rounds, "nothing was forwarded"
    text = response.output_text
    answer = Answer(text, header, stream, json.dumps(rounds[0]["input"]), rounds, leaks)
    return answer, [item.model_dump(exclude_none=True) for item in response.output]


def run(client: openai.OpenAI, upstream: ResponsesUpstreamServer) -> Session:
    """The agent's steps, then one question per planted fact, every other one streamed."""
    upstream.reset()
    upstream.control(model_context_windows={MODEL: WINDOW})
    session = Session()
    for n in range(STEPS):
        session.step(client, n)
    upstream.take()
    session.steps = list(session.items)
    for number, (key, _) in enumerate(session.keys):
        question = f"QUESTION: what is {key}?"
        answer, output = ask(client, upstream, session.items, question, stream=bool(number % 2))
        session.answers[key] = answer
        session.items += [{"role": "user", "content": question}, *output]
    return session


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponsesUpstreamServer]:
    server = ResponsesUpstreamServer(tmp_path_factory.mktemp("recall-responses") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxies(
    fake: ResponsesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[bool, ProxyServer]:
    out: dict[bool, ProxyServer] = {}
    for recall in (True, False):
        db = tmp_path_factory.mktemp(f"recall-responses-{recall}") / "checkpoints.db"
        out[recall] = module_proxy_factory(config(fake, db, recall))
    return out


@pytest.fixture(scope="module")
def sessions(
    fake: ResponsesUpstreamServer, proxies: dict[bool, ProxyServer]
) -> Iterator[dict[bool, Session]]:
    out: dict[bool, Session] = {}
    for recall, proxy in proxies.items():
        sdk = proxy.openai_client()
        try:
            out[recall] = run(sdk, fake)
        finally:
            sdk.close()
    yield out
    fake.reset()


@pytest.fixture
def client(proxies: dict[bool, ProxyServer], sessions: dict[bool, Session]) -> Iterator[Any]:
    sdk = proxies[True].openai_client()
    yield sdk
    sdk.close()


def folded(session: Session) -> list[str]:
    """The keys whose fact the first forwarded round of their question no longer showed."""
    return [k for k, v in session.keys if f"{k} = {v}" not in session.answers[k].first_round]


def known(session: Session, key: str, value: str) -> bool:
    return f"{key} = {value}" in session.answers[key].text


# ------------------------------------------------------------------ the session


def test_every_planted_fact_is_answered_with_recall_on(sessions: dict[bool, Session]) -> None:
    session = sessions[True]
    assert len(session.keys) == len(range(3, STEPS, FACT_EVERY))
    missed = [key for key, value in session.keys if not known(session, key, value)]
    assert missed == [], {k: a.text for k, a in session.answers.items()}
    gone = folded(session)
    assert len(gone) >= len(session.keys) // 2, "compaction folded too little to test recall"
    # Exactly the answers whose fact was folded away took a hidden round.
    recalled = [k for k, a in session.answers.items() if rounds_of(a.header) >= 1]
    assert recalled == gone, {k: a.header for k, a in session.answers.items()}
    assert any(session.answers[k].streamed for k in recalled), "no streamed answer used recall"
    assert any(not session.answers[k].streamed for k in recalled), "no JSON answer used recall"


def test_the_recall_is_hidden_from_the_client(sessions: dict[bool, Session]) -> None:
    session = sessions[True]
    for key, answer in session.answers.items():
        assert answer.leaks == [], key
        if rounds_of(answer.header):
            assert "calls=" in answer.header and "tokens=" in answer.header, answer.header
            # What went upstream: the offer, the model's call and the proxy's answer.
            first, last = answer.rounds[0], answer.rounds[-1]
            assert [t["name"] for t in first["tools"]] == [*(t["name"] for t in TOOLS), RECALL_TOOL]
            calls = [i for i in last["input"] if i.get("name") == RECALL_TOOL]
            assert calls and calls[0]["type"] == "function_call"
            outputs = [i for i in last["input"] if i.get("call_id") == calls[0]["call_id"]]
            assert outputs[-1]["type"] == "function_call_output"
            assert key in outputs[-1]["output"]
    # The client's own input holds only its turns: nothing of a hidden step came back in it.
    assert not any(RECALL_TOOL in json.dumps(item) for item in session.items)


def test_the_same_session_with_recall_off_loses_what_it_folded(
    sessions: dict[bool, Session],
) -> None:
    off = sessions[False]
    gone = folded(off)
    assert len(gone) >= len(off.keys) // 2, "compaction folded too little to test recall"
    for key, value in off.keys:
        assert known(off, key, value) == (key not in gone), off.answers[key].text
        assert off.answers[key].header == ""
        assert all(RECALL_TOOL not in json.dumps(r) for r in off.answers[key].rounds)
    # What recall brought back is what the session without it lost.
    assert set(folded(sessions[True])) <= set(gone)


# ------------------------------------------------------------------ a mixed turn, the cap


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_mixed_turn_gives_the_client_only_its_own_call(
    client: openai.OpenAI,
    fake: ResponsesUpstreamServer,
    sessions: dict[bool, Session],
    stream: bool,
) -> None:
    session = sessions[True]
    key, _ = session.keys[0]
    question = f"QUESTION: what is {key}? (mixed)"
    answer, output = ask(client, fake, session.steps, question, stream=stream)
    assert answer.leaks == []
    assert [(i["type"], i.get("name")) for i in output] == [
        ("reasoning", None),
        ("function_call", "read_file"),
    ]
    assert "deferred=1" in answer.header and rounds_of(answer.header) == 0
    assert len(answer.rounds) == 1  # no hidden round: the recall waits for the next request
    # The turn as the client got it goes back as OpenAI requires: the reasoning with its call.
    call = output[1]
    again = [
        *session.steps,
        {"role": "user", "content": question},
        *output,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "nothing there"},
    ]
    response = client.responses.create(model=MODEL, input=again, tools=TOOLS, store=False)
    assert response.status == "completed"
    fake.take()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_round_cap_ends_a_model_that_never_stops_recalling(
    client: openai.OpenAI,
    fake: ResponsesUpstreamServer,
    sessions: dict[bool, Session],
    stream: bool,
) -> None:
    session = sessions[True]
    key, value = session.keys[0]
    answer, output = ask(
        client, fake, session.steps, f"QUESTION: what is {key}? (forever)", stream=stream
    )
    assert answer.leaks == []
    assert [i["type"] for i in output] == ["reasoning", "message"]
    assert answer.text == f"{key} = {value}"  # from the rounds it was answered
    assert rounds_of(answer.header) == MAX_ROUNDS + 1 and "limited" in answer.header
    assert len(answer.rounds) == MAX_ROUNDS + 2
    assert answer.rounds[-1]["tool_choice"] == "none"
    assert all("tool_choice" not in r for r in answer.rounds[:-1])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_refused_continuation_closes_with_an_answer_and_no_trace(
    client: openai.OpenAI,
    fake: ResponsesUpstreamServer,
    sessions: dict[bool, Session],
    stream: bool,
) -> None:
    """The recalled text does not fit what the upstream takes (its window is smaller than
    the proxy was told): one closing round says so, and the client gets its answer with
    nothing of the hidden step, the recall tool in the response's echo of ``tools`` included."""
    session = sessions[True]
    key, _ = session.keys[0]
    question = f"QUESTION: what is {key}?"
    probe, _ = ask(client, fake, session.steps, question, stream=False)
    first = probe.rounds[0]
    size = count_input(base.TokenCounter(), first, input_items(first))
    fake.control(model_context_windows={MODEL: size + 200})  # a recall answer is not
    try:
        answer, output = ask(client, fake, session.steps, question, stream=stream)
    finally:
        fake.control(model_context_windows={MODEL: WINDOW})
    assert answer.leaks == []
    assert [i["type"] for i in output] == ["reasoning", "message"]
    assert answer.text == f"{key} is not in what I can see"
    assert rounds_of(answer.header) == 2 and "limited" in answer.header
    refused, closing = answer.rounds[1:]
    assert closing["tool_choice"] == "none" and "tool_choice" not in refused
    assert "did not fit" in closing["input"][-1]["output"]
