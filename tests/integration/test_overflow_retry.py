"""Compact-and-retry after an upstream's context-overflow refusal, and windows learned and read.

The proxy does not know the model (no `models:` entry, not in the built-in table), so it
budgets for the default 128k window; the fake upstream enforces 16k and refuses a ~25k-token
agent conversation as the server family under test words it. Through the proxy the client
still gets its answer: one refusal, one compacted retry, `X-Compaction-Retry: 1`, and from
then on (also after a restart, through the SQLite store) no refusal at all. Refusals the proxy
cannot fix, other 400s and `X-Compaction: off` pass through as the upstream sent them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.upstream import DEFAULT_MODELS
from tests.support.agent_session import assert_valid_pairing
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

WINDOW = 16_384
CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def conversation(steps: int = 36) -> list[dict[str, Any]]:
    """An agent session of about 25k tokens, mostly old tool results that compaction can drop."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Find why the nightly build is slow."},
    ]
    for step in range(steps):
        if step % 6 == 5:
            messages.append({"role": "user", "content": f"Any progress? ({step})"})
            messages.append({"role": "assistant", "content": f"Still digging, step {step}."})
            continue
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {
                "name": "read_file",
                "arguments": json.dumps({"path": f"src/module_{step}.py"}),
            },
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = f"# src/module_{step}.py\n" + "".join(
            f"def step_{step}_{n}(value):\n    return value * {n} + {step}\n" for n in range(45)
        )
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})
    messages.append({"role": "user", "content": "Summarise what you found."})
    return messages


def _config(upstream: UpstreamServer, **extra: Any) -> dict[str, Any]:
    # No summarizer: its calls would go to the same windowed model and blur the counts.
    return proxy_config(upstream_entry(upstream), summarization={"enabled": False}, **extra)


@pytest.fixture(scope="module")
def retry_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    """One proxy for the refusal tests: each test uses its own model name, so what one test
    taught the proxy never helps another."""
    proxy: ProxyServer = module_proxy_factory(_config(fake_upstream, windows={"discover": False}))
    return proxy


@pytest.fixture
def client(retry_proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    client = retry_proxy.openai_client()
    yield client
    client.close()


def _enforce(upstream: UpstreamServer, model: str, style: str = "openai") -> None:
    upstream.control(model_context_windows={model: WINDOW}, refusal_style=style)


def _chat(
    client: openai.OpenAI, model: str, messages: list[dict[str, Any]], *, stream: bool
) -> tuple[httpx.Headers, str, int | None]:
    """One chat request: (response headers, the answer's text, the upstream's prompt tokens)."""
    create: Any = client.chat.completions.with_raw_response.create
    raw = create(
        model=model,
        messages=messages,
        tools=TOOLS,
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    parsed: Any = raw.parse()
    if not stream:
        usage = parsed.usage.prompt_tokens if parsed.usage else None
        return raw.headers, parsed.choices[0].message.content or "", usage
    text, usage = "", None
    for chunk in parsed:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage.prompt_tokens
    return raw.headers, text, usage


# ----------------------------------------------------------------------------- compact and retry


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("style", ["openai", "vllm", "vllm_new", "llamacpp"])
def test_a_refusal_is_compacted_away_once(
    client: openai.OpenAI, upstream: UpstreamServer, style: str, stream: bool
) -> None:
    model = f"local-{style}-{'stream' if stream else 'json'}"
    _enforce(upstream, model, style)
    messages = conversation()

    headers, text, usage = _chat(client, model, messages, stream=stream)
    assert text == "echo: Summarise what you found."
    sent = upstream.requests(CHAT)
    assert len(sent) == 2, "one refusal, one compacted retry"
    assert headers["x-compaction-retry"] == "1"
    warnings = headers.get_list("x-compaction-warning")
    assert any("compacted to fit and retried" in w and f"window {WINDOW}" in w for w in warnings), (
        warnings
    )
    assert sent[0].json()["messages"] == messages, "the first attempt was the client's request"
    retried = sent[1].json()
    assert len(retried["messages"]) < len(messages)
    assert retried["messages"][-1] == messages[-1]
    assert_valid_pairing(retried["messages"])
    assert usage is not None and usage < WINDOW
    assert int(headers["x-compaction-tokens-after"]) < WINDOW

    # The next turn is budgeted for the learned window: no second refusal.
    upstream.clear()
    follow_up = [*messages, {"role": "assistant", "content": "Done."}, _user("And the tests?")]
    headers, text, usage = _chat(client, model, follow_up, stream=stream)
    assert text == "echo: And the tests?"
    assert len(upstream.requests(CHAT)) == 1
    assert "x-compaction-retry" not in headers
    assert usage is not None and usage < WINDOW


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_refusal_without_numbers_is_shrunk_from_our_count(
    client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    """Groq states no window: the proxy shrinks from what was refused and still gets through."""
    model = "local-groq"
    _enforce(upstream, model, "groq")
    headers, text, _ = _chat(client, model, conversation(), stream=False)
    assert text == "echo: Summarise what you found."
    assert headers["x-compaction-retry"] == "1"
    assert len(upstream.requests(CHAT)) == 2


def test_at_most_two_retries_then_the_last_refusal_goes_through(
    retry_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    """A window too small for anything compaction can make: two retries, then the client gets
    the upstream's last refusal as it was sent."""
    model = "local-tiny-window"
    upstream.control(model_context_windows={model: 2_000}, refusal_style="groq")
    body = orjson.dumps({"model": model, "messages": conversation()})
    with retry_proxy.http_client() as http:
        through = http.post(CHAT, content=body, headers={"content-type": "application/json"})
        metrics = http.get("/metrics").text
    sent = upstream.requests(CHAT)
    assert len(sent) == 3, "the request and two retries"
    assert len(sent[0].body) > len(sent[1].body) > len(sent[2].body)
    assert through.status_code == 400
    assert through.headers["x-compaction-retry"] == "2"
    last = upstream.client.post(
        CHAT, content=sent[2].body, headers={"content-type": "application/json"}
    )
    assert through.content == last.content
    assert re.search(
        r'compaction_proxy_overflow_retries_total\{outcome="refused_again",upstream="fake"\} '
        r"[1-9]",
        metrics,
    ), metrics


def test_a_refusal_the_proxy_cannot_fix_passes_through_unchanged(
    retry_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    """One user message bigger than the window: nothing to compact, the 400 goes through."""
    model = "local-one-huge-message"
    _enforce(upstream, model, "llamacpp")
    body = orjson.dumps({"model": model, "messages": [_user("lorem ipsum " * 12_000)]})
    with retry_proxy.http_client() as http:
        through = http.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert len(upstream.requests(CHAT)) == 1, "no retry: it would be refused again"
    direct = upstream.client.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert through.status_code == direct.status_code == 400
    assert through.content == direct.content
    assert through.json()["error"]["type"] == "exceed_context_size_error"
    assert "x-compaction-retry" not in through.headers


def test_a_400_that_is_no_overflow_is_never_retried(
    retry_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    model = "local-bad-parameter"
    _enforce(upstream, model)
    body = orjson.dumps({"model": model, "messages": conversation()})
    headers = {
        "content-type": "application/json",
        "X-Fake-Status": "400",
        "X-Fake-Error-Message": "Invalid value for 'temperature': must be at most 2.",
    }
    with retry_proxy.http_client() as http:
        through = http.post(CHAT, content=body, headers=headers)
    assert len(upstream.requests(CHAT)) == 1
    direct = upstream.client.post(CHAT, content=body, headers=headers)
    assert through.status_code == 400
    assert through.content == direct.content
    assert "x-compaction-retry" not in through.headers


@pytest.mark.parametrize("header", ["off", "dry-run"])
def test_compaction_off_never_retries_nor_learns(
    client: openai.OpenAI, upstream: UpstreamServer, header: str
) -> None:
    model = f"local-compaction-{header}"
    _enforce(upstream, model, "vllm")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model,
            messages=conversation(),  # type: ignore[arg-type]
            extra_headers={"X-Compaction": header},
        )
    assert "maximum context length is 16384 tokens" in caught.value.message
    assert len(upstream.requests(CHAT)) == 1
    # Nothing was learned from it: the next (normal) request still meets the wall once.
    upstream.clear()
    headers, _, _ = _chat(client, model, conversation(), stream=False)
    assert headers["x-compaction-retry"] == "1"
    assert len(upstream.requests(CHAT)) == 2


# ----------------------------------------------------------------------------- learned, restarted


def _gauge(metrics: str, model: str, source: str) -> float | None:
    pattern = re.compile(r"^compaction_proxy_context_window_tokens\{([^}]*)\} (\S+)$", re.MULTILINE)
    for labels, value in pattern.findall(metrics):
        if f'model="{model}"' in labels and f'source="{source}"' in labels:
            return float(value)
    return None


def test_a_learned_window_survives_a_restart(
    proxy_factory: Any, upstream: UpstreamServer, tmp_path: Path
) -> None:
    model = "local-restarted"
    _enforce(upstream, model, "openai")
    store = {"backend": "sqlite", "path": str(tmp_path / "shared.db")}
    config = _config(upstream, store=store, windows={"discover": False})

    first: ProxyServer = proxy_factory(config)
    headers, _, _ = _chat(first.openai_client(), model, conversation(), stream=False)
    assert headers["x-compaction-retry"] == "1"
    with first.http_client() as http:
        metrics = http.get("/metrics").text
        windows = http.get("/dashboard/data").json()["windows"]
    assert _gauge(metrics, model, "learned") == WINDOW
    assert re.search(
        r'compaction_proxy_overflow_retries_total\{outcome="fixed",upstream="fake"\} 1\.0', metrics
    ), metrics
    assert [(w["upstream"], w["model"], w["window"], w["source"]) for w in windows] == [
        ("fake", model, WINDOW, "learned")
    ]
    first.stop()

    upstream.clear()
    second: ProxyServer = proxy_factory(config)
    headers, text, _ = _chat(second.openai_client(), model, conversation(), stream=True)
    assert text == "echo: Summarise what you found."
    assert len(upstream.requests(CHAT)) == 1, "the restarted proxy did not hit the wall again"
    assert "x-compaction-retry" not in headers
    with second.http_client() as http:
        assert _gauge(http.get("/metrics").text, model, "learned") == WINDOW


# ----------------------------------------------------------------------------- published windows


@pytest.mark.parametrize("style", ["vllm", "openrouter", "lmstudio"])
def test_a_published_window_is_used_before_any_refusal(
    proxy_factory: Any, upstream: UpstreamServer, style: str
) -> None:
    published, pinned = "local-published", "local-pinned"
    upstream.control(
        models=[*DEFAULT_MODELS, published, pinned],
        model_context_windows={published: WINDOW, pinned: WINDOW},
        publish_windows=style,
    )
    # The config knows `pinned` as smaller than the upstream says: the config wins.
    proxy: ProxyServer = proxy_factory(
        _config(upstream, models={pinned: {"context_window": 10_000}})
    )
    client = proxy.openai_client()

    headers, text, usage = _chat(client, published, conversation(), stream=False)
    assert text == "echo: Summarise what you found."
    assert len(upstream.requests(CHAT)) == 1, "compacted to fit before the first refusal"
    assert len(upstream.requests("/v1/models")) == 1
    assert "x-compaction-retry" not in headers
    assert usage is not None and usage < WINDOW
    discovered_after = int(headers["x-compaction-tokens-after"])

    pinned_headers, _, _ = _chat(client, pinned, conversation(), stream=False)
    assert len(upstream.requests(CHAT)) == 2
    assert int(pinned_headers["x-compaction-tokens-after"]) < discovered_after

    with proxy.http_client() as http:
        metrics = http.get("/metrics").text
    assert _gauge(metrics, published, "discovered") == WINDOW
    assert _gauge(metrics, pinned, "discovered") is None
    assert len(upstream.requests("/v1/models")) == 1, "the listing is read once per upstream"
