"""An agent's large output limit on a small window: reserved in part, lowered to fit, accepted.

Claude Code asks ``max_tokens: 32000`` on every request. A 32k local server (vLLM, SGLang)
refuses a request whose prompt plus that limit exceeds its window, however small the prompt;
reserving the whole limit in the budget would leave the conversation nothing. A real proxy
under ``serve`` in front of the fake upstream, which enforces a 32,768-token window counting
the asked output (as vLLM does, and in vLLM's words): with the configuration's defaults the
request is accepted, its limit lowered to what the window leaves after the prompt, and
``X-Compaction-Output-Limit`` and a warning say so; every other byte of the body is the
client's. The same proxy with ``lower_output_limit: false`` forwards the ask, and the upstream
refuses it: that is what the client met before. Chat completions (JSON and stream, SDK and
raw bytes) and the Responses API; a long conversation compacted and lowered in one request; a
window the proxy did not know, learned from the refusal and fixed by the limit alone; a dry run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream import TokenCounter
from tests.support.responses_upstream import RESPONSES, ResponsesUpstreamServer
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

WINDOW = 32_768
ASKED = 32_000
MODEL = "local-32k"  # declared to the proxy with its window
UNDECLARED = "local-mystery"  # the proxy does not know its window (budgets for 128k)
CHAT = "/v1/chat/completions"
SAFETY = int(0.05 * WINDOW)  # summarization.reserveRatio, the budget's margin for counting error


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponsesUpstreamServer]:
    """Chat completions and the Responses API, both enforcing prompt + limit <= window."""
    server = ResponsesUpstreamServer(tmp_path_factory.mktemp("limit") / "upstream.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake: ResponsesUpstreamServer) -> Iterator[ResponsesUpstreamServer]:
    fake.reset()
    fake.control(model_context_windows={MODEL: WINDOW, UNDECLARED: WINDOW}, refusal_style="vllm")
    yield fake
    fake.reset()


def _config(fake: ResponsesUpstreamServer, **compaction: Any) -> dict[str, Any]:
    return proxy_config(
        upstream_entry(fake),
        models={MODEL: {"context_window": WINDOW}},
        # No summarizer: its calls would go to the same windowed model and blur the counts.
        summarization={"enabled": False},
        windows={"discover": False},
        store={"backend": "memory"},
        **({"compaction": compaction} if compaction else {}),
    )


@pytest.fixture(scope="module")
def proxy(fake: ResponsesUpstreamServer, module_proxy_factory: Any) -> ProxyServer:
    """The configuration's defaults: output_reserve_share 0.25, lower_output_limit true."""
    server: ProxyServer = module_proxy_factory(_config(fake))
    return server


@pytest.fixture(scope="module")
def as_asked(fake: ResponsesUpstreamServer, module_proxy_factory: Any) -> ProxyServer:
    server: ProxyServer = module_proxy_factory(_config(fake, lower_output_limit=False))
    return server


def conversation(turns: int, words: int = 200) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: " + "look " * words})
        messages.append({"role": "assistant", "content": f"done {turn}: " + "found " * words})
    messages.append({"role": "user", "content": "and now?"})
    return messages


COUNTER = TokenCounter()  # the fake upstream's own (conftest points tiktoken at its files)


def counted(messages: list[dict[str, Any]]) -> int:
    """The prompt tokens the fake upstream counts for ``messages``."""
    assert COUNTER.exact
    return COUNTER.messages(messages, None)


def lowered_note(response: httpx.Response | Any) -> str:
    notes = [
        w
        for w in response.headers.get_list("x-compaction-warning")
        if w.startswith("output limit lowered")
    ]
    assert len(notes) == 1, response.headers.get_list("x-compaction-warning")
    return notes[0]


def test_a_32000_limit_on_a_32k_window_is_accepted_and_said(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    messages = conversation(10)  # about 4k tokens: no compaction needed, only the limit
    with proxy.openai_client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=ASKED
        )
    assert raw.http_response.status_code == 200
    raw.parse()
    forwarded = int(raw.headers["x-compaction-output-limit"])
    assert forwarded < ASKED
    assert raw.headers["x-compaction-strategies"] == "none"
    note = lowered_note(raw)
    assert f"from {ASKED} to {forwarded} tokens" in note
    sent = upstream.last_request(CHAT).json()
    assert sent["max_tokens"] == forwarded
    assert sent["messages"] == messages
    # What the window leaves after the prompt, by the proxy's count, less its safety margin.
    after = int(raw.headers["x-compaction-tokens-after"])
    assert forwarded == WINDOW - SAFETY - after
    assert counted(messages) + forwarded <= WINDOW


def test_without_lowering_the_upstream_refuses_what_was_asked(
    as_asked: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    """The client's experience before the bound: the upstream counts prompt + 32,000."""
    with as_asked.openai_client() as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(10), max_tokens=ASKED
        )
    assert "maximum context length is 32768" in str(refused.value)
    response = refused.value.response
    assert "x-compaction-output-limit" not in response.headers
    assert any(
        "lower_output_limit is off" in w for w in response.headers.get_list("x-compaction-warning")
    )
    assert upstream.last_request(CHAT).json()["max_tokens"] == ASKED


def test_only_the_limit_changes_in_the_clients_bytes(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    """Spacing, an integer past 64 bits and ``1.10`` stay as written; only the value of
    ``max_completion_tokens`` (and of ``max_tokens``, which asks more too) is the proxy's."""
    messages = json.dumps(conversation(6), indent=1)
    raw = (
        f'{{ "model" : "{MODEL}", "seed": 1180591620717411303424, "temperature": 1.10,\n'
        f'  "max_completion_tokens" :32000, "messages": {messages}, "max_tokens": 31000 }}'
    )
    with proxy.http_client() as client:
        response = client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    forwarded = int(response.headers["x-compaction-output-limit"])
    expected = raw.replace(
        '"max_completion_tokens" :32000', f'"max_completion_tokens" :{forwarded}'
    )
    expected = expected.replace('"max_tokens": 31000', f'"max_tokens": {forwarded}')
    assert upstream.last_request(CHAT).body == expected.encode()


def test_a_stream_with_max_completion_tokens_is_lowered_too(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    with proxy.openai_client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(10), max_completion_tokens=ASKED, stream=True
        )
        chunks = list(raw.parse())
    assert chunks and chunks[-1].choices[0].finish_reason is not None
    forwarded = int(raw.headers["x-compaction-output-limit"])
    assert upstream.last_request(CHAT).json()["max_completion_tokens"] == forwarded < ASKED


def test_a_long_conversation_is_compacted_and_its_limit_lowered(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    messages = conversation(60)  # about 25k tokens: past the budget the bounded reserve leaves
    assert counted(messages) > WINDOW - WINDOW // 4 - SAFETY
    with proxy.openai_client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=ASKED
        )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-compaction-strategies"] != "none"
    forwarded = int(raw.headers["x-compaction-output-limit"])
    sent = upstream.last_request(CHAT).json()
    assert sent["max_tokens"] == forwarded
    # Compacted to the budget the quarter's reserve leaves, and what the window leaves after
    # that is more than the reserve: the answer keeps room too.
    assert forwarded >= WINDOW // 4
    assert counted(sent["messages"]) + forwarded <= WINDOW
    assert "x-compaction-retry" not in raw.headers


def test_a_responses_request_gets_its_max_output_tokens_lowered(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    items = [{"role": "user", "content": f"step {turn}: " + "look " * 200} for turn in range(10)]
    with proxy.openai_client() as client:
        raw = client.responses.with_raw_response.create(
            model=MODEL, input=items, max_output_tokens=ASKED, store=False
        )
    assert raw.http_response.status_code == 200
    raw.parse()
    forwarded = int(raw.headers["x-compaction-output-limit"])
    assert f"from {ASKED} to {forwarded} tokens" in lowered_note(raw)
    sent = upstream.last_request(RESPONSES).json()
    assert sent["max_output_tokens"] == forwarded < ASKED
    assert sent["input"] == items


def test_an_unknown_window_is_learned_and_the_limit_alone_fixes_the_retry(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    """The proxy budgets an undeclared model for 128k, so 32,000 fits there and goes as asked;
    the upstream refuses prompt + 32,000 > 32,768 and states its window. The prompt needs no
    compaction for that window: the retry only lowers the limit, and is accepted."""
    with proxy.openai_client() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=UNDECLARED, messages=conversation(10), max_tokens=ASKED
        )
    assert raw.http_response.status_code == 200
    assert raw.headers["x-compaction-retry"] == "1"
    forwarded = int(raw.headers["x-compaction-output-limit"])
    first, retried = (r.json() for r in upstream.requests(CHAT))
    assert first["max_tokens"] == ASKED
    assert retried["max_tokens"] == forwarded < ASKED
    assert retried["messages"] == first["messages"]
    # Learned: the next request is lowered at once.
    with proxy.openai_client() as client:
        again = client.chat.completions.with_raw_response.create(
            model=UNDECLARED, messages=conversation(10), max_tokens=ASKED
        )
    assert "x-compaction-retry" not in again.headers
    assert int(again.headers["x-compaction-output-limit"]) == forwarded


def test_a_dry_run_says_what_would_be_lowered_and_forwards_the_clients_bytes(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    body = {"model": MODEL, "messages": conversation(10), "max_tokens": ASKED}
    with proxy.http_client() as client:
        response = client.post(CHAT, json=body, headers={"x-compaction": "dry-run"})
    assert response.status_code == 400  # the upstream's verdict on the client's own request
    assert response.headers["x-compaction-dry-run"] == "true"
    would = int(response.headers["x-compaction-output-limit"])
    assert f"from {ASKED} to {would} tokens" in lowered_note(response)
    assert upstream.last_request(CHAT).json()["max_tokens"] == ASKED
