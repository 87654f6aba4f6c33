"""The cache-aligned summary call in Messages form, against the fake Anthropic upstream (a real
process that caches prompts at breakpoints, keys cached messages on ``thinking`` and
``tool_choice``, and checks signed thinking blocks as the API does).

A Claude-Code-shaped session (two system breakpoints, a breakpoint on the newest tool result,
adaptive thinking with signed blocks sent back) is driven straight against the fake, as the
proxy would forward it; then the summarizer, bound to the last request as the flow binds it
(tests/support/messages_view.py stands in for the Messages view), summarizes an older stretch.
The call is accepted, thinking signatures and all, and the fake serves its prefix from the
cache the session wrote: the call pays for its instruction, not for the conversation again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryRequest
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.summarizer import HttpSummarizer, SummarizerStats
from compaction_proxy.summarizer._prefix import ForwardedRequest
from compaction_proxy.upstream import HttpxUpstream
from tests.fakes.messages.prompt import Counter, build_prompt
from tests.support.messages_bodies import claude_code_request, claude_code_system
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer
from tests.support.messages_view import STAND_IN, ensure_messages_api, lift

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

MODEL = "claude-sonnet-4-5"
SYSTEM = claude_code_system(40, 300)
STEPS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    handle = MessagesUpstreamServer(tmp_path_factory.mktemp("anthropic") / "fake.log")
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def fake(server: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    server.reset()
    ensure = ensure_messages_api()
    yield server
    ensure()
    server.reset()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as shared:
        yield shared


def request(messages: list[dict[str, Any]], thinking: dict[str, Any]) -> dict[str, Any]:
    """The session's request: Claude Code's breakpoint on the newest message's last block."""
    return claude_code_request(
        messages, model=MODEL, max_tokens=32_000, system=SYSTEM, thinking=thinking
    )


def session(
    fake: MessagesUpstreamServer, thinking: dict[str, Any], steps: int = STEPS
) -> dict[str, Any]:
    """Drives the fake's scripted loop for ``steps`` steps; returns the last request."""
    task = f"fake-loop: steps={steps + 5} lines=150 parallel=1 Fix the build. FACT-TASK"
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    with httpx.Client(base_url=fake.url, trust_env=False, timeout=30) as http:
        for _ in range(steps):
            answer = http.post(MESSAGES, json=request(messages, thinking))
            assert answer.status_code == 200, answer.text
            content = answer.json()["content"]
            messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            assert uses
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": use["id"],
                    "content": f"ran {use['id']} " * 300,
                }
                for use in uses
            ]
            messages.append({"role": "user", "content": results})
        last = request(messages, thinking)
        assert http.post(MESSAGES, json=last).status_code == 200  # forwarded and cached too
    return last


def summarizer(
    fake: MessagesUpstreamServer, client: httpx.AsyncClient, stats: SummarizerStats
) -> HttpSummarizer:
    upstream = UpstreamSettings.model_validate(
        {"name": "anthropic", "base_url": f"{fake.url}/v1", "api": "messages"}
    )
    return HttpSummarizer(
        SummarizationSettings.model_validate({"maxSummaryTokens": 1_000}),
        [upstream],
        HttpxUpstream(client),
        facts_for=lambda _m: ModelFacts(context_window=200_000, max_output_tokens=8_000),
        stats=stats,
    )


def answered(fake: MessagesUpstreamServer) -> dict[str, Any]:
    events = [e for e in fake.events() if e.get("type") in ("answered", "rejected")]
    assert events and events[-1]["type"] == "answered", events[-1:]
    return events[-1]


@pytest.mark.parametrize("binding", ["off", "enforce"])
async def test_the_prefix_form_is_read_from_the_sessions_cache(
    fake: MessagesUpstreamServer, client: httpx.AsyncClient, binding: str
) -> None:
    fake.control(thinking_binding=binding)
    last = session(fake, {"type": "adaptive"})
    view = lift(last)
    # fold the task and the first four steps: chat messages 1..9 (user, then 4 x call+result)
    stretch = tuple(view.chat["messages"][1:10])
    stats = SummarizerStats()
    bound = summarizer(fake, client, stats).bind(
        caller_key=None,
        request=ForwardedRequest.from_body(view.chat, "anthropic", view.native_request()),
        wire=STAND_IN,
        upstream="anthropic",
    )
    text = await bound.summarize(SummaryRequest(stretch, None, MODEL))
    assert "FACT-TASK" in text
    usage = answered(fake)["usage"]
    whole = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    share = usage["cache_read_input_tokens"] / whole
    # all but the instruction (about 700 tokens of some 9,000) comes from the cache
    assert share > 0.85, usage
    assert stats.cached_tokens == {("anthropic", MODEL): usage["cache_read_input_tokens"]}
    assert stats.forms == {"prefix": 1}


async def test_a_manual_thinking_budget_costs_the_cached_messages(
    fake: MessagesUpstreamServer, client: httpx.AsyncClient
) -> None:
    """The call leaves a manual budget out (it would need room in max_tokens): the prefix is
    still accepted, thinking blocks and all, but only the system and tools are cached reads."""
    last = session(fake, {"type": "enabled", "budget_tokens": 2_048})
    view = lift(last)
    bound = summarizer(fake, client, SummarizerStats()).bind(
        caller_key=None,
        request=ForwardedRequest.from_body(view.chat, "anthropic", view.native_request()),
        wire=STAND_IN,
        upstream="anthropic",
    )
    await bound.summarize(SummaryRequest(tuple(view.chat["messages"][1:10]), None, MODEL))
    usage = answered(fake)["usage"]
    system_and_tools = build_prompt({**last, "messages": []}, Counter()).total
    assert usage["cache_read_input_tokens"] == system_and_tools
