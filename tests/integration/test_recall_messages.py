"""Recall on Anthropic's Messages API: a Claude Code-like tool loop whose early results are
compacted away, then asked for facts those results showed (issue 22; docs/recall.md).

Real processes: the proxy, the fake Messages upstream (tests/fakes/messages: the window, tool
pairing, signed thinking and, here, preserved thinking enforced, as on an account created
after 2026-08-31 on a model that binds each thinking block to its prefix; the upstream is
declared Anthropic's own API), and the official ``anthropic`` SDK, JSON and streams. The fake
plays the loop (``fake-loop:``, a Bash call a step, each reply opening with signed adaptive
thinking the client sends back) and the scripted model of tests/fakes/recall_policy.py, which
calls ``compaction_recall`` when a fact it is asked for is not in its prompt.

The offer puts the recall tool in ``tools``, which is part of every signed block's prefix: the
upstream accepts the offered requests only because the proxy asks ``drop_block`` for them, and
keeps the hidden round's own thinking (made under the offered tools) when it comes back. A
fact counts only when the answer holds its value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message

from tests.fakes.messages.model import CHECKPOINT_MARKER, OWN_TOOL_ID, Loop
from tests.fakes.messages.signing import BINDING_BETA
from tests.fakes.recall_policy import planted
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer, anthropic_client
from tests.support.sdk_chat import post_raw
from tests.support.servers import ProxyServer, Recorded, proxy_config, upstream_entry

MODEL = "claude-opus-5-5"
WINDOW = 12_000
STEPS = 28
LOOP = Loop(steps=STEPS, lines=40)
FACT_EVERY = 8  # a fact in the result of steps 3, 11, 19, 27
MAX_TOKENS = 1_024
MAX_ROUNDS = 2
THINKING = {"type": "adaptive"}
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14"
DROP_BLOCK = {"prefix_mismatch_behavior": "drop_block"}
RECALL_TOOL = "compaction_recall"
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the working directory.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {
        "name": "Read",
        "description": "Read a file from the repository.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    },
]
TASK = f"{LOOP.directive()}\nRun the checks until they pass."
ROUNDS = re.compile(r"rounds=(\d+)")


def rounds_of(header: str) -> int:
    found = ROUNDS.search(header)
    return int(found.group(1)) if found else 0


def config(fake: MessagesUpstreamServer, db: Path, recall: bool) -> dict[str, Any]:
    native = upstream_entry(fake.url + "/v1", name="anthropic")
    native["context_management"] = "native"  # Anthropic's own API: the binding is asked
    return proxy_config(
        native,
        models={MODEL: {"context_window": WINDOW}},
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
            "recall": {"enabled": recall, "max_rounds": MAX_ROUNDS, "max_tokens": 1_500},
        },
    )


def is_request_round(recorded: Recorded) -> bool:
    """A request of the client's (or a hidden round of one), not a summary call."""
    text = recorded.text
    return (
        recorded.path == MESSAGES and CHECKPOINT_MARKER not in text and "<conversation>" not in text
    )


def bash_output(use: dict[str, Any], keys: list[tuple[str, str]]) -> str:
    """What the step's command prints, with a planted fact on every FACT_EVERY-th step."""
    match = OWN_TOOL_ID.match(use["id"])
    assert match is not None, use
    step = int(match.group(1))
    lines = "".join(
        f"step {step} line {n}: lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
        for n in range(1, LOOP.lines + 1)
    )
    if step % FACT_EVERY == 3:
        key, value = planted(step)
        keys.append((key, value))
        lines = f"config says {key} = {value}\n{lines}"
    return lines


def _leaks_of(value: Any) -> list[str]:
    """What of the hidden step an SDK object (or a JSON body) shows: a recall call or result,
    a recall id. The model's own thinking is left out: it may say what the model means to do
    (the fake's names the tool it calls next), and the proxy may not change a signed block."""
    data = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    shown = "\n".join(_strings(data))
    return [shown] if RECALL_TOOL in shown or "recall id" in shown else []


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        thought = value.get("type") in ("thinking", "thinking_delta")
        for key, item in value.items():
            if key == "thinking" or (thought and key == "snapshot"):
                continue
            yield from _strings(item)


@dataclass
class Reply:
    content: list[dict[str, Any]]  # the blocks as the client sends them back
    stop_reason: str | None
    header: str
    leaks: list[str]
    rounds: list[Recorded]  # what the fake received for this request (summary calls left out)


def send(
    client: anthropic.Anthropic,
    fake: MessagesUpstreamServer,
    messages: list[dict[str, Any]],
    *,
    stream: bool,
) -> Reply:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "thinking": THINKING,
        "tools": TOOLS,
        "messages": messages,
        "extra_headers": {"anthropic-beta": BETAS},
    }
    leaks: list[str] = []
    if stream:
        with client.messages.stream(**kwargs) as events:
            for event in events:
                leaks += _leaks_of(event)
            message = events.get_final_message()
            header = events.response.headers.get("x-compaction-recall", "")
    else:
        raw = post_raw(client, "/v1/messages", Message, **kwargs)
        message = raw.parse()
        header = raw.headers.get("x-compaction-recall", "")
        leaks += _leaks_of(raw.http_response.json())
    leaks += _leaks_of(message)
    content = [block.model_dump(exclude_none=True) for block in message.content]
    rounds = [r for r in fake.take() if is_request_round(r)]
    assert rounds, "nothing was forwarded"
    return Reply(content, message.stop_reason, header, leaks, rounds)


def text_of(content: list[dict[str, Any]]) -> str:
    return "".join(b["text"] for b in content if b["type"] == "text")


@dataclass
class Answer:
    text: str
    reply: Reply
    streamed: bool

    @property
    def first_round(self) -> str:
        return self.reply.rounds[0].text


@dataclass
class Session:
    messages: list[dict[str, Any]] = field(
        default_factory=lambda: [{"role": "user", "content": TASK}]
    )
    keys: list[tuple[str, str]] = field(default_factory=list)
    steps: list[Reply] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)  # the loop, before the questions
    answers: dict[str, Answer] = field(default_factory=dict)


def run(client: anthropic.Anthropic, fake: MessagesUpstreamServer) -> Session:
    """The loop to its end (JSON and streams alternating), then one question per fact."""
    fake.reset()
    fake.control(thinking_binding="enforce", model_context_windows={MODEL: WINDOW})
    session = Session()
    for n in range(STEPS + 1):
        reply = send(client, fake, session.messages, stream=bool(n % 2))
        session.steps.append(reply)
        session.messages.append({"role": "assistant", "content": reply.content})
        uses = [b for b in reply.content if b["type"] == "tool_use"]
        if not uses:
            break
        results = [
            {"type": "tool_result", "tool_use_id": u["id"], "content": bash_output(u, session.keys)}
            for u in uses
        ]
        session.messages.append({"role": "user", "content": results})
    assert text_of(session.steps[-1].content).startswith(f"fake-loop done: {STEPS} steps.")
    session.history = list(session.messages)
    for number, (key, _) in enumerate(session.keys):
        session.messages.append({"role": "user", "content": f"QUESTION: what is {key}?"})
        streamed = bool(number % 2)
        reply = send(client, fake, session.messages, stream=streamed)
        session.answers[key] = Answer(text_of(reply.content), reply, streamed)
        session.messages.append({"role": "assistant", "content": reply.content})
    return session


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("recall-messages") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxies(
    fake: MessagesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[bool, ProxyServer]:
    out: dict[bool, ProxyServer] = {}
    for recall in (True, False):
        db = tmp_path_factory.mktemp(f"recall-messages-{recall}") / "checkpoints.db"
        out[recall] = module_proxy_factory(config(fake, db, recall))
    return out


@dataclass
class Run:
    session: Session
    events: list[dict[str, Any]]  # the fake's: what it answered, refused, rejected


@pytest.fixture(scope="module")
def sessions(
    fake: MessagesUpstreamServer, proxies: dict[bool, ProxyServer]
) -> Iterator[dict[bool, Run]]:
    out: dict[bool, Run] = {}
    for recall, proxy in proxies.items():
        client = anthropic_client(proxy.url, "sk-ant-client")
        try:
            session = run(client, fake)
        finally:
            client.close()
        out[recall] = Run(session, fake.events())
    yield out
    fake.reset()


@pytest.fixture
def client(
    proxies: dict[bool, ProxyServer], fake: MessagesUpstreamServer, sessions: dict[bool, Run]
) -> Iterator[Any]:
    sdk = anthropic_client(proxies[True].url, "sk-ant-client")
    fake.control(thinking_binding="enforce", model_context_windows={MODEL: WINDOW})
    fake.clear()
    yield sdk
    sdk.close()


def folded(session: Session) -> list[str]:
    return [k for k, v in session.keys if f"{k} = {v}" not in session.answers[k].first_round]


def known(session: Session, key: str, value: str) -> bool:
    return f"{key} = {value}" in session.answers[key].text


def question(session: Session, text: str) -> list[dict[str, Any]]:
    """The loop's history and ``text`` (not the questions after it: their answers show the
    facts)."""
    return [*session.history, {"role": "user", "content": text}]


# ------------------------------------------------------------------ the session


def test_every_request_is_accepted_with_preserved_thinking_enforced(
    sessions: dict[bool, Run],
) -> None:
    for recall, run_ in sessions.items():
        bad = [e for e in run_.events if e["type"] in ("rejected", "refused")]
        assert bad == [], (recall, bad)
    session = sessions[True].session
    offered = [
        r.json()
        for reply in [*session.steps, *(a.reply for a in session.answers.values())]
        for r in reply.rounds
        if RECALL_TOOL in {t["name"] for t in r.json().get("tools", ())}
    ]
    assert offered, "the session was never offered the recall tool"
    for body in offered:
        assert [t["name"] for t in body["tools"]] == [*(t["name"] for t in TOOLS), RECALL_TOOL]
        signed = any(
            b.get("type") == "thinking"
            for m in body["messages"]
            if m["role"] == "assistant"
            for b in m["content"]
        )
        if signed:  # the offer changed every block's prefix: the binding that lets it pass
            assert body["thinking"] == {**THINKING, "block_binding": DROP_BLOCK}


def test_every_planted_fact_is_answered_with_recall_on(sessions: dict[bool, Run]) -> None:
    session = sessions[True].session
    assert len(session.keys) == len(range(3, STEPS + 1, FACT_EVERY))
    missed = [key for key, value in session.keys if not known(session, key, value)]
    assert missed == [], {k: a.text for k, a in session.answers.items()}
    gone = folded(session)
    assert len(gone) >= len(session.keys) // 2, "compaction folded too little to test recall"
    recalled = [k for k, a in session.answers.items() if rounds_of(a.reply.header) >= 1]
    assert recalled == gone, {k: a.reply.header for k, a in session.answers.items()}
    assert any(session.answers[k].streamed for k in recalled), "no streamed answer used recall"
    assert any(not session.answers[k].streamed for k in recalled), "no JSON answer used recall"


def test_the_recall_is_hidden_and_its_turn_goes_back_with_its_thinking(
    sessions: dict[bool, Run],
) -> None:
    session = sessions[True].session
    for reply in [*session.steps, *(a.reply for a in session.answers.values())]:
        assert reply.leaks == []
    for key, answer in session.answers.items():
        assert [b["type"] for b in answer.reply.content] == ["thinking", "text"], key
        if not rounds_of(answer.reply.header):
            continue
        last = answer.reply.rounds[-1]
        messages = last.json()["messages"]
        turn, results = messages[-2], messages[-1]
        # The round's thinking went back first: the fake checked its signature (a changed
        # text or prefix without drop_block is its 400) and accepted the round.
        assert turn["content"][0]["type"] == "thinking"
        uses = [b for b in turn["content"] if b["type"] == "tool_use"]
        assert [u["name"] for u in uses] == [RECALL_TOOL]
        assert [r["tool_use_id"] for r in results["content"]] == [uses[0]["id"]]
        assert key in json.dumps(results["content"])
        assert BINDING_BETA in last.headers["anthropic-beta"]
        assert last.json()["thinking"] == {**THINKING, "block_binding": DROP_BLOCK}
    assert not any(RECALL_TOOL in json.dumps(m) for m in session.messages)


def test_the_same_session_with_recall_off_loses_what_it_folded(sessions: dict[bool, Run]) -> None:
    off = sessions[False].session
    gone = folded(off)
    assert len(gone) >= len(off.keys) // 2, "compaction folded too little to test recall"
    for key, value in off.keys:
        assert known(off, key, value) == (key not in gone), off.answers[key].text
        assert off.answers[key].reply.header == ""
        assert all(RECALL_TOOL not in r.text for r in off.answers[key].reply.rounds)
    assert set(folded(sessions[True].session)) <= set(gone)


# ------------------------------------------------------------------ a mixed turn, the cap


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_mixed_turn_gives_the_client_only_its_own_call(
    client: anthropic.Anthropic,
    fake: MessagesUpstreamServer,
    sessions: dict[bool, Run],
    stream: bool,
) -> None:
    session = sessions[True].session
    key, _ = session.keys[0]
    asked = question(session, f"QUESTION: what is {key}? (mixed)")
    reply = send(client, fake, asked, stream=stream)
    assert reply.leaks == []
    assert [(b["type"], b.get("name")) for b in reply.content] == [
        ("thinking", None),
        ("tool_use", "Bash"),
    ]
    assert reply.stop_reason == "tool_use"
    assert "deferred=1" in reply.header and rounds_of(reply.header) == 0
    assert len(reply.rounds) == 1  # no hidden round: the recall waits for the next request
    # The turn as the client got it goes back, answered, and the API accepts it.
    use = reply.content[1]
    answered = [
        *asked,
        {"role": "assistant", "content": reply.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}],
        },
    ]
    again = send(client, fake, answered, stream=False)
    assert again.content[0]["type"] == "thinking"
    assert [e for e in fake.events() if e["type"] in ("rejected", "refused")] == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_round_cap_ends_a_model_that_never_stops_recalling(
    client: anthropic.Anthropic,
    fake: MessagesUpstreamServer,
    sessions: dict[bool, Run],
    stream: bool,
) -> None:
    session = sessions[True].session
    key, value = session.keys[0]
    reply = send(
        client, fake, question(session, f"QUESTION: what is {key}? (forever)"), stream=stream
    )
    assert reply.leaks == []
    assert [b["type"] for b in reply.content] == ["thinking", "text"]
    assert text_of(reply.content) == f"{key} = {value}"
    assert rounds_of(reply.header) == MAX_ROUNDS + 1 and "limited" in reply.header
    bodies = [r.json() for r in reply.rounds]
    assert len(bodies) == MAX_ROUNDS + 2
    assert bodies[-1]["tool_choice"] == {"type": "none"}
    assert all("tool_choice" not in b for b in bodies[:-1])
    assert [e for e in fake.events() if e["type"] in ("rejected", "refused")] == []
