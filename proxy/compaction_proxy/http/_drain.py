"""Shutdown for the requests still running: answered properly, never cut by the server.

On SIGTERM uvicorn stops accepting connections and waits up to
``server.graceful_shutdown_seconds`` for the requests in flight. What is still running then it
cancels: a request inside compaction (a summarizer call) or waiting for the upstream gets
uvicorn's plain-text 500, a stream stops in the middle of a chunk, and every one of them logs
"Exception in ASGI application" with a traceback. The proxy ends them itself, a little before
uvicorn would (:attr:`Drain.cut_after`), so each gets an answer a client understands:

* not answered yet: a 503 in OpenAI's error shape with ``Retry-After`` (the SDKs retry it,
  and behind a load balancer the retry reaches another instance);
* a stream already started: an error event in the route's own format after the last whole
  event (``compaction_proxy/upstream/_stream_events.py``), then the stream's proper end;
* a JSON reply whose body is already being relayed is left to finish: it is nearly done.

Nothing of this is a crash: one warning says how many requests were cut, and each one's access
line says ``"cut": "shutdown"``.

The moment the signal arrives is learnt by chaining the server's own handlers for SIGTERM and
SIGINT (:meth:`Drain.watch_signals`, from the lifespan, which runs in every worker's main
thread): the previous handler still runs, so uvicorn shuts down exactly as before. When no
server handler is there to chain (an in-process test), nothing is installed, and a request
cancelled after :meth:`Drain.begin` is still answered the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from types import FrameType
from typing import Any

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.http._errors import ProxyError

log = logging.getLogger("compaction_proxy.shutdown")

DEFAULT_GRACE_SECONDS = 30.0
"""``server.graceful_shutdown_seconds``'s default, for a state built without settings."""
CUT_LEAD_SHARE = 0.1
"""The cut comes this share of the grace before its end (at most :data:`CUT_LEAD_MAX`)."""
CUT_LEAD_MAX = 1.0
"""Seconds before the end of the grace at most: time for the answers to go out before the
server cancels what is left."""
RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a 503 for a cut request: another instance can take it at once."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class InFlight:
    """One request, as the drain sees it.

    ``cut``: the drain cancelled it (the handler that catches the cancellation answers it);
    ``relaying_body``: a reply that is not a stream has started to go out, so the cut leaves
    it alone.
    """

    __slots__ = ("cut", "grace_seconds", "relaying_body", "task")

    def __init__(self, task: asyncio.Task[Any] | None, grace_seconds: float) -> None:
        self.task = task
        self.grace_seconds = grace_seconds
        self.cut = False
        self.relaying_body = False


class ArrivedAfterCut(CompactionProxyError):
    """A request that came in once the cut had begun (pipelined, or just before the listener
    closed): answered like the ones cut."""


in_flight: ContextVar[InFlight | None] = ContextVar("compaction_proxy_in_flight", default=None)
"""The request the running task serves (set by the app for each request; read by the
forwarder, which owns the reply's bytes)."""


class Drain:
    """Tracks the requests in flight and cuts those still running near the end of the grace."""

    def __init__(self, grace_seconds: float, *, clock: Callable[[], float] = time.monotonic):
        self.grace_seconds = float(grace_seconds)
        self._clock = clock
        self._flights: dict[int, InFlight] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.begun = False
        """A shutdown signal arrived: ``/readyz`` answers 503 from now on."""
        self.cutting = False
        """The grace is (nearly) over: requests still running are being answered 503."""
        self.begun_at: float | None = None
        self.cut_count = 0

    @property
    def cut_after(self) -> float:
        """Seconds after the signal at which requests still running are cut."""
        lead = min(CUT_LEAD_MAX, self.grace_seconds * CUT_LEAD_SHARE)
        return max(0.0, self.grace_seconds - lead)

    # -------------------------------------------------------------- requests

    def enter(self) -> InFlight:
        """Registers the running task's request; :meth:`leave` when it is answered."""
        task = asyncio.current_task()
        flight = InFlight(task, self.grace_seconds)
        self._flights[id(flight)] = flight
        in_flight.set(flight)
        return flight

    def leave(self, flight: InFlight) -> None:
        self._flights.pop(id(flight), None)

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def owns(self, flight: InFlight) -> bool:
        """Whether a cancellation of this request is the shutdown's (the drain's cut, or the
        server cancelling what is left once the grace is over)."""
        return flight.cut or self.begun

    # -------------------------------------------------------------- shutdown

    def begin(self) -> None:
        """The shutdown signal arrived: note it and schedule the cut."""
        if self.begun:
            return
        self.begun = True
        self.begun_at = self._clock()
        log.info(
            "shutting down: %d request(s) in flight; those still running in %.1fs "
            "(server.graceful_shutdown_seconds %g) will be answered 503",
            len(self._flights),
            self.cut_after,
            self.grace_seconds,
        )
        loop = asyncio.get_running_loop()
        if self.cut_after > 0:
            self._timer = loop.call_later(self.cut_after, self.cut)
        else:
            loop.call_soon(self.cut)

    def cut(self) -> None:
        """Cancels every request still running, except replies already being relayed."""
        self.begun = self.cutting = True
        cut = 0
        for flight in list(self._flights.values()):
            if flight.cut or flight.relaying_body or flight.task is None:
                continue
            flight.cut = True
            flight.task.cancel()
            cut += 1
        self.cut_count += cut
        if cut:
            log.warning(
                "shutdown: cut %d request(s) still running after %.1fs: answered 503, or "
                "for a stream already started an error event; raise "
                "server.graceful_shutdown_seconds to let them finish",
                cut,
                self.cut_after,
            )

    def watch_signals(self) -> Callable[[], None]:
        """Chains the server's SIGTERM and SIGINT handlers so :meth:`begin` runs on either;
        returns what undoes it. Does nothing outside the main thread or where no Python
        handler is installed (then there is no server here to shut down on a signal)."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        installed: list[tuple[int, Any, Callable[[int, FrameType | None], None]]] = []

        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue

            def handler(
                signum: int,
                frame: FrameType | None,
                previous: Callable[[int, FrameType | None], Any] = previous,
            ) -> None:
                # Runs between two bytecodes of the loop's thread: only hand the work over.
                with contextlib.suppress(RuntimeError):  # the loop is closed already
                    loop.call_soon_threadsafe(self.begin)
                previous(signum, frame)

            signal.signal(sig, handler)
            installed.append((sig, previous, handler))

        def undo() -> None:
            if self._timer is not None:
                self._timer.cancel()
            if threading.current_thread() is not threading.main_thread():
                return
            for sig, previous, ours in installed:
                # The server may have restored its own originals already: leave those.
                if signal.getsignal(sig) is ours:
                    signal.signal(sig, previous)

        return undo


def shutdown_error(grace_seconds: float) -> ProxyError:
    """The 503 a request cut by the shutdown gets."""
    return ProxyError(
        503,
        "the proxy is shutting down and could not finish this request within its grace "
        f"period ({grace_seconds:g} s, server.graceful_shutdown_seconds); retry it",
        "server_error",
        "server_shutting_down",
    )


def retry_after_header() -> tuple[bytes, bytes]:
    return (b"retry-after", str(RETRY_AFTER_SECONDS).encode())
