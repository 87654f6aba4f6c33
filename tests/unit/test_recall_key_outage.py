"""A store that cannot give the archive's key before any is known (docs/recall.md, "Whose
originals"): recall ids are keyed by a secret kept in the store, so without it the request is
compacted without recall (never with ids anyone could compute), and says so: a warning header,
one log line when it starts and one when it ends, a metric (the recall degraded path,
compaction_proxy/engine/_degraded.py); no checkpoint is stored, so the
stretch is compacted again, with marks, once the key can be read.

In-process (build_edge, respx as the upstream), the memory backend; the archive's key store is
swapped for one that fails while ``down``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from compaction_proxy.checkpoints import Checkpoint, MemoryStore, StoredValues, StoreUnavailable
from tests.unit.test_memory_archive_bound import Edge, conversation, edge_for

__all__ = ["edge_for"]  # the fixture, shared


class FlakyStore(MemoryStore):
    """A memory store every call of which fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        if self.down:
            raise StoreUnavailable("connection refused")
        return await super().find_longest(namespace, keys)


async def metric(edge: Edge) -> float:
    text = (await edge.client.get("/metrics")).text
    line = next(
        line
        for line in text.splitlines()
        if line.startswith('compaction_proxy_degraded_requests_total{path="recall"} ')
    )
    return float(line.rsplit(" ", 1)[1])


async def test_without_the_key_a_request_runs_without_recall_and_says_so(
    edge_for: Any, caplog: pytest.LogCaptureFixture
) -> None:
    edge: Edge = edge_for()
    archive = edge.app.state.archive
    assert archive is not None
    flaky = FlakyStore()
    archive.keys.values = StoredValues(flaky)
    caplog.set_level(logging.WARNING, logger="compaction_proxy.degraded")
    messages = conversation("alice")

    for _ in range(2):
        response = await edge.send(messages, "alice")
        warning = " ".join(response.headers.get_list("x-compaction-warning"))
        assert "the archive's key could not be read" in warning
        assert response.headers["x-compaction-checkpoint"] == "none"  # nothing stored
        assert response.headers["x-compaction-strategies"] != "none"  # still compacted
        assert b"recall id" not in edge.mock.calls.last.request.content
    assert await metric(edge) == 2

    flaky.down = False
    response = await edge.send(messages, "alice")
    assert "x-compaction-warning" not in response.headers
    assert response.headers["x-compaction-checkpoint"] == "new"
    assert b"recall id" in edge.mock.calls.last.request.content
    assert await metric(edge) == 2
    lines = [r.getMessage() for r in caplog.records if "archive's key" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "degraded: recall archive" in lines[0] and "could not be read" in lines[0]
    assert "recovered: recall archive" in lines[1] and "after 2 affected" in lines[1]
