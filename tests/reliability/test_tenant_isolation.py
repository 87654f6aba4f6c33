"""No conversation ever sees another's content.

An app serving many end users sends them all under one API key. Two of its conversations that
differ only in their system prompt, their tools, their end user (``user``,
``safety_identifier``, ``X-Compaction-Tenant``) or, on the Responses API, their
``instructions`` must never share a checkpoint, a prepared summary or a summary in flight. Real
processes: the proxy under ``serve`` and a fake upstream that enforces an 8k window and plays
the summarizer (in the default, cache-aligned prefix form the summary call carries the
request's system prompt and tools, and the fake's summary lists every ``FACT-...`` it was
shown, so a system prompt's fact shows up wherever its summary went).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.tenancy import (
    MODEL,
    MODELS,
    SUMMARIZATION,
    WINDOW,
    conversation,
    forwarded,
    metric,
    responses_input,
    summarizer_calls,
    wait_for,
)
from tests.support.agent_session import TOOLS
from tests.support.responses_upstream import RESPONSES, ResponsesUpstreamServer
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

APP_KEY = "sk-one-app-many-users-5d1e"
ALICE = "You assist Alice. Her account: FACT-ALICESECRET."
BOB = "You assist Bob."
OTHER_TOOLS = [
    {**tool, "function": {**tool["function"], "description": "Another app's tool"}}
    for tool in TOOLS
]


SUMMARIZE_FIRST = [
    {
        "strategy": "summarization",
        "trigger": {"token_ratio": 0.8},
        "target": {"token_ratio": 0.5},
        "retain_recent": {"turns": 2},
    },
]
"""A pipeline whose only way to the target is a summary, so what is made ahead of time is a
summary and carries what the summarizer saw."""


def isolation_config(upstream: UpstreamServer, *, prepare: bool = False) -> dict[str, Any]:
    summarization = {**SUMMARIZATION, "timeout": 10}
    extra: dict[str, Any] = {}
    if prepare:
        extra["compaction"] = {"pipeline": SUMMARIZE_FIRST}
        # Well below the trigger (0.8): one step of this session is ~730 tokens, more than the
        # gap between the default prepare threshold (0.7) and the trigger on an 8k window.
        summarization["prepare"] = {"token_ratio": 0.5}
    else:
        summarization["prepare"] = False  # no background call to muddle the counts
    return proxy_config(
        upstream_entry(upstream), models=MODELS, summarization=summarization, **extra
    )


@pytest.fixture(scope="module")
def window_server(upstream_factory_module: Any) -> UpstreamServer:
    server: UpstreamServer = upstream_factory_module(WINDOW)
    return server


@pytest.fixture
def upstream(window_server: UpstreamServer) -> Iterator[UpstreamServer]:
    window_server.reset()
    yield window_server
    window_server.reset()


@pytest.fixture
def proxy(proxy_factory: Any, window_server: UpstreamServer) -> ProxyServer:
    """A fresh proxy (and store) per test: no checkpoint of another test can be found."""
    server: ProxyServer = proxy_factory(isolation_config(window_server))
    return server


def test_two_system_prompts_under_one_key_share_no_checkpoint_and_no_content(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    client = proxy.openai_client(api_key=APP_KEY)
    alice = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=conversation("S", system=ALICE),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert alice.headers["x-compaction-checkpoint"] == "new"
    # Alice's system prompt went into her summary (the prefix form carries it)...
    assert "FACT-ALICESECRET" in forwarded(upstream)[-1].text
    bob = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=conversation("S", system=BOB),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    # ...and nothing of Alice's reaches Bob: no shared checkpoint, a summary of his own.
    assert bob.headers["x-compaction-checkpoint"] == "new"
    assert "ALICE" not in forwarded(upstream)[-1].text
    calls = summarizer_calls(upstream)
    assert len(calls) == 2
    bobs_call = calls[1].json()
    assert bobs_call["messages"][0] == {"role": "system", "content": BOB}
    assert "ALICE" not in calls[1].text


@pytest.mark.parametrize(
    ("change", "shared"),
    [
        ({}, True),  # the control: one scope, one checkpoint
        ({"tools": OTHER_TOOLS}, False),
        ({"extra_body": {"user": "end-user-b"}}, False),
        ({"extra_body": {"safety_identifier": "b-hash"}}, False),
        ({"extra_headers": {"X-Compaction-Tenant": "tenant-b"}}, False),
    ],
    ids=["same-scope", "tools", "user", "safety_identifier", "x-compaction-tenant"],
)
def test_tools_and_per_user_fields_are_part_of_the_checkpoint_key(
    proxy: ProxyServer, upstream: UpstreamServer, change: dict[str, Any], shared: bool
) -> None:
    client = proxy.openai_client(api_key=APP_KEY)
    first: dict[str, Any] = {
        "tools": TOOLS,
        "extra_body": {"user": "end-user-a", "safety_identifier": "a-hash"},
        "extra_headers": {"X-Compaction-Tenant": "tenant-a"},
    }
    second = {
        **first,
        **{k: ({**first[k], **v} if isinstance(v, dict) else v) for k, v in change.items()},
    }
    messages = conversation("T")
    made = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        **first,
    )
    assert made.headers["x-compaction-checkpoint"] == "new"
    other = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        **second,
    )
    assert other.headers["x-compaction-checkpoint"] == ("hit" if shared else "new")
    assert len(summarizer_calls(upstream)) == (1 if shared else 2)
    # The tenant header is the proxy's to read, not the provider's.
    for recorded in upstream.requests():
        assert "x-compaction-tenant" not in recorded.headers


def test_summaries_in_flight_are_not_shared_across_system_prompts(
    proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    """Both requests wait on the summarizer at once: each gets a call of its own, never the
    other's summary through single-flight."""
    upstream.control(summarizer_delay_ms=1_500)
    systems = {"alice": ALICE, "bob": BOB}

    def send(name: str) -> str:
        client = proxy.openai_client(api_key=APP_KEY)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=conversation("F", system=systems[name]),  # type: ignore[arg-type]
        )
        raw.parse()
        return str(raw.headers["x-compaction-checkpoint"])

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        states = list(pool.map(send, ["alice", "bob"]))
    assert states == ["new", "new"]
    calls = summarizer_calls(upstream)
    assert len(calls) == 2
    assert sorted(call.json()["messages"][0]["content"] for call in calls) == sorted([ALICE, BOB])
    sent = [r.json() for r in forwarded(upstream)]
    bobs = [body for body in sent if body["messages"][0]["content"] == BOB]
    assert len(bobs) == 1 and "ALICE" not in str(bobs[0])


def test_a_summary_prepared_for_one_system_prompt_is_never_used_for_another(
    proxy_factory: Any, window_server: UpstreamServer
) -> None:
    window_server.reset()
    proxy: ProxyServer = proxy_factory(isolation_config(window_server, prepare=True))
    client = proxy.openai_client(api_key=APP_KEY)
    # Alice's conversation grows into the prepare threshold (below the trigger): a summary of
    # it is made in the background.
    for steps in range(1, 13):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=conversation("R", steps, system=ALICE, turn_every=1),  # type: ignore[arg-type]
        )
        assert raw.headers["x-compaction-checkpoint"] == "none", steps
        if raw.headers["x-compaction-prepared"] == "pending":
            break
    else:
        raise AssertionError("the conversation never reached the prepare threshold")

    def made() -> bool:
        with proxy.http_client() as http:
            text = http.get("/metrics").text
        return metric(text, "compaction_proxy_prepared_summaries_total", outcome="made") == 1

    assert wait_for(made), "the background summary was never made"
    assert "FACT-ALICESECRET" in summarizer_calls(window_server)[0].text
    # Bob's conversation is Alice's with another system prompt, past the trigger.
    bob = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=conversation("R", steps + 6, system=BOB, turn_every=1),  # type: ignore[arg-type]
    )
    assert bob.headers["x-compaction-checkpoint"] == "new"
    assert bob.headers["x-compaction-prepared"] != "ready"
    assert "ALICE" not in forwarded(window_server)[-1].text
    window_server.reset()


# --------------------------------------------------------------------------- Responses API


@pytest.fixture(scope="module")
def responses_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ResponsesUpstreamServer]:
    log = tmp_path_factory.mktemp("responses") / "responses.log"
    server = ResponsesUpstreamServer(log, context_window=WINDOW, name="responses")
    server.start()
    yield server
    server.stop()


def test_responses_conversations_with_other_instructions_share_no_checkpoint(
    proxy_factory: Any, responses_server: ResponsesUpstreamServer
) -> None:
    responses_server.reset()
    proxy: ProxyServer = proxy_factory(isolation_config(responses_server))
    items = responses_input("I")
    states = []
    with proxy.http_client(headers={"Authorization": f"Bearer {APP_KEY}"}) as http:
        for instructions in (ALICE, ALICE, BOB):
            body = {"model": MODEL, "instructions": instructions, "input": items, "store": False}
            response = http.post(RESPONSES, json=body)
            assert response.status_code == 200, response.text
            states.append(response.headers["x-compaction-checkpoint"])
    # Alice's second request reuses her checkpoint; Bob's first one does not.
    assert states == ["new", "hit", "new"]
    assert len(summarizer_calls(responses_server)) == 2
    assert "ALICE" not in forwarded(responses_server, RESPONSES)[-1].text
    responses_server.reset()
