"""The Agent Framework's .NET pipeline, ported as written, through real processes.

The seed documents ``PipelineCompactionStrategy`` as "the pipeline's trigger is Always; each
child strategy evaluates its own trigger", gentlest first, and gives this pipeline::

    new ToolResultCompactionStrategy(CompactionTriggers.TokensExceed(0x200)),
    new SummarizationCompactionStrategy(summarizer, CompactionTriggers.TokensExceed(0x500)),
    new SlidingWindowCompactionStrategy(CompactionTriggers.TurnsExceed(4)),
    new TruncationCompactionStrategy(CompactionTriggers.TokensExceed(0x8000)));

A user ports it to the proxy's YAML entry for entry (hex literals and all) and runs a 30-turn
shopping chat on a 32k model (two lookups of a few dozen tokens a turn, and every sixth turn a
whole catalogue page of about 2,000 tokens): the proxy under ``serve``, the fake upstream
enforcing the window and playing the summarizer, the official openai SDK as the client.  Every
request's decision (``COMPACTION_DEBUG``) must show each child running exactly when its trigger
fires -- never skipped because an earlier one brought the request under the budget -- and once
the sliding window has fired, at most its 4 user turns plus the newest reach the model.

Pasted as written, the pipeline has neither of the proxy's own additions: it is read in the
Agent Framework's terms, so no user message of a dropped turn is carried beside the window
(``compaction.carry_user_messages``, compaction_proxy/compaction/carry.py) and no strategy's
work is undone for saving little (``compaction.min_saving``,
compaction_proxy/compaction/strategies/_support/churn.py); both belong to the default pipeline, and
an explicit one has them only where its block writes them (docs/configuration.md,
tests/compaction/test_compositions.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_session import CHAT, is_summarizer_text
from tests.support.servers import ProxyServer, UpstreamServer

WINDOW = 32_768
MODEL = "shop-32k"
TURNS = 30
SYSTEM = {"role": "system", "content": "You are a helpful shopping assistant."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    }
    for name, description in (
        ("LookupPrice", "The price of an item"),
        ("LookupStock", "How many of an item are in stock"),
    )
]
THRESHOLDS = {"tool_result_compaction": 0x200, "summarization": 0x500, "truncation": 0x8000}


def config_text(upstream: UpstreamServer, db: Path) -> str:
    """The proxy's config as a user writes it: the seed's pipeline with its own literals."""
    return f"""\
server: {{host: 127.0.0.1, port: 8080}}
upstreams:
  - {{name: fake, base_url: "{upstream.base_url}", api_key: "", models: ["*"]}}
models:
  {MODEL}: {{context_window: {WINDOW}, max_output_tokens: 2000}}
store: {{backend: sqlite, path: "{db}"}}
summarization: {{maxSummaryTokens: 1000, timeout: 10}}
compaction:
  pipeline:
    - {{strategy: tool_result_compaction, trigger: {{tokens_exceed: 0x200}}}}
    - {{strategy: summarization, trigger: {{tokens_exceed: 0x500}}}}
    - {{strategy: sliding_window, trigger: {{turns_exceed: 4}}}}
    - {{strategy: truncation, trigger: {{tokens_exceed: 0x8000}}}}
"""


def is_client_user(message: dict[str, Any]) -> bool:
    """One of the client's own user messages (a summary checkpoint is not one)."""
    return message.get("role") == "user" and str(message["content"]).startswith("turn ")


def user_turns(messages: list[dict[str, Any]]) -> list[str]:
    """The client's own user messages among ``messages``, turns and carried ones alike."""
    return [str(m["content"]) for m in messages if is_client_user(m)]


def split_turns(
    messages: list[dict[str, Any]],
) -> tuple[list[str], list[dict[str, Any]]]:
    """``(turns, carried)``: the user turns among ``messages`` -- a client user message with
    its replies (an assistant message or tool results right after it), and the newest user
    message, whose turn is running -- and the user messages that stand alone, carried verbatim
    while the rest of their turns went (not turns: compaction_proxy/compaction/carry.py)."""
    users = [i for i, m in enumerate(messages) if is_client_user(m)]
    turns: list[str] = []
    carried: list[dict[str, Any]] = []
    for i in users:
        after = messages[i + 1] if i + 1 < len(messages) else None
        if i == users[-1] or (after is not None and after.get("role") in ("assistant", "tool")):
            turns.append(str(messages[i]["content"]))
        else:
            carried.append(messages[i])
    return turns, carried


class Chat:
    """The shopping chat: per turn a question, the two lookups the model asks for one after
    the other (the price, then the stock), and the answer.

    ``agent``: three requests a turn, as an agent makes them around its tool calls (the seed
    registers the provider inside the tool-calling loop).  ``chat``: one request a turn, made
    once the turn's lookups are in the history (every request then brings a tool-call group
    to collapse, the case where stopping early skipped everything after the collapse).
    """

    def __init__(self, proxy: ProxyServer, upstream: UpstreamServer, mode: str) -> None:
        self.agent = mode == "agent"
        self.client = proxy.openai_client()
        self.upstream = upstream
        self.conversation: list[dict[str, Any]] = [SYSTEM]
        self.forwarded: list[list[dict[str, Any]]] = []
        self.newest_turn: list[int] = []
        self.strategies: list[str] = []
        self.summarizer_calls = 0

    def send(self, turn: int) -> str:
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=self.conversation, tools=TOOLS
        )
        completion = raw.parse()
        recorded = self.upstream.requests(CHAT)
        self.upstream.clear()
        self.summarizer_calls += sum(1 for r in recorded if is_summarizer_text(r.text))
        forwarded = [r.json() for r in recorded if not is_summarizer_text(r.text)]
        assert len(forwarded) == 1, f"{len(forwarded)} forwarded requests"
        self.forwarded.append(forwarded[0]["messages"])
        self.newest_turn.append(turn)
        self.strategies.append(raw.headers.get("x-compaction-strategies", ""))
        return completion.choices[0].message.content or ""

    def lookup(self, call_id: str, name: str, item: str, result: str) -> None:
        self.conversation.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps({"item": item})},
                    }
                ],
            }
        )
        self.conversation.append({"role": "tool", "tool_call_id": call_id, "content": result})

    def turn(self, index: int) -> None:
        item = f"item {index}"
        self.conversation.append(
            {"role": "user", "content": f"turn {index}: what's the price of {item}?"}
        )
        if self.agent:
            self.send(index)
        price = (
            f"{item}: {index * 3 + 7} USD (list price {index * 4 + 9} USD), sold by shop "
            f"{index % 4}, offer valid for {index % 7 + 2} days, free returns within 30 days."
        )
        if index % 6 == 5:  # now and then the lookup returns a whole catalogue page
            price += "".join(f" related item {index}-{n}: {n + 10} USD." for n in range(200))
        self.lookup(f"price_{index}", "LookupPrice", item, price)
        if self.agent:
            self.send(index)
        stock = (
            f"{item}: {index % 9} in stock at the main warehouse, {index % 5} at the store, "
            f"next delivery in {index % 3 + 1} days, reserved: {index % 2}."
        )
        self.lookup(f"stock_{index}", "LookupStock", item, stock)
        self.conversation.append({"role": "assistant", "content": self.send(index)})


@pytest.fixture(scope="module")
def upstream(upstream_factory_module: Any) -> UpstreamServer:
    server: UpstreamServer = upstream_factory_module(WINDOW)
    return server


@pytest.fixture(scope="module", params=["agent", "chat"])
def session(
    request: pytest.FixtureRequest,
    upstream: UpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Chat, list[dict[str, Any]]]:
    upstream.reset()
    db = tmp_path_factory.mktemp(f"dotnet-{request.param}") / "checkpoints.db"
    proxy: ProxyServer = module_proxy_factory(
        config_text(upstream, db), env={"COMPACTION_DEBUG": "true"}
    )
    offset = proxy.log_size()
    chat = Chat(proxy, upstream, request.param)
    for index in range(TURNS):
        chat.turn(index)
    lines = proxy.log_lines_since(offset)
    decisions = [
        entry
        for entry in (json.loads(line) for line in lines if line.startswith("{"))
        if entry.get("msg") == "compaction decision"
    ]
    return chat, decisions


def test_every_child_runs_as_its_trigger_says(session: tuple[Chat, list[dict[str, Any]]]) -> None:
    chat, decisions = session
    assert len(decisions) == len(chat.forwarded) == (3 if chat.agent else 1) * TURNS
    ran: dict[str, int] = {}
    for decision in decisions:
        report = decision["report"]
        children = report["strategies"]
        if children and children[0]["name"] == "checkpoint":
            children = children[1:]
        assert [c["name"] for c in children] == list(
            ("tool_result_compaction", "summarization", "sliding_window", "truncation")
        ), children
        for child in children:
            assert child.get("skipped") in (None, "trigger"), child  # never an early stop
            limit = THRESHOLDS.get(child["name"])
            if limit is not None:  # a token trigger: fired exactly above its threshold
                # (a 10% margin: triggers compare the calibrated count)
                if child["tokens_before"] > 1.1 * limit:
                    assert child["fired"], child
                elif child["tokens_before"] < 0.9 * limit:
                    assert child.get("skipped") == "trigger", child
            ran[child["name"]] = ran.get(child["name"], 0) + bool(child["changed"])
    assert ran["tool_result_compaction"] > 0
    assert ran["summarization"] > 0 and chat.summarizer_calls >= ran["summarization"]
    assert ran["sliding_window"] > 0
    assert ran["truncation"] == 0  # 0x8000 tokens is more than a 32k model's budget
    assert any("summarization" in s.split(",") for s in chat.strategies)
    assert any("sliding_window" in s.split(",") for s in chat.strategies)


def test_only_the_last_four_turns_and_the_newest_reach_the_model_once_the_window_fired(
    session: tuple[Chat, list[dict[str, Any]]],
) -> None:
    """Counted as the window counts: real turns (a user message with its replies, and the
    newest); the user messages carried beside them are checked on their own below."""
    chat, decisions = session
    fired = next(
        (i for i, s in enumerate(chat.strategies) if "sliding_window" in s.split(",")), None
    )
    assert fired is not None, (
        f"the sliding window never fired: {len(user_turns(chat.forwarded[-1]))} user turns "
        "forwarded at the end"
    )
    assert fired < len(chat.forwarded) // 2, "the sliding window fired late"
    for index, forwarded in enumerate(chat.forwarded[fired:], start=fired):
        turns, _ = split_turns(forwarded)
        assert len(turns) <= 5, (index, turns)
        newest = chat.newest_turn[index]
        assert turns[-1] == f"turn {newest}: what's the price of item {newest}?", index
    last = chat.forwarded[-1]
    turns, _ = split_turns(last)
    assert turns[-1] == f"turn {TURNS - 1}: what's the price of item {TURNS - 1}?"
    assert len(turns) <= 5
    assert str(last[1]["content"]).startswith("<summary>")  # the older turns, summarized
    assert len(decisions) == len(chat.forwarded)


def test_pasted_as_written_no_user_message_stays_beside_the_window(
    session: tuple[Chat, list[dict[str, Any]]],
) -> None:
    """The Agent Framework's window "keeps only the last 4 user turns": what it dropped of the
    user's own words is gone, as there (only the summary before the window speaks for them)."""
    chat, decisions = session
    for index, forwarded in enumerate(chat.forwarded):
        _, carried = split_turns(forwarded)
        assert carried == [], index
        report = decisions[index]["report"]
        assert not any("not applied" in n for c in report["strategies"] for n in c.get("notes", []))
    said = [str(m["content"]) for m in chat.conversation if is_client_user(m)]
    assert len(said) == TURNS
    forwarded = user_turns(chat.forwarded[-1])
    assert forwarded == said[-len(forwarded) :] and len(forwarded) <= 5
