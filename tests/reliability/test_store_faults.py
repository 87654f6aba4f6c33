"""Store faults through real processes: the proxy, the fake upstream (8k window, and the
summarizer), a Redis that never answers, and a SQLite file holding foreign rows.

A checkpoint store is an optimisation: a store that hangs, or holds rows the proxy did not
write, must cost the checkpoint, never the request nor seconds of waiting on every request.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.checkpoints import Checkpoint, chain
from tests.integration.test_checkpoints import MODEL, WINDOW, checkpoint_config
from tests.integration.test_checkpoints import conversation_over_budget as conversation
from tests.reliability.hung_server import HungServer
from tests.support.agent_session import assert_valid_pairing, forwarded_requests
from tests.support.servers import UpstreamServer

REQUESTS = 5


@pytest.fixture
def hung_redis() -> Iterator[HungServer]:
    with HungServer(lifetime=120) as server:
        yield server


@pytest.fixture
def small_upstream(upstream_factory: Any) -> UpstreamServer:
    server: UpstreamServer = upstream_factory(WINDOW)
    return server


def test_a_redis_that_never_answers_is_marked_down_not_waited_for(
    small_upstream: UpstreamServer, proxy_factory: Any, hung_redis: HungServer
) -> None:
    proxy = proxy_factory(
        checkpoint_config(small_upstream, {"backend": "redis", "url": hung_redis.url})
    )
    client = proxy.openai_client()
    started = time.monotonic()
    for index in range(REQUESTS):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(f"H{index}")
        )
        assert raw.status_code == 200, index
        completion = raw.parse()
        assert completion.usage is not None and completion.usage.prompt_tokens < WINDOW, index
        # Held in the process: the store cannot take it (compaction_proxy/checkpoints/_held.py).
        assert raw.headers["x-compaction-checkpoint"] == "new", index
        warnings = raw.headers.get_list("x-compaction-warning")
        assert any("store unavailable" in w for w in warnings), (index, warnings)
        assert any("kept in this process's memory only" in w for w in warnings), warnings
        assert not any("compaction failed" in w for w in warnings), (index, warnings)
    elapsed = time.monotonic() - started
    # Every store call waiting out its 3 s timeout: about 4 x 3 s a request, 60 s in all.
    assert elapsed < 15, f"{REQUESTS} requests took {elapsed:.1f}s against a hung Redis"
    assert hung_redis.accepted >= 1, "the proxy did reach the hung Redis"
    assert_valid_pairing(forwarded_requests(small_upstream)[-1]["messages"])
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        ready = http.get("/readyz")
        metrics = http.get("/metrics").text
    # Degraded, not unavailable: every request was served (docs/deploy.md, readiness).
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    check = ready.json()["checks"]["store:redis"]
    assert "marked down since" in check and "127.0.0.1" not in check  # no host in the page
    for operation in ("read", "write"):
        labels = f'backend="redis",operation="{operation}"'
        assert f"compaction_proxy_store_up{{{labels}}} 0.0" in metrics
        assert f"compaction_proxy_store_breaker_opened_total{{{labels}}}" in metrics
    skipped = next(
        line
        for line in metrics.splitlines()
        if line.startswith(
            'compaction_proxy_store_calls_skipped_total{backend="redis",operation="read"}'
        )
    )
    assert float(skipped.rsplit(" ", 1)[1]) >= 1  # later calls did not wait at all


# --------------------------------------------------------------------------- foreign rows

FOREIGN_MESSAGES = orjson.dumps(
    {"v": 1, "messages": [42, "x", None, {"role": 7}], "created_at": 1.0, "meta": {}}
)
FOREIGN_ROLE = '{"v": 1, "messages": [{"role": "wizard", "content": "hi"}], "created_at": 1}'
TRUNCATED = Checkpoint(({"role": "user", "content": "cut"},), 1.0).to_bytes()[:-5]


def _rows(db: Path) -> dict[tuple[str, str], Any]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT namespace, key, value FROM checkpoints").fetchall()
    conn.close()
    return {(ns, key): value for ns, key, value in rows}


def _write(db: Path, namespace: str, key: str, value: bytes | str) -> None:
    """As another program would: straight into the table, no checkpoint format."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)",
            (namespace, key, value, time.time() + 3600),
        )
    conn.close()


@pytest.mark.parametrize("keep_valid", [True, False], ids=["valid-behind", "all-foreign"])
def test_foreign_rows_in_sqlite_cost_a_miss_and_are_deleted(
    small_upstream: UpstreamServer, proxy_factory: Any, tmp_path: Path, keep_valid: bool
) -> None:
    db = tmp_path / "checkpoints.db"
    proxy = proxy_factory(checkpoint_config(small_upstream, {"backend": "sqlite", "path": str(db)}))
    client = proxy.openai_client()
    messages = conversation("X")
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert first.headers["x-compaction-checkpoint"] == "new"
    stored = [key for key in _rows(db) if key[0] != "summary-results"]
    assert len(stored) == 1, stored
    namespace, valid_key = stored[0]

    # The next turn's longer prefixes hold foreign rows; the stored checkpoint is kept valid
    # (it must be found behind them) or made foreign too.
    messages += [
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "and now?"},
    ]
    hashes = chain(namespace, messages[1:])
    assert hashes[-3] == valid_key, "the first request's checkpoint covers all it sent"
    _write(db, namespace, hashes[-1], FOREIGN_MESSAGES)
    _write(db, namespace, hashes[-2], FOREIGN_ROLE)  # as TEXT, not a BLOB
    if not keep_valid:
        _write(db, namespace, valid_key, TRUNCATED)

    second = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert second.status_code == 200
    completion = second.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens < WINDOW
    warnings = second.headers.get_list("x-compaction-warning")
    assert not any("compaction failed" in w for w in warnings), warnings
    forwarded = forwarded_requests(small_upstream)[-1]["messages"]
    assert_valid_pairing(forwarded)
    assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in forwarded)
    if keep_valid:
        assert second.headers["x-compaction-checkpoint"] in ("hit", "new")
        # The forwarded prefix continues from the stored checkpoint found behind the rows.
        first_sent = forwarded_requests(small_upstream)[0]["messages"]
        assert forwarded[: len(first_sent)] == first_sent
    else:
        assert second.headers["x-compaction-checkpoint"] == "new"

    rows = _rows(db)
    for key in (hashes[-1], hashes[-2]):
        assert (namespace, key) not in rows or Checkpoint.from_bytes(rows[(namespace, key)])
    if keep_valid:
        assert (namespace, valid_key) in rows
    else:
        assert (namespace, valid_key) not in rows, "the truncated row is gone too"
