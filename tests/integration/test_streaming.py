"""Streaming through the proxy: no buffering, the usage chunk, and cancellation on disconnect.

Timing assertions compare the fake upstream's send stamps (``t=<ms>;`` in each chunk) with the
client's receive times on the same machine's clock. Margins are wide on purpose: the machine is
small and shared; a buffering proxy fails them by whole seconds, not milliseconds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.support.assertions import CHAT_PATH, gaps, send_times_ms
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry
from tests.support.sse import iter_sse_data

USER: list[Any] = [{"role": "user", "content": "stream to me"}]
CHUNKS = 5
CHUNK_DELAY_MS = 150


def test_chunks_arrive_as_they_are_sent(
    openai_client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    stream = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        stream=True,
        extra_headers={"X-Fake-Chunks": str(CHUNKS), "X-Fake-Chunk-Delay-Ms": str(CHUNK_DELAY_MS)},
    )
    contents: list[str] = []
    received_ms: list[float] = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received_ms.append(time.time() * 1000)
            contents.append(chunk.choices[0].delta.content)
    sent_ms = send_times_ms(contents)
    assert len(sent_ms) == CHUNKS, contents
    # Nothing held back: the first chunk was in the client's hands before the last was sent.
    assert received_ms[0] < sent_ms[-1], (received_ms, sent_ms)
    # Spacing survives: most receive gaps are at least half the send gaps.
    spread = [r >= s / 2 for r, s in zip(gaps(received_ms), gaps(sent_ms), strict=True)]
    assert sum(spread) >= len(spread) - 1, (gaps(received_ms), gaps(sent_ms))


def test_raw_stream_headers_and_incremental_delivery(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    body = {"model": "gpt-4o", "stream": True, "messages": USER}
    headers = {"X-Fake-Chunks": "4", "X-Fake-Chunk-Delay-Ms": "200"}
    with proxy_http.stream("POST", CHAT_PATH, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers.get("x-accel-buffering") == "no"
        assert "no-cache" in response.headers.get("cache-control", "")
        arrivals: list[tuple[float, str]] = []
        for data in iter_sse_data(response.iter_lines()):
            arrivals.append((time.time() * 1000, data))
    assert arrivals[-1][1] == "[DONE]"
    stamped = [(t, send_times_ms([d])) for t, d in arrivals if "t=" in d]
    assert len(stamped) == 4
    first_received = stamped[0][0]
    last_sent = stamped[-1][1][0]
    assert first_received < last_sent


def test_usage_chunk_passes_through(openai_client: openai.OpenAI) -> None:
    stream = openai_client.chat.completions.create(
        model="gpt-4o", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream to me"


def test_no_usage_chunk_unless_asked(openai_client: openai.OpenAI) -> None:
    chunks = list(openai_client.chat.completions.create(model="gpt-4o", messages=USER, stream=True))
    assert chunks and all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


async def test_async_stream_with_usage(async_openai_client: openai.AsyncOpenAI) -> None:
    stream = await async_openai_client.chat.completions.create(
        model="gpt-4o", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]


def test_client_disconnect_cancels_upstream(
    openai_client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    tag = f"cancel-{uuid.uuid4().hex}"
    total = 200  # 200 x 50 ms: the upstream would still be sending long after we give up
    stream = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        stream=True,
        extra_headers={
            "X-Fake-Chunks": str(total),
            "X-Fake-Chunk-Delay-Ms": "50",
            "X-Fake-Tag": tag,
        },
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 2:
                break
    stream.close()
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag, timeout=8.0)
    assert event is not None, "the upstream never saw its request cancelled"
    assert event["type"] == "stream_cancelled"
    assert event["chunks_sent"] < total


async def test_async_client_disconnect_cancels_upstream(
    async_openai_client: openai.AsyncOpenAI, upstream: UpstreamServer
) -> None:
    tag = f"cancel-async-{uuid.uuid4().hex}"
    stream = await async_openai_client.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        stream=True,
        extra_headers={"X-Fake-Chunks": "200", "X-Fake-Chunk-Delay-Ms": "50", "X-Fake-Tag": tag},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()
    event = upstream.wait_for_event(lambda e: e.get("tag") == tag, timeout=8.0)
    assert event is not None and event["type"] == "stream_cancelled"


def test_proxy_keeps_serving_after_a_disconnect(
    openai_client: openai.OpenAI, upstream: UpstreamServer
) -> None:
    """A cancelled stream must not poison the pooled upstream connection it was using."""
    for _ in range(3):
        stream = openai_client.chat.completions.create(
            model="gpt-4o",
            messages=USER,
            stream=True,
            extra_headers={"X-Fake-Chunks": "50", "X-Fake-Chunk-Delay-Ms": "20"},
        )
        next(iter(stream))
        stream.close()
        completion = openai_client.chat.completions.create(model="gpt-4o", messages=USER)
        assert completion.choices[0].message.content == "echo: stream to me"


@pytest.fixture(scope="module")
def slow_reader_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    timeouts = {"connect": 5, "read": 2, "write": 5, "pool": 5}
    proxy: ProxyServer = module_proxy_factory(
        proxy_config(upstream_entry(fake_upstream, timeouts=timeouts))
    )
    return proxy


def test_read_timeout_bounds_gaps_not_the_whole_stream(
    slow_reader_proxy: ProxyServer, upstream: UpstreamServer
) -> None:
    # 10 chunks 300 ms apart: about 2.7 s in all, longer than the 2 s read timeout, yet no
    # single gap comes near it.
    client = slow_reader_proxy.openai_client()
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        stream=True,
        extra_headers={"X-Fake-Chunks": "10", "X-Fake-Chunk-Delay-Ms": "300"},
    )
    contents = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(send_times_ms(c or "" for c in contents)) == 10


def test_pass_through_sse_is_not_buffered(
    proxy_http: httpx.Client, upstream: UpstreamServer
) -> None:
    """Streams on other routes (the Responses API) are relayed as they arrive too."""
    headers = {"X-Fake-Chunks": str(CHUNKS), "X-Fake-Chunk-Delay-Ms": str(CHUNK_DELAY_MS)}
    arrivals: list[tuple[float, str]] = []
    with proxy_http.stream(
        "POST", "/v1/responses", json={"model": "gpt-4o", "stream": True}, headers=headers
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for data in iter_sse_data(response.iter_lines()):
            arrivals.append((time.time() * 1000, data))
    assert arrivals[-1][1] == "[DONE]"
    received_ms = [t for t, d in arrivals if "t=" in d]
    sent_ms = send_times_ms(d for _, d in arrivals)
    assert len(sent_ms) == CHUNKS
    assert received_ms[0] < sent_ms[-1], (received_ms, sent_ms)


async def test_concurrent_streams_stay_separate(
    async_openai_client: openai.AsyncOpenAI, upstream: UpstreamServer
) -> None:
    async def one(n: int) -> str:
        stream = await async_openai_client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"conversation number {n} " * 3}],
            stream=True,
            extra_headers={"X-Fake-Chunk-Delay-Ms": "20"},
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one(n) for n in range(8)))
    assert texts == [f"echo: {f'conversation number {n} ' * 3}" for n in range(8)]
    assert len(upstream.requests(CHAT_PATH)) == 8


def test_shutdown_lets_an_open_stream_finish(proxy_factory: Any, upstream: UpstreamServer) -> None:
    """SIGTERM while a stream is open: the stream still completes, then the proxy exits."""
    import signal

    proxy = proxy_factory(proxy_config(upstream_entry(upstream)))
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Fake-Chunks": "6", "X-Fake-Chunk-Delay-Ms": "300"}
    with (
        httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as client,
        client.stream("POST", CHAT_PATH, json=body, headers=headers) as response,
    ):
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert first
        assert proxy.proc is not None
        proxy.proc.send_signal(signal.SIGTERM)  # mid-stream
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]", rest[-3:]
    assert len(rest) >= 6, "every chunk sent after the signal still arrived"
    assert proxy.proc.wait(timeout=30) is not None
    assert "Application shutdown complete" in proxy.log_text()
