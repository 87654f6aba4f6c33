"""The ``e2e`` marker is honest (tests/support/process_guard.py): an unmarked test that starts a
process fails, a marked one may, and the shared process fixtures mark their tests."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import process_guard


def test_an_unmarked_test_that_starts_a_process_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(process_guard.RECORD_ENV, raising=False)
    with pytest.raises(AssertionError, match="is not marked e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_an_unmarked_test_that_spawns_a_pool_worker_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(process_guard.RECORD_ENV, raising=False)
    worker = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(AssertionError, match="is not marked e2e"):
        worker.start()


@pytest.mark.e2e
def test_a_marked_test_may_start_one() -> None:
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0


def test_the_shared_process_fixtures_mark_their_tests() -> None:
    def item(*names: str) -> Any:
        return SimpleNamespace(fixturenames=names)

    assert process_guard.uses_processes(item("tmp_path", "proxy"))
    assert process_guard.uses_processes(item("redis_url"))
    assert not process_guard.uses_processes(item("tmp_path", "monkeypatch"))


def test_the_marks_reach_the_collected_tests(request: pytest.FixtureRequest) -> None:
    """This very test asks for no process fixture, so it carries no mark."""
    assert request.node.get_closest_marker("e2e") is None
