"""The ``e2e`` marker, kept honest: a test that starts a process must carry it.

``python -m pytest -m "not e2e"`` is the fast part of the suite: everything that runs in this
process (the core, the app in-process over ASGI, respx upstreams). A test is ``e2e`` when it
starts a real process: a proxy, a fake upstream, a redis-server, a CLI, ``git``. Most are marked
by the fixtures they use (:data:`PROCESS_FIXTURES`, in ``tests/conftest.py``); a module that
starts its processes itself says ``pytestmark = pytest.mark.e2e``.

So that the marker never lies, every ``subprocess.Popen`` (which ``subprocess.run`` and asyncio's
subprocesses go through) and every ``multiprocessing`` spawn (a process pool's worker) made
while a test without the marker runs fails that test, naming the command. With
``COMPACTION_TESTS_RECORD_PROCESSES=<file>`` such tests are listed in the file instead (one node
id a line) and run on: how the marks were found.
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
import threading
from typing import Any

import pytest

PROCESS_FIXTURES = frozenset(
    {
        "fake_upstream",
        "upstream",
        "upstream_factory",
        "upstream_factory_module",
        "proxy",
        "proxy_factory",
        "module_proxy_factory",
        "openai_client",
        "async_openai_client",
        "proxy_http",
        "redis_server",
        "redis_url",
        "own_redis",
    }
)
"""The shared fixtures that start a process (tests/conftest.py)."""

RECORD_ENV = "COMPACTION_TESTS_RECORD_PROCESSES"

_running: pytest.Item | None = None
_lock = threading.Lock()
_original_init = subprocess.Popen.__init__
_original_spawn = multiprocessing.util.spawnv_passfds


def uses_processes(item: pytest.Item) -> bool:
    """Whether ``item`` asks for a fixture that starts a process."""
    names = getattr(item, "fixturenames", ())
    return any(name in PROCESS_FIXTURES for name in names)


def set_running(item: pytest.Item | None) -> None:
    """The test being set up, run or torn down now (``None`` between tests)."""
    global _running
    _running = item


def _check(command: Any) -> None:
    """Fail (or list) the running test when it is not marked e2e."""
    item = _running
    if item is None or item.get_closest_marker("e2e") is not None:
        return
    record = os.environ.get(RECORD_ENV)
    if not record:
        raise AssertionError(
            f"{item.nodeid} starts a process ({command!r}) but is not marked e2e: add "
            "`pytestmark = pytest.mark.e2e` to its module, or @pytest.mark.e2e to it "
            "(tests/support/process_guard.py)"
        )
    with _lock, open(record, "a", encoding="utf-8") as listed:
        listed.write(f"{item.nodeid}\n")


def _guarded_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    _check(args)
    _original_init(self, args, *rest, **kwargs)


def _guarded_spawn(path: Any, args: Any, passfds: Any) -> int:
    _check(args)
    pid: int = _original_spawn(path, args, passfds)
    return pid


def install() -> None:
    """Guard ``subprocess.Popen`` and ``multiprocessing``'s spawn for the rest of the session."""
    subprocess.Popen.__init__ = _guarded_init  # type: ignore[method-assign]
    multiprocessing.util.spawnv_passfds = _guarded_spawn
