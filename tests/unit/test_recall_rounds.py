"""The recall loop's bounds (compaction_proxy/api/_recall.py) with an injected clock and
scripted replies: the time budget, the round cap, a model that ignores the closing round, and
a refused continuation. No server: ``post`` and ``deliver`` are the test's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import orjson

from compaction_proxy.api._recall import (
    LIMIT_TEXT,
    UNFIT_TEXT,
    Forwarded,
    RecallOffer,
    Rounds,
    settle,
)
from compaction_proxy.compaction import RecallSettings
from compaction_proxy.engine import Recallable
from compaction_proxy.upstream import HeldReply, Outcome
from compaction_proxy.wire import DEFAULT_FORMAT
from compaction_proxy.wire.recall import RecallAnswer, RecallCall

CHAT = DEFAULT_FORMAT
JSON = [(b"content-type", b"application/json")]
SENT = orjson.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "q [recall id rabcdefghijk]"}],
        "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
    }
)


def reply(*, recall: bool, own: bool = False, status: int = 200) -> HeldReply:
    calls = []
    if recall:
        calls.append(
            {
                "id": "call_r",
                "type": "function",
                "function": {"name": "compaction_recall", "arguments": '{"query": "x"}'},
            }
        )
    if own:
        calls.append(
            {
                "id": "call_o",
                "type": "function",
                "function": {"name": "read_file", "arguments": "{}"},
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else "done"}
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": "c",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12},
    }
    return HeldReply(status, JSON, orjson.dumps(body), None)


class Desk:
    def __init__(self) -> None:
        self.calls: list[tuple[str, frozenset[str], RecallCall]] = []
        self.limits: list[int] = []

    async def answer(
        self, namespace: str, allowed: frozenset[str], call: RecallCall, max_tokens: int
    ) -> Any:
        self.calls.append((namespace, allowed, call))
        self.limits.append(max_tokens)
        return SimpleNamespace(
            answer=RecallAnswer(call.call_id, "recalled text"), ids=1, tokens=7, unavailable=False
        )


class Script:
    """The upstream's replies to the hidden rounds, and what was posted and delivered."""

    def __init__(self, replies: list[HeldReply]) -> None:
        self.replies = replies
        self.posted: list[dict[str, Any]] = []
        self.delivered: list[HeldReply] = []
        self.relayed: list[dict[str, Any]] = []
        self.relay_headers: list[dict[bytes, bytes]] = []

    async def post(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> Outcome:
        self.posted.append(orjson.loads(body))
        held = self.replies.pop(0)
        return Outcome(held.status, held=held)

    async def deliver(self, held: HeldReply, headers: list[tuple[bytes, bytes]]) -> int:
        self.delivered.append(held)
        return len(held.body)

    async def relay(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> Outcome:
        self.relayed.append(orjson.loads(body))
        self.relay_headers.append(dict(headers))
        return Outcome(200, bytes_out=10, completed=True)


def clock(values: list[float]) -> Any:
    ticks: Iterator[float] = iter(values)
    last = [0.0]

    def now() -> float:
        last[0] = next(ticks, last[0])
        return last[0]

    return now


def run(
    script: Script, first: HeldReply, settings: RecallSettings, now: Any = None
) -> tuple[Outcome, Any, Desk]:
    desk = Desk()
    ctx: Any = SimpleNamespace(state=SimpleNamespace(recall_desk=desk))
    offer = RecallOffer(CHAT.recall, Recallable("ns", ("rzzzzzzzzzzz",)), settings)
    rounds = Rounds(script.post, script.deliver, script.relay, now or clock([0.0]))
    outcome, stats = asyncio.run(
        settle(ctx, CHAT, Forwarded(offer, SENT, (), (), None), Outcome(200, held=first), rounds)
    )
    return outcome, stats, desk


def _last_answer(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def test_the_time_budget_closes_the_first_round_without_reading_the_archive() -> None:
    script = Script([reply(recall=False)])
    settings = RecallSettings(enabled=True, time_budget=30)
    outcome, stats, desk = run(script, reply(recall=True), settings, clock([0.0, 31.0]))
    assert desk.calls == []
    assert [b.get("tool_choice") for b in script.posted] == ["none"]
    assert _last_answer(script.posted[0]) == LIMIT_TEXT
    assert stats.rounds == 1 and stats.limited and stats.calls == 0
    assert outcome.status == 200 and b"done" in script.delivered[0].body


def test_the_round_cap_then_one_closing_round() -> None:
    script = Script([reply(recall=True), reply(recall=True), reply(recall=False)])
    outcome, stats, desk = run(script, reply(recall=True), RecallSettings(max_rounds=2))
    assert len(desk.calls) == 2
    # Only the ids the conversation's index holds: never one because the request's text
    # names it (the client's message marks rabcdefghijk).
    assert desk.calls[0][1] == frozenset({"rzzzzzzzzzzz"})
    assert [b.get("tool_choice") for b in script.posted] == [None, None, "none"]
    assert stats.rounds == 3 and stats.calls == 2 and stats.tokens == 14 and stats.limited
    assert outcome.prompt_tokens == 11  # the first round's prompt, which the proxy counted


def test_a_model_that_ignores_the_closing_round_gets_no_more_rounds() -> None:
    # Round 1 answered; the model asks again: a closing round; it still asks: that is the end.
    script = Script([reply(recall=True), reply(recall=True)])
    _, stats, _ = run(script, reply(recall=True), RecallSettings(max_rounds=1))
    assert len(script.posted) == 2 and script.posted[-1]["tool_choice"] == "none"
    delivered = orjson.loads(script.delivered[0].body)
    assert "tool_calls" not in delivered["choices"][0]["message"]
    assert b"compaction_recall" not in script.delivered[0].body
    assert stats.rounds == 2


def test_a_refused_continuation_is_closed_once_with_a_note() -> None:
    script = Script([reply(recall=False, status=400), reply(recall=False)])
    outcome, stats, _ = run(script, reply(recall=True), RecallSettings())
    assert len(script.posted) == 2
    assert _last_answer(script.posted[0]) == "recalled text"
    assert _last_answer(script.posted[1]) == UNFIT_TEXT
    assert script.posted[1]["tool_choice"] == "none"
    assert stats.limited and stats.rounds == 2 and outcome.status == 200


def test_a_mixed_turn_is_delivered_without_our_call_and_no_round() -> None:
    script = Script([])
    outcome, stats, desk = run(script, reply(recall=True, own=True), RecallSettings())
    assert script.posted == [] and desk.calls == [] and outcome.status == 200
    delivered = orjson.loads(script.delivered[0].body)
    names = [c["function"]["name"] for c in delivered["choices"][0]["message"]["tool_calls"]]
    assert names == ["read_file"]
    assert stats.deferred == 1 and stats.rounds == 0


def test_a_failed_hidden_round_sends_the_request_again_without_recall() -> None:
    """A rate limit (or an unreachable upstream) on a hidden round: the client gets the
    answer to its request as it would have gone without recall, never that error."""
    for failure in (reply(recall=False, status=429), reply(recall=False, status=502)):
        script = Script([failure])
        outcome, stats, _ = run(script, reply(recall=True), RecallSettings())
        assert script.delivered == [] and len(script.relayed) == 1
        again = script.relayed[0]
        assert [t["function"]["name"] for t in again["tools"]] == ["read_file"]
        assert again["messages"] == orjson.loads(SENT)["messages"]
        assert stats.fallback and b"fallback" in script.relay_headers[0][b"x-compaction-recall"]
        assert outcome.status == 200 and outcome.prompt_tokens == 11


def test_a_refused_closing_round_falls_back_too() -> None:
    script = Script([reply(recall=False, status=400), reply(recall=False, status=400)])
    _, stats, _ = run(script, reply(recall=True), RecallSettings())
    assert len(script.posted) == 2 and len(script.relayed) == 1
    assert stats.fallback and stats.limited


def test_a_round_answers_a_few_calls_sharing_one_budget() -> None:
    calls = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "compaction_recall", "arguments": '{"query": "x"}'},
        }
        for n in range(6)
    ]
    body = orjson.loads(reply(recall=True).body)
    body["choices"][0]["message"]["tool_calls"] = calls
    first = HeldReply(200, JSON, orjson.dumps(body), None)
    script = Script([reply(recall=False)])
    window: Any = SimpleNamespace(tokens=16_000)
    desk = Desk()
    ctx: Any = SimpleNamespace(state=SimpleNamespace(recall_desk=desk))
    offer = RecallOffer(CHAT.recall, Recallable("ns", ()), RecallSettings(max_tokens=4000))
    rounds = Rounds(script.post, script.deliver, script.relay, clock([0.0]))
    forwarded = Forwarded(offer, SENT, (), (), window)
    asyncio.run(settle(ctx, CHAT, forwarded, Outcome(200, held=first), rounds))
    assert len(desk.calls) == 4  # MAX_CALLS
    assert desk.limits == [1000] * 4  # a quarter of the 16k window, shared by the four
    results = [m for m in script.posted[0]["messages"] if m["role"] == "tool"]
    assert len(results) == 6
    assert sum("Too many recall calls" in m["content"] for m in results) == 2
    # In the turn's order: the four answered, then the two told to ask for fewer.
    assert [m["tool_call_id"] for m in results] == [f"call_{n}" for n in range(6)]
