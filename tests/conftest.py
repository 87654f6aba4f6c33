"""Shared fixtures: real servers on 127.0.0.1 and clients pointed at them.

Fixture map (see tests/support/servers.py for the handle types):

- ``fake_upstream`` (session): the shared fake upstream process (:class:`UpstreamServer`).
- ``upstream`` (function): the same server, its recordings cleared and settings reset before and
  after the test; use this one in tests so they never see each other's requests.
- ``upstream_factory`` (function): ``start(context_window=None) -> UpstreamServer``, extra fake
  upstreams stopped after the test (routing tests need two).
- ``proxy`` (session): ``python -m compaction_proxy serve`` with one upstream named ``fake`` ->
  the shared upstream, default settings (:class:`ProxyServer`).
- ``proxy_factory`` (function): ``start(config: dict | str, *, via_env=False, env=None)
  -> ProxyServer`` for special configs; stopped after the test.
- ``module_proxy_factory`` (module): the same, proxies shared by a module's tests (build
  module-scoped fixtures on it with ``fake_upstream``, and still request ``upstream`` in tests).
- ``in_thread`` (module): ``.upstream(context_window=None)`` and ``.proxy(config)``, the same
  handles with no process (tests/support/in_thread.py), stopped after the module: for tests
  that need only HTTP semantics.
- ``dead_upstream_url`` (module): a ``base_url`` whose port is bound but never listens.
- ``openai_client`` / ``async_openai_client`` (function): SDK clients on the shared proxy
  (base_url=proxy/v1, dummy key, ``max_retries=0``).
- ``proxy_http`` (function): an ``httpx.Client`` on the shared proxy for raw requests.

When a test fails, the output each live server wrote during it is attached to the report.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx
import openai
import pytest
import redis

from tests.support import process_guard
from tests.support.in_thread import InThreadServers
from tests.support.processes import LIVE_SERVERS, tail, tiktoken_cache_dir
from tests.support.redis_server import RedisServer
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

# The proxy reads its encodings from the installed package; tiktoken itself (used directly by
# a few tests and the fake upstream) reads this cache, filled from the same files: no test
# ever downloads, whatever TIKTOKEN_CACHE_DIR the shell had (an empty one, on a fresh machine).
os.environ["TIKTOKEN_CACHE_DIR"] = tiktoken_cache_dir()

_LOG_OFFSETS = pytest.StashKey[dict[int, int]]()
_names = itertools.count(1)


class ProxyFactory(Protocol):
    def __call__(
        self,
        config: Mapping[str, Any] | str,
        *,
        via_env: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> ProxyServer: ...


class UpstreamFactory(Protocol):
    def __call__(self, context_window: int | None = None) -> UpstreamServer: ...


# --------------------------------------------------------------------------- order

# The folders whose files run longest (long agent sessions over real servers) come first. Under
# pytest-xdist (`--dist loadfile`) a file runs on one worker from its first test to its last, so
# a long file collected last would run on alone at the end; started first, the short unit
# files fill the other workers meanwhile. Within a folder the order is unchanged.
_LONG_FIRST = ("integration", "reliability", "observability", "harness", "deploy")


def _rank(item: pytest.Item) -> int:
    parts = item.path.relative_to(Path(__file__).parent).parts
    return _LONG_FIRST.index(parts[0]) if parts[0] in _LONG_FIRST else len(_LONG_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: each file's tests stay together and in order
    for item in items:
        if process_guard.uses_processes(item):
            item.add_marker(pytest.mark.e2e)


# --------------------------------------------------------------------------- markers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: starts real processes (a proxy, a fake upstream, redis-server, a CLI); "
        '`-m "not e2e"` runs the in-process part alone (tests/support/process_guard.py)',
    )
    config.addinivalue_line(
        "markers",
        "external: needs a program the test extra does not install (docker compose, "
        "Chromium, npm); scripts/test-deps installs them",
    )
    process_guard.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    process_guard.set_running(item)
    try:
        return (yield)
    finally:
        process_guard.set_running(None)


# --------------------------------------------------------------------------- failure reports


@pytest.fixture(autouse=True)
def _server_log_offsets(request: pytest.FixtureRequest) -> None:
    """Remembers where each live server's log stood when the test began."""
    request.node.stash[_LOG_OFFSETS] = {id(s): s.log_size() for s in LIVE_SERVERS}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and call.when in ("call", "setup"):
        offsets = item.stash.get(_LOG_OFFSETS, {})
        for server in list(LIVE_SERVERS):
            text = server.log_text(offsets.get(id(server), 0))
            if text.strip():
                report.sections.append((f"{server.name} output ({server.log_path})", tail(text)))
    return report


# --------------------------------------------------------------------------- upstreams


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def fake_upstream(servers_dir: Path) -> Iterator[UpstreamServer]:
    server = UpstreamServer(servers_dir / "upstream.log").start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake_upstream: UpstreamServer) -> Iterator[UpstreamServer]:
    fake_upstream.reset()
    yield fake_upstream
    fake_upstream.reset()


def _upstream_starter(directory: Path, started: list[UpstreamServer]) -> UpstreamFactory:
    def start(context_window: int | None = None) -> UpstreamServer:
        n = next(_names)
        server = UpstreamServer(
            directory / f"upstream-{n}.log", context_window=context_window, name=f"upstream-{n}"
        )
        started.append(server.start())
        return server

    return start


@pytest.fixture
def upstream_factory(tmp_path: Path) -> Iterator[UpstreamFactory]:
    started: list[UpstreamServer] = []
    yield _upstream_starter(tmp_path, started)
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def upstream_factory_module(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[UpstreamFactory]:
    """Like ``upstream_factory``, but the servers live as long as the test module."""
    started: list[UpstreamServer] = []
    yield _upstream_starter(tmp_path_factory.mktemp("upstreams"), started)
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def dead_upstream_url() -> Iterator[str]:
    """A base_url where connections are refused.

    The port stays bound (never listening) while the fixture lives, so no server started
    meanwhile can take it and turn the dead upstream into a live one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


# --------------------------------------------------------------------------- proxies


@pytest.fixture(scope="session")
def proxy(fake_upstream: UpstreamServer, servers_dir: Path) -> Iterator[ProxyServer]:
    config = proxy_config(upstream_entry(fake_upstream))
    config["store"] = {"backend": "sqlite", "path": str(servers_dir / "checkpoints.db")}
    path = write_config(servers_dir / "proxy.yaml", config)
    server = ProxyServer(path, servers_dir / "proxy.log").start()
    yield server
    server.stop()


class _ProxyLauncher:
    """Starts proxies with given configs in one directory and stops them all at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[ProxyServer] = []

    def __call__(
        self,
        config: Mapping[str, Any] | str,
        *,
        via_env: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> ProxyServer:
        n = next(_names)
        if not (isinstance(config, Mapping) and "store" in config):
            # Checkpoints of a test's proxy live in its temporary directory, never in the repo.
            env = {
                "COMPACTION_PROXY_STORE__PATH": str(self.directory / f"proxy-{n}.db"),
                **(env or {}),
            }
        path = write_config(self.directory / f"proxy-{n}.yaml", config)
        server = ProxyServer(
            path, self.directory / f"proxy-{n}.log", via_env=via_env, env=env, name=f"proxy-{n}"
        )
        self.started.append(server.start())
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()


@pytest.fixture
def proxy_factory(tmp_path: Path) -> Iterator[ProxyFactory]:
    """Proxies for one test (use it when the test stops the proxy or reads its whole log)."""
    launcher = _ProxyLauncher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def module_proxy_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyFactory]:
    """Proxies shared by a module's tests: a special config costs one start, not one a test."""
    launcher = _ProxyLauncher(tmp_path_factory.mktemp("proxies"))
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def in_thread() -> Iterator[InThreadServers]:
    """Fakes and proxies in this process, on one loop thread (tests/support/in_thread.py): for
    a module whose tests need only HTTP semantics of the servers they share."""
    servers = InThreadServers()
    yield servers
    servers.stop_all()


# --------------------------------------------------------------------------- clients


@pytest.fixture
def openai_client(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    client = proxy.openai_client()
    yield client
    client.close()


@pytest.fixture
async def async_openai_client(proxy: ProxyServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = proxy.async_openai_client()
    yield client
    await client.close()


@pytest.fixture
def proxy_http(proxy: ProxyServer) -> Iterator[httpx.Client]:
    with proxy.http_client() as client:
        yield client


# --------------------------------------------------------------------------- redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (tests/support/redis_server.py)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, flushed before the test."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that stop it."""
    server = RedisServer(tmp_path / "own-redis").start()
    yield server
    server.stop()
