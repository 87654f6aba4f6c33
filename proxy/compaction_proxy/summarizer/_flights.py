"""One summarizer call per stretch of conversation, and no hammering after failures.

Agents retry, fan out and run in several replicas: N identical requests arriving together all
want the same summary. The key of a summary is what it summarizes (namespace, previous summary,
the messages folded), so:

* in one process, concurrent callers share one in-flight call;
* across replicas, a store lock elects one caller, and the others read the result it stored;
* after a failure, the same stretch is not sent again until a growing back-off expires, so a
  broken summarizer costs one call per back-off period instead of one per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from compaction_proxy.checkpoints import StoredValues, StoreUnavailable
from compaction_proxy.compaction.summarizer_contract import Summarizer, SummaryError, SummaryRequest

log = logging.getLogger("compaction_proxy.summaries")

_RESULTS_NAMESPACE = "summary-results"


def _key(*parts: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def summary_key(namespace: str, request: SummaryRequest) -> str:
    return _key(
        namespace.encode(),
        (request.previous_summary or "").encode(),
        orjson.dumps(request.messages, option=orjson.OPT_SORT_KEYS),
    )


def backoff_key(namespace: str, request: SummaryRequest) -> str:
    """Failures are remembered per starting point, not per exact stretch: the stretch grows by
    a turn on every request, its start (and the summary it extends) does not."""
    first = request.messages[0] if request.messages else {}
    return _key(
        namespace.encode(),
        (request.previous_summary or "").encode(),
        orjson.dumps(first, option=orjson.OPT_SORT_KEYS),
    )


@dataclass(slots=True)
class _Failures:
    count: int
    retry_at: float


class SummaryFlights:
    """Process-wide state shared by every request's summarizer."""

    def __init__(
        self,
        store: StoredValues | None,
        *,
        result_ttl_seconds: int = 3600,
        lock_ttl_seconds: float = 120.0,
        lock_wait_seconds: float = 30.0,
        backoff_base_seconds: float = 30.0,
        backoff_max_seconds: float = 600.0,
        max_tracked: int = 10_000,
        total_timeout_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        # Back-off deadlines are read on this clock (injected by tests, as the breaker's and
        # the preparer's are).
        self.clock = clock
        # One summary, however many chunks and lock waits it takes: the request behind it
        # must not outwait its client.
        self.total_timeout_seconds = total_timeout_seconds
        self.result_ttl_seconds = result_ttl_seconds
        self.lock_ttl_seconds = lock_ttl_seconds
        self.lock_wait_seconds = lock_wait_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self._max_tracked = max_tracked
        self._inflight: dict[str, asyncio.Future[str]] = {}
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def bind(self, inner: Summarizer, namespace: str) -> GuardedSummarizer:
        return GuardedSummarizer(self, inner, namespace)

    # -- back-off --------------------------------------------------------------------------

    def backing_off(self, key: str, now: float) -> float | None:
        entry = self._failures.get(key)
        if entry is None or entry.retry_at <= now:
            return None
        return entry.retry_at - now

    def record_failure(self, key: str, now: float) -> None:
        entry = self._failures.pop(key, None)
        count = 1 if entry is None else entry.count + 1
        delay = min(self.backoff_base_seconds * 2 ** (count - 1), self.backoff_max_seconds)
        self._failures[key] = _Failures(count, now + delay)
        while len(self._failures) > self._max_tracked:
            self._failures.popitem(last=False)

    def record_success(self, key: str) -> None:
        self._failures.pop(key, None)

    # -- results shared across replicas -------------------------------------------------------

    async def stored_result(self, key: str) -> str | None:
        if self.store is None:
            return None
        try:
            found = await self.store.get(_RESULTS_NAMESPACE, key)
        except StoreUnavailable:
            return None
        if found is None:
            return None
        text = found.value.get("summary")
        return text if isinstance(text, str) else None

    async def store_result(self, key: str, text: str) -> None:
        if self.store is None:
            return
        try:
            await self.store.put(
                _RESULTS_NAMESPACE, key, {"summary": text}, self.result_ttl_seconds
            )
        except StoreUnavailable:
            # Not a warning per request: the flow reports the store's writes failing once
            # (compaction_proxy/engine/_degraded.py), and the checkpoint holding this summary
            # is held in process when the store refuses it.
            log.debug("summary result not shared: checkpoint store unavailable")


class GuardedSummarizer:
    """A request's summarizer: single-flight and back-off around the real one.

    A :class:`~compaction_proxy.compaction.summarizer_contract.Summarizer` for the core, plus
    :meth:`reject` for the flow, which alone knows when the pipeline refused what it got.
    """

    def __init__(self, flights: SummaryFlights, inner: Summarizer, namespace: str) -> None:
        self._flights = flights
        self._inner = inner
        self._namespace = namespace
        self._last_retry_key: str | None = None

    def reject(self) -> None:
        """The pipeline refused the summary it got (not shorter than what it replaces): back
        off from this stretch as from a failed call."""
        if self._last_retry_key is not None:
            self._flights.record_failure(self._last_retry_key, self._flights.clock())

    async def summarize(self, request: SummaryRequest) -> str:
        flights = self._flights
        retry_key = backoff_key(self._namespace, request)
        self._last_retry_key = retry_key
        wait = flights.backing_off(retry_key, flights.clock())
        if wait is not None:
            raise SummaryError(
                "backoff",
                f"summarizer failed recently for this conversation; retrying in {wait:.0f}s",
            )
        key = summary_key(self._namespace, request)
        pending = flights._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        flights._inflight[key] = future
        try:
            try:
                async with asyncio.timeout(flights.total_timeout_seconds):
                    text = await self._elect_and_call(key, request)
            except TimeoutError:
                raise SummaryError(
                    "timeout",
                    f"no summary within {flights.total_timeout_seconds:g} s "
                    "(summarization.timeout)",
                ) from None
        except SummaryError as error:
            flights.record_failure(retry_key, flights.clock())
            future.set_exception(error)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        except BaseException as error:
            future.set_exception(SummaryError("error", f"summarizer call aborted: {error!r}"))
            future.exception()
            raise
        else:
            flights.record_success(retry_key)
            future.set_result(text)
            return text
        finally:
            flights._inflight.pop(key, None)

    async def _elect_and_call(self, key: str, request: SummaryRequest) -> str:
        flights = self._flights
        cached = await flights.stored_result(key)
        if cached is not None:
            return cached
        store = flights.store
        if store is None:
            return await self._call(key, request)
        text: str | None = None
        try:
            lock = store.lock(f"summary:{key}", flights.lock_ttl_seconds, flights.lock_wait_seconds)
            async with lock:
                # Whoever held the lock before us may have stored the summary meanwhile; a lock
                # that timed out is no reason to fail, only to call ourselves.
                cached = await flights.stored_result(key)
                if cached is not None:
                    return cached
                text = await self._call(key, request)
                return text
        except StoreUnavailable:
            return text if text is not None else await self._call(key, request)

    async def _call(self, key: str, request: SummaryRequest) -> str:
        text = await self._inner.summarize(request)
        await self._flights.store_result(key, text)
        return text
