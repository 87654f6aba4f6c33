"""Calibration learns from gzipped replies, over real processes.

The upstream is the fake behind a compressing front (tests/fakes/gzip_upstream.py) that
gzips whatever the client accepts and reports 1.5x the prompt tokens tiktoken counts, as a
model with another tokenizer would. The client is the official SDK, which asks for gzip. The
proxy relays the compressed bytes untouched and must still read ``usage.prompt_tokens`` from
them: the ratio it learnt shows in the preview's report (``calibration``) and on /metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.observability.traffic import parse_metrics, value
from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

SCALE = 1.5
MODELS = {
    name: {"context_window": 32_000, "max_output_tokens": 1_000}
    for name in ("json-model", "stream-model", "plain-model")
}


class GzipUpstream(UpstreamServer):
    """The fake upstream behind :class:`tests.fakes.gzip_upstream.CompressingFront`."""

    def __init__(self, log_path: Path, usage_scale: float) -> None:
        ServerProcess.__init__(
            self,
            "gzip-upstream",
            lambda port: python_module_argv(
                "tests.fakes.gzip_upstream",
                *("--host", "127.0.0.1", "--port", str(port)),
                *("--usage-scale", str(usage_scale)),
            ),
            log_path,
            ready_path="/_control",
        )
        self._client = None


@pytest.fixture(scope="module")
def gzip_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GzipUpstream]:
    server = GzipUpstream(tmp_path_factory.mktemp("gzip") / "upstream.log", SCALE)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gzip_proxy(module_proxy_factory: Any, gzip_upstream: GzipUpstream) -> ProxyServer:
    return module_proxy_factory(proxy_config(upstream_entry(gzip_upstream), models=MODELS))


def _conversation(topic: str) -> list[dict[str, Any]]:
    """~1,600 tokens by our count: over the calibration floor, well under any trigger."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(6):
        messages.append({"role": "user", "content": f"{topic} {i}: " + "lorem ipsum dolor " * 80})
        messages.append({"role": "assistant", "content": f"noted {i}"})
    messages.append({"role": "user", "content": f"What about {topic}?"})
    return messages


def _calibration(proxy: ProxyServer, model: str) -> float:
    with proxy.http_client() as client:
        response = client.post(
            "/v1/compaction/preview", json={"model": model, "messages": _conversation("probe")}
        )
    assert response.status_code == 200, response.text
    ratio = response.json()["report"]["calibration"]
    assert isinstance(ratio, float)
    return ratio


def _observed(proxy: ProxyServer, model: str) -> float:
    with proxy.http_client() as client:
        samples = parse_metrics(client.get("/metrics").text)
    return value(samples, "compaction_proxy_token_count_calibration_ratio_count", model=model)


def test_the_front_really_gzips(gzip_upstream: GzipUpstream) -> None:
    body = {"model": "json-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=gzip_upstream.url, trust_env=False) as client:
        zipped = client.post("/v1/chat/completions", json=body)  # httpx asks for gzip
        plain = client.post(
            "/v1/chat/completions", json=body, headers={"Accept-Encoding": "identity"}
        )
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert zipped.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]


def test_json_replies_in_gzip_calibrate(gzip_proxy: ProxyServer) -> None:
    assert _calibration(gzip_proxy, "json-model") == 1.0
    with gzip_proxy.openai_client() as client:
        for n in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model="json-model", messages=_conversation(f"json {n}")
            )
            assert raw.headers["content-encoding"] == "gzip"  # relayed compressed
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.prompt_tokens > 2_000
    assert _calibration(gzip_proxy, "json-model") == pytest.approx(SCALE, rel=0.05)
    assert _observed(gzip_proxy, "json-model") == 3


def test_sse_streams_in_gzip_calibrate(gzip_proxy: ProxyServer) -> None:
    assert _calibration(gzip_proxy, "stream-model") == 1.0
    with gzip_proxy.openai_client() as client:
        for n in range(2):
            with client.chat.completions.with_streaming_response.create(
                model="stream-model",
                messages=_conversation(f"stream {n}"),
                stream=True,
                stream_options={"include_usage": True},
            ) as raw:
                assert raw.headers["content-encoding"] == "gzip"
                usage = [chunk.usage for chunk in raw.parse() if chunk.usage is not None]
            assert len(usage) == 1 and usage[0].prompt_tokens > 2_000
    assert _calibration(gzip_proxy, "stream-model") == pytest.approx(SCALE, rel=0.05)
    assert _observed(gzip_proxy, "stream-model") == 2


def test_a_client_that_asks_for_no_compression_calibrates_too(gzip_proxy: ProxyServer) -> None:
    body = {"model": "plain-model", "messages": _conversation("plain")}
    with gzip_proxy.http_client(headers={"Accept-Encoding": "identity"}) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    assert _calibration(gzip_proxy, "plain-model") == pytest.approx(SCALE, rel=0.05)
