"""Large request bodies are parsed, checked and compacted off the event loop.

A body of a million small messages (31 MiB, under the byte limit) used to take 46 s of the
event loop: every other client waited. Three things keep the loop free now:

- **The compaction thread** (:class:`Offload`): one thread running an event loop of its own.
  Parsing, validation, hashing and the whole compaction of a large body run there; the core's
  only await, the summarizer, is sent back to the main loop (:class:`MainLoopSummarizer`),
  where the HTTP client and the store live. Python code in that thread gives the GIL back
  every few milliseconds, and tiktoken releases it.
- **The parse worker** (a process): orjson never releases the GIL, so a body past
  :data:`THREAD_PARSE_BYTES` or with many values (an estimate from its commas, past
  :data:`THREAD_PARSE_VALUES`) is parsed in a worker process,
  which also applies ``server.max_messages`` / ``max_content_parts`` there: a refused body is
  never built in this process at all. An accepted one comes back in pieces
  (compaction_proxy/engine/_body_codec.py) rebuilt on the thread.
- **No full collections** while a large body is alive (:func:`full_collections_paused`): the
  cyclic collector's oldest generation walks every object in the process, a million of them
  per large body, holding the GIL for a hundred milliseconds and more each time. JSON data
  holds no cycles (reference counting frees it), so the pause only delays the collection of
  whatever cycles the rest of the process makes in the meantime.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from compaction_proxy.compaction import Summarizer
from compaction_proxy.compaction.summarizer_contract import SummaryRequest
from compaction_proxy.compaction.validation import LimitIssue, SizeLimits, size_issue
from compaction_proxy.http import ProxyError

from ._body_codec import decode, encode

log = logging.getLogger("compaction_proxy.offload")

T = TypeVar("T")
Parser = Callable[[bytes], dict[str, Any]]

OFFLOAD_BYTES = 64 * 1024
"""Bodies from this size are parsed, validated and compacted on the compaction thread: below
it the thread hop costs more than the work."""
THREAD_PARSE_BYTES = 4 << 20
THREAD_PARSE_VALUES = 200_000
"""Up to this size and about this many JSON values (orjson: ~15 ms of GIL either way) a body
is parsed on the thread; past either, in the worker process."""
_COUNT_SLICE = 1 << 20
PARENT_POLL_SECONDS = 1.0
"""How often the parse worker checks that the proxy process that started it is alive."""


# --------------------------------------------------------------------------- the collector

PAUSE_BYTES = 4 << 20
PAUSE_VALUES = 100_000
"""Bodies from this size, or with about this many values, pause full collections while they
are alive (a smaller one adds too few objects for a collection to cost much)."""
MAX_PAUSE = 60.0
"""Seconds full collections may stay paused when large bodies follow each other without a
gap: then one runs (on whichever thread enters next), so cycles made meanwhile are freed."""

_gc_lock = threading.Lock()
_gc_paused = 0
_gc_since = 0.0
_gc_saved: tuple[int, int, int] = (700, 10, 10)
_gc_settled = False

YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (CPython's default: 700).
A request allocates thousands of objects that reference counting frees when it ends; at the
default, collections come several times per request and walk every request in flight."""


def settle_collector() -> None:
    """Once per process, when the first app is built: what start-up made (settings,
    tokenizers, routes, compiled pipelines) lives as long as the process, so it moves to the
    permanent generation where no collection walks it again, and the youngest generation
    collects less often. No collection first: that would cost every start a full walk, for
    the few start-up cycles it could free."""
    global _gc_saved, _gc_settled
    with _gc_lock:
        if _gc_settled:
            return
        _gc_settled = True
        gc.freeze()
        _, middle, oldest = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
        if _gc_paused:  # a body holds full collections paused: what comes back changes too
            _gc_saved = (YOUNG_THRESHOLD, _gc_saved[1], _gc_saved[2])


@contextlib.contextmanager
def full_collections_paused() -> Iterator[None]:
    """No collection of the oldest generation inside (see the module docstring); nests, and
    the thresholds come back when the last one leaves."""
    global _gc_paused, _gc_saved, _gc_since
    collect = False
    with _gc_lock:
        now = time.monotonic()
        if _gc_paused == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(_gc_saved[0], _gc_saved[1], 1 << 30)
            _gc_since = now
        elif now - _gc_since > MAX_PAUSE:
            collect, _gc_since = True, now
        _gc_paused += 1
    if collect:
        gc.collect()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_paused -= 1
            if _gc_paused == 0:
                gc.set_threshold(*_gc_saved)


# --------------------------------------------------------------------------- the worker process

_libc: Any = None


def _trim() -> None:
    """Give freed memory back to the system (glibc keeps it otherwise)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    trim = getattr(_libc, "malloc_trim", None) if _libc else None
    if trim is not None:
        trim(0)


def parse_in_worker(
    raw: bytes, parser: Parser, params: tuple[str, ...], limits: SizeLimits | None
) -> tuple[str, Any]:
    """In the worker process: ``("ok", pieces)``, ``("error", fields of a ProxyError)`` or
    ``("limit", (fields, model))`` for a body over ``limits``."""
    gc.disable()  # a parse makes no cycles; collected once it is done
    data: dict[str, Any] | None = None
    try:
        try:
            data = parser(raw)
        except ProxyError as error:
            return "error", (error.status, error.message, error.type, error.code, error.param)
        issue = _size_issue(data, params, limits)
        if issue is not None:
            fields = (413, issue.message, "invalid_request_error", issue.code, issue.param)
            model = data.get("model")
            return "limit", (fields, model if isinstance(model, str) else None)
        return "ok", encode(data)
    finally:
        data = None
        gc.enable()
        gc.collect()
        _trim()


# --------------------------------------------------------------------------- the worker's life


def watch_parent(parent: int, poll: float = PARENT_POLL_SECONDS) -> None:
    """The parse worker's initializer: it exits as soon as the proxy that started it is gone.

    A proxy killed with SIGKILL (an OOM kill, ``docker kill``, a supervisor's last resort)
    never shuts its pool down, and the worker, blocked on a queue whose write end it holds
    itself, would otherwise live on as an orphan holding its memory. The worker is reparented
    when its parent dies, so a changed parent pid is the signal."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(0)  # nothing of the worker's is worth finishing: its caller is gone

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# --------------------------------------------------------------------------- the thread


@dataclass(frozen=True, slots=True)
class _LargeBody:
    """:meth:`Offload.parse`'s arguments, bundled only when the body goes to the compaction
    thread: the common small body pays for no bundle and no closure."""

    raw: bytes
    parser: Parser
    params: tuple[str, ...]
    limits: SizeLimits | None
    applies: Callable[[str | None], bool]


class Offload:
    """The compaction thread and the parse worker of one process (both started on first use)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve, args=(loop,), name="compaction", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _worker(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: a fork of a process with running threads and loops is not safe.
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=watch_parent,
                    initargs=(os.getpid(),),
                )
            return self._pool

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """``coroutine`` run to its end on the compaction thread; cancelling the caller
        cancels it there."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._thread_loop())
        return await asyncio.wrap_future(future)

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the compaction thread."""

        async def call() -> T:
            return function(*args)

        return await self.run(call())

    async def parse(
        self,
        raw: bytes,
        parser: Parser,
        *,
        params: tuple[str, ...],
        limits: SizeLimits | None,
        applies: Callable[[str | None], bool],
    ) -> dict[str, Any]:
        """``parser(raw)``, with ``limits`` on the lists named ``params`` (``messages``,
        ``input``) when ``applies(model)`` (the request's model will be compacted).
        ``parser`` is a module-level function (the worker process imports it by name) that
        raises :class:`ProxyError` for a bad body."""
        if len(raw) < OFFLOAD_BYTES:
            return _checked(parser(raw), params, limits, applies)
        return await self.run(self._parse_large(_LargeBody(raw, parser, params, limits, applies)))

    async def _parse_large(self, body: _LargeBody) -> dict[str, Any]:
        raw = body.raw
        if len(raw) <= THREAD_PARSE_BYTES and _estimated_values(raw) <= THREAD_PARSE_VALUES:
            with full_collections_paused():
                return _checked(body.parser(raw), body.params, body.limits, body.applies)
        status, payload = await asyncio.wrap_future(
            self._worker().submit(parse_in_worker, raw, body.parser, body.params, body.limits)
        )
        if status == "limit":
            fields, model = payload
            if body.applies(model):
                raise ProxyError(*fields)
            status, payload = await asyncio.wrap_future(
                self._worker().submit(parse_in_worker, raw, body.parser, body.params, None)
            )
        # The worker freed its copy of the body once the result went out: give it back.
        self._worker().submit(_trim)
        if status == "error":
            raise ProxyError(*payload)
        with full_collections_paused():
            data: dict[str, Any] = decode(payload)
        return data

    @contextlib.contextmanager
    def holding(self, raw: bytes) -> Iterator[None]:
        """Around the life of a request body: one of many values (or simply large) pauses
        full collections while it lives, and gives its memory back to the system after."""
        large = len(raw) >= PAUSE_BYTES or (
            len(raw) >= OFFLOAD_BYTES and _sampled_values(raw) >= PAUSE_VALUES
        )
        if not large:
            yield
            return
        try:
            with full_collections_paused():
                yield
        finally:
            # On the thread: trimming a large heap takes milliseconds the loop should not wait.
            self._thread_loop().call_soon_threadsafe(_trim)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
            pool, self._pool = self._pool, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _size_issue(
    data: dict[str, Any], params: tuple[str, ...], limits: SizeLimits | None
) -> LimitIssue | None:
    if limits is None:
        return None
    for param in params:
        issue = size_issue(data.get(param), limits, param=param)
        if issue is not None:
            return issue
    return None


def _checked(
    data: dict[str, Any],
    params: tuple[str, ...],
    limits: SizeLimits | None,
    applies: Callable[[str | None], bool],
) -> dict[str, Any]:
    issue = _size_issue(data, params, limits)
    if issue is not None:
        model = data.get("model")
        if applies(model if isinstance(model, str) else None):
            raise ProxyError(413, issue.message, "invalid_request_error", issue.code, issue.param)
    return data


def _estimated_values(raw: bytes) -> int:
    """About how many JSON values ``raw`` holds (its commas, counted a slice at a time so the
    GIL is free between slices): commas inside strings count too, which only sends a body
    to the worker that could have been parsed here."""
    return sum(
        raw.count(b",", start, start + _COUNT_SLICE) for start in range(0, len(raw), _COUNT_SLICE)
    )


def _sampled_values(raw: bytes) -> int:
    """:func:`_estimated_values` from sixteen evenly spread 1 KiB slices, for the collector's
    pause alone (a wrong guess only collects sooner or later): counting every comma costs a
    millisecond on a 2 MB body and a tenth of one on a 128 KiB body, which an agent's every
    request would pay."""
    if len(raw) <= _SAMPLES * _SAMPLE_BYTES:
        return _estimated_values(raw)
    stride = (len(raw) - _SAMPLE_BYTES) // (_SAMPLES - 1)
    seen = sum(
        raw.count(b",", start, start + _SAMPLE_BYTES) for start in range(0, len(raw), stride)
    )
    return seen * len(raw) // (_SAMPLE_BYTES * len(range(0, len(raw), stride)))


_SAMPLES = 16
_SAMPLE_BYTES = 1024


class MainLoopSummarizer:
    """A summarizer living on the main loop, called from the compaction thread's loop."""

    def __init__(self, inner: Summarizer, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self._loop = loop

    async def summarize(self, request: SummaryRequest) -> str:
        future = asyncio.run_coroutine_threadsafe(self.inner.summarize(request), self._loop)
        return await asyncio.wrap_future(future)


def on_main_loop(
    summarizer: Summarizer | None, loop: asyncio.AbstractEventLoop
) -> Summarizer | None:
    return None if summarizer is None else MainLoopSummarizer(summarizer, loop)


__all__ = [
    "OFFLOAD_BYTES",
    "MainLoopSummarizer",
    "Offload",
    "full_collections_paused",
    "on_main_loop",
    "parse_in_worker",
]
