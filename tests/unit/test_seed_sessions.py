"""The seeds' configurations pasted verbatim, over whole sessions, through the proxy in one process.

The proxy is the production factory's app and the fake upstream enforces the window and plays
the summarizer (tests/support/in_process.py): lookups, checkpoints, prepared summaries and the
summarizer's own HTTP calls all run, with no socket in between, so a session of a hundred
requests takes seconds. The figures asserted here are the ones `bench/session.py --matrix`
measures through real processes.

- LibreChat's `summarization:` block (its docs' example, tests/support/trust_session.py) on a
  declared 8k window: the user messages it carries beside its summaries count inside each
  summary event's target, so they never make summaries come more often than without them; at
  32k they still carry the users' rules to the last request.
- The Agent Framework's .NET pipeline (its docs' example) on a declared 8k window: pasted as
  written it is the Agent Framework's, with neither of the proxy's own additions
  (docs/configuration.md, "The proxy's two additions, and explicit pipelines").
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.agent_session import is_summarizer_text
from tests.support.in_process import in_process, upstream_entry
from tests.support.trust_session import (
    LIBRECHAT_BLOCK,
    LIBRECHAT_UPSTREAM,
    TrustReport,
    run_trust_session_in_process,
)

WINDOW_8K = 8_192
WINDOW_32K = 32_768


async def librechat_session(
    window: int, requests: int, compaction: dict[str, Any] | None = None
) -> TrustReport:
    """LibreChat's block verbatim, `models: {acc-Nk: {context_window: N}}` and nothing else
    (but `compaction`, when given); chat turns of two requests, ~900-token tool results."""
    model = f"acc-{window // 1024}k"
    config = {
        "upstreams": [upstream_entry(LIBRECHAT_UPSTREAM)],
        "models": {model: {"context_window": window}},
        "store": {"backend": "memory"},
        "summarization": dict(LIBRECHAT_BLOCK),
        **({"compaction": compaction} if compaction is not None else {}),
    }
    async with in_process(config, window=window) as proxy:
        # Background summaries end before the next request, as in a real agent's loop: the
        # summarizer counts compared below must not depend on the machine's load.
        proxy.think_time = True
        return await run_trust_session_in_process(
            proxy, model=model, shape="chat", requests=requests
        )


async def test_carried_user_messages_never_multiply_summaries_at_8k() -> None:
    """65 turns: with the carry on (the block's default) the summarizer is called no more often
    than with `carry_user_messages: 0`. Before the carry counted inside the event's target, the
    carried messages left each event over it and events came every few requests: 19 calls
    against 8."""
    # The carry alone (the ledger keeps the folded turns' rules too, at a cost in summaries:
    # test_the_ledger_forwards_every_rule_at_8k below).
    off = {"ledger": {"enabled": False}}
    carried = await librechat_session(WINDOW_8K, 130, off)
    plain = await librechat_session(WINDOW_8K, 130, {**off, "carry_user_messages": 0})
    assert plain.summarizer_calls > 0, "the session never summarized: it proves nothing"
    assert carried.summarizer_calls <= plain.summarizer_calls, (
        carried.summarizer_calls,
        plain.summarizer_calls,
    )
    for report in (carried, plain):
        assert report.false_summary_reports() == []
        assert all(step.prompt_tokens < WINDOW_8K for step in report.steps)
    # the carry still does its work: more of the users' rules reach the last request
    assert carried.rules_carried() > plain.rules_carried()


async def test_the_ledger_forwards_every_rule_at_8k() -> None:
    """The same 65 turns with the default configuration, the ledger on: every rule a user
    stated reaches the last request verbatim (carried, or pinned in the ledger), where the
    carry alone forwards about a quarter. The price: the pinned rules count inside every
    summary event's target, so at 8k the summarizer is called about twice as often."""
    report = await librechat_session(WINDOW_8K, 130)
    assert report.summarizer_calls > 0
    assert report.rules_carried() == 1.0
    assert report.false_summary_reports() == []
    assert all(step.prompt_tokens < WINDOW_8K for step in report.steps)


async def test_the_users_rules_still_reach_the_last_request_at_32k() -> None:
    """100 turns, each user message stating a rule: at least 95% of them are forwarded in the
    last request, verbatim and in order, after the summaries that folded their turns."""
    report = await librechat_session(WINDOW_32K, 200)
    assert report.events > 0 and report.summarizer_calls > 0, "no compaction: it proves nothing"
    assert report.rules_carried() >= 0.95, report.rules_carried()
    last = report.steps[-1]
    sent = [m for m in last.raw if m["role"] == "user"]
    carried = [m for m in last.forwarded if m["role"] == "user" and m in sent]
    assert carried == [m for m in sent if m in carried]
    assert len(carried) >= 0.95 * len(sent)


# ------------------------------------------------------ the Agent Framework's .NET pipeline

DOTNET_PIPELINE: list[dict[str, Any]] = [
    {"strategy": "tool_result_compaction", "trigger": {"tokens_exceed": 0x200}},
    {"strategy": "summarization", "trigger": {"tokens_exceed": 0x500}},
    {"strategy": "sliding_window", "trigger": {"turns_exceed": 4}},
    {"strategy": "truncation", "trigger": {"tokens_exceed": 0x8000}},
]
"""The seed's ``PipelineCompactionStrategy`` example, entry for entry (its hex literals are
YAML's too)."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
        },
    }
    for name in ("LookupPrice", "LookupStock")
]


def shopping_turn(index: int) -> list[dict[str, Any]]:
    """The seed's shopping assistant (tests/integration/test_agent_framework_pipeline.py's
    chat), its questions with their particulars: a question, then the price lookup (every sixth
    one a whole catalogue page of ~2,000 tokens) and the stock lookup."""
    item = f"item {index}"
    question = (
        f"turn {index}: what's the price of {item}? I need it in colour 0, size 0, delivered "
        "to address line 0. I need it in colour 1, size 1, delivered to address line 1."
    )
    price = (
        f"{item}: {index * 3 + 7} USD (list price {index * 4 + 9} USD), sold by shop "
        f"{index % 4}, offer valid for {index % 7 + 2} days, free returns within 30 days."
    )
    if index % 6 == 5:
        price += "".join(f" related item {index}-{n}: {n + 10} USD." for n in range(200))
    stock = (
        f"{item}: {index % 9} in stock at the main warehouse, {index % 5} at the store, "
        f"next delivery in {index % 3 + 1} days, reserved: {index % 2}."
    )

    def lookup(name: str, result: str) -> list[dict[str, Any]]:
        call = {
            "id": f"{name}_{index}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"item": item})},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"{name}_{index}", "content": result},
        ]

    return [
        {"role": "user", "content": question},
        *lookup("LookupPrice", price),
        *lookup("LookupStock", stock),
    ]


async def dotnet_session(compaction_extra: dict[str, Any]) -> tuple[list[int], list[int]]:
    """30 turns, one request each once the lookups are in: the requests that called the
    summarizer, and those on which the sliding window acted."""
    config = {
        "upstreams": [upstream_entry()],
        "models": {"shop-8k": {"context_window": WINDOW_8K, "max_output_tokens": 2_000}},
        "store": {"backend": "memory"},
        "summarization": {"maxSummaryTokens": 1000},
        "compaction": {"pipeline": DOTNET_PIPELINE, **compaction_extra},
    }
    summarized: list[int] = []
    windowed: list[int] = []
    conversation: list[dict[str, Any]] = [{"role": "system", "content": "You help shoppers."}]
    async with in_process(config, window=WINDOW_8K) as proxy:
        for index in range(30):
            conversation += shopping_turn(index)
            body = {"model": "shop-8k", "messages": conversation, "tools": TOOLS}
            exchange = await proxy.chat(body)
            assert exchange.response.status_code == 200
            if any(is_summarizer_text(b.decode()) for b in exchange.received):
                summarized.append(index)
            if "sliding_window" in exchange.response.headers["x-compaction-strategies"]:
                windowed.append(index)
            conversation.append({"role": "assistant", "content": f"Item {index}: see above."})
    return summarized, windowed


async def test_the_seeds_dotnet_pipeline_verbatim_summarizes_as_the_agent_framework() -> None:
    """Pasted as written it makes no more summarizer calls than the same pipeline with the proxy's
    two additions written off (the Agent Framework's semantics: neither exists there), and its
    sliding window keeps firing as the chat grows ("keeps only the last 4 user turns"). With
    them on by default the carried questions, which no summary may fold, kept the summarization
    child's 0x500 trigger firing: 21 of 30 requests called the summarizer, against 9, and the
    window never fired after request 5."""
    verbatim, windowed = await dotnet_session({})
    anchor, anchor_windowed = await dotnet_session({"carry_user_messages": 0, "min_saving": 0})
    assert anchor, "the session never summarized: it proves nothing"
    assert len(verbatim) <= len(anchor), (verbatim, anchor)
    assert windowed == anchor_windowed
    assert len(windowed) >= 4 and max(windowed) >= 20, windowed
