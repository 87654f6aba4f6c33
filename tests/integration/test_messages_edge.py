"""The upstream and header side of ``/v1/messages`` over real processes: the proxy under
``serve``, the fake Messages upstream (tests/fakes/messages), the official ``anthropic`` SDK and
raw HTTP as Claude Code sends it.

- A stream whose ``message_delta`` states only the output (llama.cpp's way) calibrates from its
  ``message_start``, which a long reply puts far from the stream's end.
- Claude Code's headers cross as sent (``anthropic-version``, its ``anthropic-beta`` list, the
  ``?beta=true`` query), and an upstream's own key replaces the caller's as ``x-api-key``.
- The 1M-context beta header sizes the window of a model that takes it, and only that.

They need the Messages format registered (compaction_proxy/wire/messages); a tree without it
skips them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.wire import format_for_path
from tests.observability.traffic import parse_metrics
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer, anthropic_client
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

# The Messages format serves /v1/messages: without it these tests fail, never skip.
assert format_for_path("POST", MESSAGES) is not None, "no wire format serves /v1/messages"

MODEL = "claude-sonnet-4-5"
KEYED = "claude-opus-4-5"  # routed to the same fake, through an upstream with its own key
OPERATOR = "sk-ant-operator-e2e-51d0"
CALLER = "sk-ant-caller-e2e-77aa"
CLAUDE_CODE_BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "fine-grained-tool-streaming-2025-05-14"
)
CONTEXT_1M = "context-1m-2025-08-07"
RATIO = "compaction_proxy_token_count_calibration_ratio"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("messages-edge") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    fake.reset()
    yield fake
    fake.reset()


@pytest.fixture(scope="module")
def proxy(fake: MessagesUpstreamServer, module_proxy_factory: Any) -> ProxyServer:
    config = proxy_config(
        upstream_entry(fake.url + "/v1", name="keyed", api_key=OPERATOR, models=[KEYED]),
        upstream_entry(fake.url + "/v1", name="anthropic"),
        allow_anonymous_spend=True,  # the keyed upstream, without server.api_keys
        store={"backend": "memory"},
        summarization={"enabled": False},
    )
    server: ProxyServer = module_proxy_factory(config)
    return server


def _ratio_samples(proxy: ProxyServer, model: str) -> tuple[float, float]:
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=10.0) as client:
        samples = parse_metrics(client.get("/metrics").text)
    key = (("model", model),)
    return samples.get(f"{RATIO}_count", {}).get(key, 0.0), samples.get(f"{RATIO}_sum", {}).get(
        key, 0.0
    )


def test_a_stream_whose_end_states_only_the_output_calibrates_from_message_start(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    upstream.control(delta_usage="output")
    facts = " ".join(f"FACT-E{i:04d}" for i in range(400))
    client = anthropic_client(proxy.url, CALLER)
    try:
        with client.messages.stream(
            model=MODEL,
            max_tokens=4_096,
            system="You recall facts.",
            messages=[{"role": "user", "content": f"{facts}\nfake-recall"}],
        ) as stream:
            counted = int(stream.response.headers["x-compaction-tokens-after"])
            final = stream.get_final_message()
    finally:
        client.close()
    raw = upstream.messages()[-1]
    assert raw.json()["stream"] is True
    usage = final.usage
    reported = (
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )
    assert counted >= 1_000 and reported > 0
    assert sum(len(block.text) for block in final.content if block.type == "text") > 4_096

    deadline = time.monotonic() + 10
    observed = _ratio_samples(proxy, MODEL)
    while observed[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        observed = _ratio_samples(proxy, MODEL)
    count, total = observed
    assert count == 1
    assert total == pytest.approx(reported / counted, rel=1e-6)


def test_claude_codes_headers_cross_as_sent_and_an_operator_key_as_x_api_key(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    body = {
        "model": KEYED,
        "max_tokens": 512,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    }
    raw = orjson.dumps(body)
    headers = {
        "content-type": "application/json",
        "x-api-key": CALLER,
        "authorization": "Bearer sk-ant-other-1",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": CLAUDE_CODE_BETAS,
    }
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60.0) as client:
        reply = client.post(MESSAGES + "?beta=true", content=raw, headers=headers)
    assert reply.status_code == 200, reply.text
    sent = upstream.messages()[-1]
    assert sent.query == "beta=true"
    assert sent.body == raw  # nothing to compact: the client's own bytes
    names = [name.lower() for name, _ in sent.raw_headers]
    assert names.count("x-api-key") == 1 and sent.headers["x-api-key"] == OPERATOR
    assert "authorization" not in names
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["anthropic-beta"] == CLAUDE_CODE_BETAS


def _previewed_window(proxy: ProxyServer, model: str, beta: str | None) -> int:
    body = {
        "model": model,
        "max_tokens": 512,
        "system": "A preview.",
        "messages": [{"role": "user", "content": "how big is my window?"}],
    }
    headers = {"x-api-key": CALLER, "anthropic-version": "2023-06-01"}
    if beta is not None:
        headers["anthropic-beta"] = beta
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60.0) as client:
        reply = client.post("/v1/compaction/preview", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    window: int = reply.json()["report"]["budget"]["context_window"]
    return window


def test_the_1m_beta_header_sizes_the_window_of_a_model_that_takes_it(
    proxy: ProxyServer, upstream: MessagesUpstreamServer
) -> None:
    with_1m = f"{CLAUDE_CODE_BETAS},{CONTEXT_1M}"
    assert _previewed_window(proxy, MODEL, None) == 200_000
    assert _previewed_window(proxy, MODEL, CLAUDE_CODE_BETAS) == 200_000
    assert _previewed_window(proxy, MODEL, with_1m) == 1_000_000
    assert _previewed_window(proxy, "claude-opus-4-5", with_1m) == 200_000  # not for this model
