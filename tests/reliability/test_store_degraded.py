"""A store that fails one way only, through real processes: the proxy on a real SQLite file whose
disk fills up under it, and a Redis that goes away.

A failed write must not disable reads: the checkpoints already stored keep being hit (no
summarizer call, the same prefix for the upstream's prompt cache) while the writes back off.
And a degraded store is no reason to leave the load balancer's rotation: ``/readyz`` says
"degraded" with a 200, and every request is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_checkpoints import MODEL, WINDOW, checkpoint_config
from tests.integration.test_checkpoints import conversation_over_budget as conversation
from tests.observability.traffic import parse_metrics, value
from tests.reliability.limits import PipedProxy
from tests.support.agent_session import (
    assert_valid_pairing,
    count_summarizer_calls,
    forwarded_requests,
)
from tests.support.redis_server import RedisServer
from tests.support.servers import ProxyServer, UpstreamServer, write_config

CONVERSATIONS = ("A", "B", "C", "D")
TURNS = 4  # per conversation once the disk is full


@pytest.fixture
def small_upstream(upstream_factory: Any) -> UpstreamServer:
    server: UpstreamServer = upstream_factory(WINDOW)
    return server


def _ask(client: Any, messages: list[dict[str, Any]]) -> Any:
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert raw.status_code == 200
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens < WINDOW
    return raw


def _state(proxy: ProxyServer) -> tuple[httpx.Response, dict[str, Any]]:
    with proxy.http_client() as http:
        ready = http.get("/readyz")
        metrics = parse_metrics(http.get("/metrics").text)
    return ready, metrics


def test_a_full_disk_keeps_the_stored_checkpoints_in_use(
    small_upstream: UpstreamServer, tmp_path: Path
) -> None:
    db = tmp_path / "data" / "checkpoints.db"
    config = checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(db)})
    proxy = PipedProxy(write_config(tmp_path / "proxy.yaml", config), tmp_path / "proxy.log")
    proxy.start()
    try:
        client = proxy.openai_client()
        chats = {tag: conversation(tag) for tag in CONVERSATIONS}
        for messages in chats.values():
            assert _ask(client, messages).headers["x-compaction-checkpoint"] == "new"
        before_full = count_summarizer_calls(small_upstream)
        assert before_full >= len(CONVERSATIONS)
        first_sent = {tag: forwarded_requests(small_upstream)[i] for i, tag in enumerate(chats)}

        # The disk is full for the proxy: no file of it can grow (nor be written past 32 KiB,
        # and the SQLite file and its WAL are past that already).
        proxy.fill_disk(32 * 1024)
        small_upstream.clear()

        # A new conversation is a real compaction event: summarized, its checkpoint not stored
        # (the write fails: the writes are marked down) but held in the process, and the
        # response says so.
        new = conversation("NEW")
        fresh = _ask(client, new)
        assert fresh.headers["x-compaction-checkpoint"] == "new"
        assert fresh.headers.get_list("x-compaction-warning") == [
            "checkpoint not stored (sqlite unavailable); kept in this process's memory only"
        ]

        checkpoints: list[str] = []
        for turn in range(TURNS):
            for tag, messages in chats.items():
                messages += [
                    {"role": "assistant", "content": f"noted {turn}"},
                    {"role": "user", "content": f"go on with {tag}, step {turn}"},
                ]
                raw = _ask(client, messages)
                checkpoints.append(raw.headers["x-compaction-checkpoint"])
                warnings = raw.headers.get_list("x-compaction-warning")
                assert not any("compaction failed" in w for w in warnings), warnings
            new += [
                {"role": "assistant", "content": f"noted {turn}"},
                {"role": "user", "content": f"go on with NEW, step {turn}"},
            ]
            # The new conversation goes on from the checkpoint held in memory: a hit, no
            # summarizer call.
            checkpoints.append(_ask(client, new).headers["x-compaction-checkpoint"])
        assert checkpoints == ["hit"] * (TURNS * (len(CONVERSATIONS) + 1)), checkpoints
        # One summarizer call for the one compaction event; none for the hits.
        assert count_summarizer_calls(small_upstream) == 1
        sent = [
            r for r in forwarded_requests(small_upstream)[1:] if "NEW" not in str(r["messages"])
        ]
        for index, tag in enumerate(chats):
            # Each continues the prefix it was sent before the disk filled (the prompt cache).
            later, before = sent[index]["messages"], first_sent[tag]["messages"]
            assert later[: len(before)] == before, tag
            assert_valid_pairing(later)

        ready, metrics = _state(proxy)
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["status"] == "degraded"
        check = body["checks"]["store:sqlite"]
        assert check.startswith("degraded: reads ok; writes marked down since"), check
        assert str(tmp_path) not in check
        assert value(metrics, "compaction_proxy_store_up", backend="sqlite", operation="read") == 1
        assert value(metrics, "compaction_proxy_store_up", backend="sqlite", operation="write") == 0
        opened = "compaction_proxy_store_breaker_opened_total"
        assert value(metrics, opened, backend="sqlite", operation="read") == 0
        assert value(metrics, opened, backend="sqlite", operation="write") >= 1
        assert value(metrics, "compaction_proxy_degraded", path="store_writes") == 1
        assert value(metrics, "compaction_proxy_degraded_requests_total", path="store_writes") == 1
    finally:
        proxy.stop()
    log = proxy.log_text()
    assert "Traceback" not in log, log[-4000:]
    assert "writes marked down" in log
    assert "checkpoint not stored" in log, "the new conversation's checkpoint could not be"
    # Said once when the writes started failing, not once per request.
    assert log.count("degraded: checkpoint store writes") == 1, log[-4000:]


def test_readiness_with_redis_gone_is_degraded_not_unavailable(
    small_upstream: UpstreamServer, proxy_factory: Any, own_redis: RedisServer
) -> None:
    """With the documented Kubernetes probe a 503 here would take every replica out of the
    rotation at once, although each one still serves every request."""
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "redis", "url": own_redis.url})
    )
    client = proxy.openai_client()
    ready, _ = _state(proxy)
    assert (ready.status_code, ready.json()["status"]) == (200, "ok")

    own_redis.stop()
    for index in range(3):
        raw = _ask(client, conversation(f"R{index}"))
        # Held in the process: the store cannot take it (compaction_proxy/checkpoints/_held.py).
        assert raw.headers["x-compaction-checkpoint"] == "new"
    ready, metrics = _state(proxy)
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "degraded"
    check = body["checks"]["store:redis"]
    assert check.startswith("degraded: reads and writes marked down since"), check
    assert "127.0.0.1" not in check
    assert body["checks"]["upstream_client"] == "ok" and body["checks"]["tokenizer"] == "ok"
    for operation in ("read", "write"):
        up = value(metrics, "compaction_proxy_store_up", backend="redis", operation=operation)
        assert up == 0, operation
