"""A TCP server that accepts connections and never answers: a hung Redis (or any hung peer).

A Redis that is wedged (swapping, stopped with SIGSTOP, behind a black-holing proxy) still
completes the TCP handshake, so clients connect at once and then wait for a reply that never
comes. This server does exactly that: it accepts, reads and discards whatever it is sent, and
writes nothing.

It is bounded: at most ``max_connections`` are held (more are closed at once), and it stops
itself after ``lifetime`` seconds even if the test forgets to, so a failed test never leaves a
thread or a port behind.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from types import TracebackType


class HungServer:
    """``with HungServer() as server:`` ``server.url`` is a ``redis://`` URL that never answers."""

    def __init__(self, *, lifetime: float = 120.0, max_connections: int = 64) -> None:
        self.lifetime = lifetime
        self.max_connections = max_connections
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hung-server", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> HungServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> HungServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        ends_at = time.monotonic() + self.lifetime
        held: list[socket.socket] = []
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            try:
                while not self._stop.is_set() and time.monotonic() < ends_at:
                    for key, _ in selector.select(timeout=0.1):
                        sock = key.fileobj
                        assert isinstance(sock, socket.socket)
                        if sock is self._listener:
                            self._accept(selector, held)
                        else:
                            self._drain(selector, held, sock)
            finally:
                for sock in held:
                    sock.close()
                self._listener.close()

    def _accept(self, selector: selectors.BaseSelector, held: list[socket.socket]) -> None:
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        self.accepted += 1
        if len(held) >= self.max_connections:
            conn.close()
            return
        conn.setblocking(False)
        held.append(conn)
        selector.register(conn, selectors.EVENT_READ)

    @staticmethod
    def _drain(
        selector: selectors.BaseSelector, held: list[socket.socket], sock: socket.socket
    ) -> None:
        """Reads and discards (so the client's writes never block); forgets closed peers."""
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            selector.unregister(sock)
            held.remove(sock)
            sock.close()
