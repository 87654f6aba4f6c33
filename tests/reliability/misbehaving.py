"""Upstreams that misbehave at one phase of a request each, as a separate process.

``python -m tests.reliability.misbehaving MODE`` listens on 127.0.0.1 and prints ``port N``;
then one line ``accepted K`` per connection it accepts (K counts them all; ``no-accept``
accepts none). Modes:

- ``no-accept``: the listen queue is full (backlog 0, filled by the server's own
  connection), so the kernel drops every further SYN and a client's connect never completes:
  the *connect* timeout.
- ``no-read``: accepts and never reads, with a 4 KiB receive buffer, so a large request body
  stops moving after a few hundred kilobytes: the *write* timeout.
- ``silent``: accepts, reads and discards everything, never answers: the *read* timeout (and,
  while it holds one request, the *pool* timeout for the next when the pool has one slot).

It is bounded: at most ``--max-connections`` are held, and it exits after ``--lifetime``
seconds, or when its standard input closes (the test that started it went away).
"""

from __future__ import annotations

import argparse
import contextlib
import selectors
import socket
import subprocess
import sys
import threading
import time
from types import TracebackType

MODES = ("no-accept", "no-read", "silent")


def _serve(mode: str, lifetime: float, max_connections: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if mode == "no-read":
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited on accept
    listener.bind(("127.0.0.1", 0))
    listener.listen(0 if mode == "no-accept" else 64)
    port = listener.getsockname()[1]
    fillers = []
    if mode == "no-accept":
        # Backlog 0 queues one completed connection: this one. Every later SYN is dropped.
        fillers.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    print(f"port {port}", flush=True)
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    ends_at = time.monotonic() + lifetime
    held: list[socket.socket] = []
    accepted = 0
    with selectors.DefaultSelector() as selector:
        if mode != "no-accept":
            listener.setblocking(False)
            selector.register(listener, selectors.EVENT_READ)
        while not stop.is_set() and time.monotonic() < ends_at:
            if mode == "no-accept":
                stop.wait(0.1)
                continue
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = listener.accept()
                        if len(held) >= max_connections:
                            conn.close()
                            continue
                        held.append(conn)
                        accepted += 1
                        print(f"accepted {accepted}", flush=True)
                        if mode == "silent":
                            conn.setblocking(False)
                            selector.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    held.remove(sock)
                    sock.close()
    for sock in [*held, *fillers, listener]:
        sock.close()


class MisbehavingServer:
    """``with MisbehavingServer("no-read") as server:`` ``server.base_url`` for a config."""

    def __init__(self, mode: str, *, lifetime: float = 300.0, max_connections: int = 64):
        assert mode in MODES, mode
        self.mode = mode
        self._argv = [
            sys.executable,
            "-m",
            "tests.reliability.misbehaving",
            mode,
            "--lifetime",
            str(lifetime),
            "--max-connections",
            str(max_connections),
        ]
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0
        self._accepted = 0
        self._lock = threading.Condition()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def accepted(self) -> int:
        with self._lock:
            return self._accepted

    def start(self, timeout: float = 30.0) -> MisbehavingServer:
        from tests.support.processes import REPO_ROOT, child_env

        self._proc = subprocess.Popen(
            self._argv,
            cwd=REPO_ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        ready = threading.Event()

        def read() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            for line in self._proc.stdout:
                word, _, value = line.strip().partition(" ")
                if word == "port":
                    self.port = int(value)
                    ready.set()
                elif word == "accepted":
                    with self._lock:
                        self._accepted = int(value)
                        self._lock.notify_all()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"misbehaving server ({self.mode}) did not start")
        return self

    def wait_accepted(self, count: int, timeout: float = 30.0) -> bool:
        """Whether ``count`` connections were accepted within ``timeout`` seconds."""
        with self._lock:
            return self._lock.wait_for(lambda: self._accepted >= count, timeout)

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> MisbehavingServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--lifetime", type=float, default=300.0)
    parser.add_argument("--max-connections", type=int, default=64)
    args = parser.parse_args()
    _serve(args.mode, args.lifetime, args.max_connections)


if __name__ == "__main__":
    main()
