"""A long agent conversation through the real proxy to an upstream that enforces its window.

The upstream answers 400 `context_length_exceeded` past 8,000 tokens, as OpenAI does. Through
the proxy the same conversation must arrive compacted, under budget, with every tool call
still paired with its result; with `X-Compaction: off` it must get the upstream's 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.agent_session import TOOLS, assert_valid_pairing
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

WINDOW = 8_000
MODEL = "agent-model"


def agent_conversation(steps: int) -> list[dict[str, Any]]:
    """System, a task, then tool steps (some parallel) with large outputs and new user turns."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Fix the failing test in the parser module."},
    ]
    for step in range(steps):
        if step % 5 == 4:
            messages.append({"role": "user", "content": f"Status update please ({step})."})
            messages.append({"role": "assistant", "content": f"Still working, step {step}."})
            continue
        calls = [
            {
                "id": f"call_{step}_{n}",
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{n}.py"})},
            }
            for n in range(1 + step % 2)  # every other step makes two parallel calls
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            body = f"# {call['id']}\n" + f"def function_{step}():\n    return {step}\n" * 60
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})
    messages.append({"role": "user", "content": "Now run the tests and tell me the result."})
    return messages


@pytest.fixture(scope="module")
def small_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module(WINDOW)


@pytest.fixture(scope="module")
def compacting_proxy(
    module_proxy_factory: Any, small_upstream: UpstreamServer
) -> Iterator[ProxyServer]:
    config = proxy_config(
        upstream_entry(small_upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
    )
    yield module_proxy_factory(config)


@pytest.fixture
def client(compacting_proxy: ProxyServer) -> openai.OpenAI:
    return compacting_proxy.openai_client()


def test_the_raw_conversation_is_too_large_for_the_upstream(
    client: openai.OpenAI, small_upstream: UpstreamServer
) -> None:
    messages = agent_conversation(40)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, extra_headers={"X-Compaction": "off"}
        )
    assert caught.value.code == "context_length_exceeded"
    # The upstream saw the client's conversation, untouched.
    assert len(small_upstream.last_request("/v1/chat/completions").json()["messages"]) == len(
        messages
    )


def test_through_the_proxy_it_arrives_compacted_and_paired(
    client: openai.OpenAI, small_upstream: UpstreamServer
) -> None:
    messages = agent_conversation(40)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS
    )
    completion = raw.parse()
    assert completion.choices[0].message.content is not None
    before = int(raw.headers["x-compaction-tokens-before"])
    after = int(raw.headers["x-compaction-tokens-after"])
    assert before > WINDOW > after
    assert raw.headers["x-compaction-strategies"] != "none"

    sent = small_upstream.last_request("/v1/chat/completions").json()
    forwarded = sent["messages"]
    assert forwarded[0] == messages[0], "system prompt kept byte for byte"
    assert forwarded[-1] == messages[-1], "the newest turn is kept verbatim"
    assert len(forwarded) < len(messages)
    assert_valid_pairing(forwarded)
    assert sent["tools"] == TOOLS


def test_streaming_requests_are_compacted_too(
    client: openai.OpenAI, small_upstream: UpstreamServer
) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=agent_conversation(40),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].prompt_tokens < WINDOW
    assert_valid_pairing(small_upstream.last_request("/v1/chat/completions").json()["messages"])


def test_an_agent_loop_never_overflows(
    client: openai.OpenAI, small_upstream: UpstreamServer
) -> None:
    """Each tool step is a new request, as agents make them; every one must succeed."""
    full = agent_conversation(60)
    # Cut points right before each assistant tool call: the request an agent would send.
    cuts = [i for i, m in enumerate(full) if m["role"] == "assistant" and m.get("tool_calls")]
    for cut in cuts[::3]:
        reply = client.chat.completions.create(model=MODEL, messages=full[:cut], tools=TOOLS)
        assert reply.usage is not None and reply.usage.prompt_tokens < WINDOW
        assert_valid_pairing(small_upstream.last_request("/v1/chat/completions").json()["messages"])
