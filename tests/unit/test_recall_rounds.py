"""The recall loop's bounds (compaction_proxy/api/_recall.py) with an injected clock and
scripted replies: the time budget, the round cap, a model that ignores the closing round, and
a refused continuation. No server: ``post`` and ``deliver`` are the test's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import orjson

from compaction_proxy.api._forward import HeldReply, Outcome
from compaction_proxy.api._recall import LIMIT_TEXT, UNFIT_TEXT, RecallOffer, Rounds, settle
from compaction_proxy.compaction import RecallSettings
from compaction_proxy.engine import Recallable
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

    async def answer(
        self, namespace: str, allowed: frozenset[str], call: RecallCall, max_tokens: int
    ) -> Any:
        self.calls.append((namespace, allowed, call))
        return SimpleNamespace(
            answer=RecallAnswer(call.call_id, "recalled text"), ids=1, tokens=7, unavailable=False
        )


class Script:
    """The upstream's replies to the hidden rounds, and what was posted and delivered."""

    def __init__(self, replies: list[HeldReply]) -> None:
        self.replies = replies
        self.posted: list[dict[str, Any]] = []
        self.delivered: list[HeldReply] = []

    async def post(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> Outcome:
        self.posted.append(orjson.loads(body))
        held = self.replies.pop(0)
        return Outcome(held.status, held=held)

    async def deliver(self, held: HeldReply, headers: list[tuple[bytes, bytes]]) -> int:
        self.delivered.append(held)
        return len(held.body)


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
    rounds = Rounds(script.post, script.deliver, now or clock([0.0]))
    outcome, stats = asyncio.run(
        settle(ctx, CHAT, offer, Outcome(200, held=first), SENT, [], None, rounds)
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
    # Only the ids the conversation holds or its forwarded marks name are allowed.
    assert desk.calls[0][1] == frozenset({"rzzzzzzzzzzz", "rabcdefghijk"})
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
