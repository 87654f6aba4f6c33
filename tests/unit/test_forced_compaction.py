"""`X-Compaction: force` through the proxy: the event a normal request over the trigger gets.

In one process (tests/support/in_process.py): the production app, the fake upstream enforcing
the window and playing the summarizer.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.agent_session import is_summarizer_text
from tests.support.in_process import Exchange, in_process, upstream_entry

WINDOW = 8_192
MODEL = "agent-8k"


def two_turn_loop(steps: int) -> list[dict[str, Any]]:
    """An agent's task and its tool steps, the answer, then the user's follow-up."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests in src/."},
    ]
    for n in range(steps):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"cmd": f"pytest -k t{n}"})},
        }
        output = "".join(f"line {k} of step {n}: value={n * 7 + k}\n" for k in range(12))
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": output},
        ]
    return [
        *messages,
        {"role": "assistant", "content": "All green now."},
        {"role": "user", "content": "Now commit it."},
    ]


def config(compaction: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "upstreams": [upstream_entry()],
        "models": {MODEL: {"context_window": WINDOW}},
        "store": {"backend": "memory"},
        **({"compaction": compaction} if compaction else {}),
    }


def forwarded(exchange: Exchange) -> list[dict[str, Any]]:
    bodies = [json.loads(b) for b in exchange.received if not is_summarizer_text(b.decode())]
    messages: list[dict[str, Any]] = bodies[-1]["messages"]
    return messages


def calls(exchange: Exchange) -> int:
    return sum(1 for b in exchange.received if is_summarizer_text(b.decode()))


async def test_force_summarizes_an_agent_loop_as_a_request_over_the_trigger_is() -> None:
    """Two user turns, the older holding the steps, over the trigger: the forced request goes
    upstream as the normal one does, the steps summarized (one summarizer call), nothing
    truncated. Before, force folded only what two retained turns left (nothing here) and
    truncation dropped the steps without a summary or a warning."""
    body = {"model": MODEL, "messages": two_turn_loop(32)}
    async with in_process(config(), window=WINDOW) as proxy:
        forced = await proxy.chat(body, **{"X-Compaction": "force"})
    async with in_process(config(), window=WINDOW) as proxy:
        normal = await proxy.chat(body)
    for exchange in (forced, normal):
        assert exchange.response.status_code == 200
        strategies = exchange.response.headers["x-compaction-strategies"].split(",")
        assert "summarization" in strategies and "truncation" not in strategies, strategies
        assert calls(exchange) == 1
        assert any(str(m["content"]).startswith("<summary>") for m in forwarded(exchange))
    assert forwarded(forced) == forwarded(normal)
    assert "x-compaction-warning" not in forced.response.headers
    before = int(forced.response.headers["x-compaction-tokens-before"])
    assert int(forced.response.headers["x-compaction-tokens-after"]) < before // 4


async def test_a_forced_request_that_drops_turns_unsummarized_says_so() -> None:
    """A pipeline whose forced sliding window leaves summarization nothing to fold: the
    response warns that force made no summary while groups were dropped."""
    pipeline = [
        {"strategy": "sliding_window", "trigger": {"turns_exceed": 4}},
        {"strategy": "summarization", "trigger": {"tokens_exceed": 100_000}},
    ]
    body = {"model": MODEL, "messages": two_turn_loop(4)}
    async with in_process(config({"pipeline": pipeline}), window=WINDOW) as proxy:
        exchange = await proxy.chat(body, **{"X-Compaction": "force"})
    assert exchange.response.status_code == 200
    warnings = exchange.response.headers.get_list("x-compaction-warning")
    assert any("X-Compaction: force made no summary" in w for w in warnings), warnings
    assert calls(exchange) == 0
