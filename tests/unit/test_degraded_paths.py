"""Degraded paths seen from outside: a checkpoint store whose writes fail, a summarizer that
fails, a recall archive that cannot be read. Each shows on the response
(``X-Compaction-Warning``), in ONE warning log line when it starts and ONE when it recovers
(with the count between), and in ``/metrics``; and a full disk does not make every request pay
the summarizer again (compaction_proxy/engine/_degraded.py, compaction_proxy/checkpoints/_held.py).

The app runs in-process over a real SQLite file; respx plays the upstream and the summarizer.
A full disk is SQLite's own "database or disk is full": ``PRAGMA max_page_count`` pins the file
at its size.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.api._recall_stats import RecallStats
from compaction_proxy.app import ProxyApp
from compaction_proxy.checkpoints import (
    Archive,
    Checkpoint,
    MemoryStore,
    SqliteStore,
    StoreBreaker,
    StoreUnavailable,
    archive_namespace,
)
from compaction_proxy.compaction.settings import RecallSettings
from compaction_proxy.compaction.tokens import CharacterEstimatorTokenizer
from compaction_proxy.config import Settings
from compaction_proxy.engine import DegradedPaths, RecallDesk
from compaction_proxy.observability.telemetry import Telemetry
from compaction_proxy.wire.recall import RecallCall
from tests.observability.traffic import parse_metrics, value
from tests.support.agent_session import is_summarizer_text
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

UPSTREAM = "http://up.test/v1"
MODEL = "small-model"
REQUESTS = 15
DEGRADED = "compaction_proxy.degraded"


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


@dataclass
class Upstream:
    """The model and the summarizer, with what they were asked: ``summarizer`` answers a
    summary (ok) or fails it with a status (a misconfigured summarizer model's 404)."""

    summaries: int = 0
    summarizer_status: int = 200
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if is_summarizer_text(request.content.decode()):
            self.summaries += 1
            if self.summarizer_status != 200:
                error = {
                    "error": {
                        "message": "The model `summ-nope` does not exist",
                        "type": "invalid_request_error",
                        "code": "model_not_found",
                    }
                }
                return httpx.Response(self.summarizer_status, json=error)
            return httpx.Response(200, json=completion("## Goal\nFix the parser."))
        self.bodies.append(orjson.loads(request.content))
        return httpx.Response(200, json=completion("ok"))


@dataclass
class Proxy:
    app: ProxyApp
    upstream: Upstream
    client: httpx.AsyncClient

    @property
    def store(self) -> StoreBreaker:
        store = self.app.state.store
        assert isinstance(store, StoreBreaker)
        return store

    async def chat(self, messages: list[dict[str, Any]]) -> httpx.Response:
        response = await self.client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages}
        )
        assert response.status_code == 200, response.text
        return response

    async def metrics(self) -> dict[str, Any]:
        return parse_metrics((await self.client.get("/metrics")).text)

    async def disk_full(self, full: bool = True) -> None:
        """SQLite's file pinned at its size and every page of it filled (SQLITE_FULL on any
        write that needs room), or free to grow again."""
        sqlite = self.store.inner
        assert isinstance(sqlite, SqliteStore)
        await sqlite._run(_fill if full else _free)


def _fill(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA max_page_count = 1")  # the least it may be: the file's current size
    rows = 0
    with contextlib.suppress(sqlite3.OperationalError):  # database or disk is full
        while True:  # filler rows in a namespace nobody reads, never expiring
            conn.execute(
                "INSERT INTO checkpoints VALUES ('filler', ?, zeroblob(64), 1e12)", (str(rows),)
            )
            rows += 1


def _free(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA max_page_count = 1073741823")


Build = Callable[..., Proxy]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Build]:
    built: list[Proxy] = []

    def build(name: str = "a", **summarization: Any) -> Proxy:
        settings = Settings(
            upstreams=[{"name": "up", "base_url": UPSTREAM}],
            models={MODEL: {"context_window": 4000, "max_output_tokens": 500}},
            store={"backend": "sqlite", "path": str(tmp_path / name / "checkpoints.db")},
            summarization={"enabled": True, "prepare": False, **summarization},
        )
        upstream = Upstream()
        mock = respx.MockRouter(assert_all_called=False)
        mock.post(f"{UPSTREAM}/chat/completions").mock(side_effect=upstream)
        app = in_process(settings, httpx.AsyncClient(transport=_RespxTransport(mock)))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
        proxy = Proxy(app, upstream, client)
        built.append(proxy)
        return proxy

    yield build
    for proxy in built:
        await proxy.client.aclose()
        await proxy.app.state.transport.aclose()
        await proxy.app.state.store.close()
        proxy.app.state.compactor.close()


def opening(tag: str, turns: int = 10) -> list[dict[str, Any]]:
    """A conversation over the trigger (about 3,100 tokens of a 3,300-token budget)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{tag} question {i} " + "x " * 300})
        messages.append({"role": "assistant", "content": f"{tag} answer {i}"})
    messages.append({"role": "user", "content": f"{tag}: the newest question"})
    return messages


def grow(messages: list[dict[str, Any]], step: int) -> None:
    """One more turn of about 610 tokens: a compaction event every few requests."""
    messages.append({"role": "assistant", "content": f"answer to step {step}"})
    messages.append({"role": "user", "content": f"step {step} " + "y " * 600})


async def session(proxy: Proxy, tag: str, requests: int = REQUESTS) -> list[httpx.Response]:
    messages = opening(tag)
    responses = []
    for step in range(requests):
        responses.append(await proxy.chat(messages))
        grow(messages, step)
    return responses


def warnings_of(response: httpx.Response) -> list[str]:
    return response.headers.get_list("x-compaction-warning")


def degraded_lines(caplog: pytest.LogCaptureFixture, what: str) -> tuple[list[str], list[str]]:
    """The WARNING lines that say ``what`` started failing, and those that say it recovered."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == DEGRADED and r.levelno == logging.WARNING
    ]
    return (
        [line for line in lines if line.startswith(f"degraded: {what}:")],
        [line for line in lines if line.startswith(f"recovered: {what} works again")],
    )


# ------------------------------------------------------------------ the store's writes


async def test_a_full_disk_does_not_multiply_summarizer_calls(make: Build) -> None:
    """15 requests of one growing conversation: about as many summaries on a full disk as on
    a working one (the checkpoints the store refused are held in the process)."""
    working = make("working")
    for response in await session(working, "W"):
        assert not any("not stored" in w for w in warnings_of(response))
    full = make("full")
    await full.disk_full()
    responses = await session(full, "F")
    assert any("kept in this process's memory only" in w for w in warnings_of(responses[0]))
    assert working.upstream.summaries >= 3
    assert full.upstream.summaries <= working.upstream.summaries + 1, (
        full.upstream.summaries,
        working.upstream.summaries,
    )
    # The held checkpoints are used as the stored ones are: hits, and the same prefix.
    assert [r.headers["x-compaction-checkpoint"] for r in responses].count("hit") >= REQUESTS // 2


async def test_failing_writes_warn_on_each_response_and_log_once_until_they_recover(
    make: Build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = make()
    now = [0.0]
    proxy.store.clock = lambda: now[0]  # the breaker's back-off, stepped by the test
    await proxy.disk_full()
    affected = 0
    for response in await session(proxy, "D"):
        said = [w for w in warnings_of(response) if "checkpoint not stored" in w]
        if response.headers["x-compaction-checkpoint"] == "new":
            assert said == [
                "checkpoint not stored (sqlite unavailable); kept in this process's memory only"
            ], warnings_of(response)
            affected += 1
        else:
            assert said == []
    assert affected >= 3
    started, recovered = degraded_lines(caplog, "checkpoint store writes")
    assert len(started) == 1 and recovered == [], started
    assert "checkpoint not stored (sqlite unavailable)" in started[0]
    metrics = await proxy.metrics()
    assert value(metrics, "compaction_proxy_degraded", path="store_writes") == 1
    assert value(metrics, "compaction_proxy_degraded_requests_total", path="store_writes") == (
        affected
    )
    assert value(metrics, "compaction_proxy_degraded_episodes_total", path="store_writes") == 1

    # Space again, and the breaker's back-off over: the next event's checkpoint is stored.
    await proxy.disk_full(False)
    now[0] += 120.0
    after = await session(proxy, "E", requests=1)
    assert after[0].headers["x-compaction-checkpoint"] == "new"
    assert not any("not stored" in w for w in warnings_of(after[0]))
    started, recovered = degraded_lines(caplog, "checkpoint store writes")
    assert len(started) == 1 and len(recovered) == 1, recovered
    assert f"after {affected} affected request(s)" in recovered[0]
    metrics = await proxy.metrics()
    assert value(metrics, "compaction_proxy_degraded", path="store_writes") == 0
    assert value(metrics, "compaction_proxy_degraded_requests_total", path="store_writes") == (
        affected
    )


# ------------------------------------------------------------------ the summarizer


async def test_a_failing_summarizer_logs_once_counts_every_request_and_recovers(
    make: Build, caplog: pytest.LogCaptureFixture
) -> None:
    """A misconfigured summarizer model (404), on every request: its failures and the
    back-offs after them are one warning, not one per request (nor INFO), until a summary is
    made again."""
    caplog.set_level(logging.INFO)
    proxy = make(model="summ-nope")
    proxy.upstream.summarizer_status = 404
    failed = 0
    for tag in ("A", "B"):  # two conversations: two calls, and back-offs after each
        messages = opening(tag)
        for step in range(3):
            response = await proxy.chat(messages)
            warnings = " ".join(warnings_of(response))
            assert "summarization failed" in warnings, warnings
            failed += 1
            grow(messages, step)
    assert proxy.upstream.summaries == 2
    started, recovered = degraded_lines(caplog, "summarizer")
    assert len(started) == 1 and recovered == [], started
    assert "HTTP 404 (model_not_found)" in started[0]
    metrics = await proxy.metrics()
    assert value(metrics, "compaction_proxy_degraded", path="summarizer") == 1
    assert value(metrics, "compaction_proxy_degraded_requests_total", path="summarizer") == failed

    proxy.upstream.summarizer_status = 200  # the model fixed
    response = await proxy.chat(opening("C"))
    assert "summarization" in response.headers["x-compaction-strategies"]
    started, recovered = degraded_lines(caplog, "summarizer")
    assert len(started) == 1 and len(recovered) == 1
    assert f"after {failed} affected request(s)" in recovered[0]
    assert value(await proxy.metrics(), "compaction_proxy_degraded", path="summarizer") == 0


# ------------------------------------------------------------------ the recall archive


class _Unreadable(MemoryStore):
    """A store whose reads fail while ``failing`` is set."""

    failing = True

    async def find_longest(self, namespace: str, keys: Any) -> tuple[int, Checkpoint] | None:
        if self.failing:
            raise StoreUnavailable("unreadable")
        return await super().find_longest(namespace, keys)


async def test_an_unreadable_archive_is_one_degraded_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    paths = DegradedPaths()
    settings = RecallSettings(enabled=True, max_tokens=400)
    store = _Unreadable()
    count = CharacterEstimatorTokenizer().count_text
    desk = RecallDesk(Archive(store, settings), settings, count, paths.recall)
    namespace = archive_namespace("Bearer sk-test", None)
    call = RecallCall("call_1", orjson.dumps({"ids": ["rabcdefghijk"]}).decode())
    for _ in range(3):
        recalled = await desk.answer(namespace, frozenset({"rabcdefghijk"}), call)
        assert recalled.unavailable
    started, recovered = degraded_lines(caplog, "recall archive")
    assert len(started) == 1 and recovered == []
    telemetry = Telemetry(Settings(upstreams=[{"name": "up", "base_url": UPSTREAM}]))
    telemetry.watch_degraded(paths)
    metrics = parse_metrics(telemetry.exposition().decode())
    assert value(metrics, "compaction_proxy_degraded", path="recall") == 1
    assert value(metrics, "compaction_proxy_degraded_requests_total", path="recall") == 3
    store.failing = False
    assert not (await desk.answer(namespace, frozenset({"rabcdefghijk"}), call)).unavailable
    started, recovered = degraded_lines(caplog, "recall archive")
    assert len(recovered) == 1 and "after 3 affected request(s)" in recovered[0]
    # The response's own word for it, beside X-Compaction-Recall.
    stats = RecallStats(calls=1, unavailable=True)
    assert [name for name, _ in stats.headers()] == [
        b"x-compaction-recall",
        b"x-compaction-warning",
    ]
    assert b"recall archive unavailable" in stats.headers()[1][1]
    assert RecallStats(calls=1).headers() == [RecallStats(calls=1).header()]
