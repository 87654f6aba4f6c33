"""A circuit breaker in front of a checkpoint store: a store that fails is not asked again at once.

Without it, a Redis that accepts connections but never answers costs every compacted request
one full timeout per store call (four in a row: about 12 s), and nothing remembers that the
last request just found the store dead. With it:

* **closed** (normal): calls go through. The first call that fails with
  :class:`StoreUnavailable` (a timeout, a refused connection, a disk error) opens the breaker.
* **open**: every call raises :class:`StoreUnavailable` at once, without touching the backend,
  so callers degrade exactly as they do for a failed call (no checkpoint, a warning header),
  only without waiting. It stays open for a back-off: 1 s, doubled after each failed probe,
  at most 30 s.
* **half-open**: once the back-off has passed, one call is let through as a probe (the others
  are still refused at once). Its success closes the breaker and resets the back-off; its
  failure re-opens it for twice as long.

:meth:`StoreBreaker.readiness` says whether the store is up, and since when it is down, for
``/readyz`` and the dashboard. A call refused because the request's store budget was spent
(:class:`~.deadline.StoreBudgetSpent`) never reached the backend and is not counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeVar

from .base import Checkpoint, CheckpointStore, StoreUnavailable
from .deadline import StoreBudgetSpent

log = logging.getLogger("compaction_proxy.stores")

T = TypeVar("T")

State = Literal["closed", "open", "half_open"]

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


class StoreMarkedDown(StoreUnavailable):
    """Raised at once while the breaker is open: the backend was not asked."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """The breaker's view of the store, for ``/readyz``, metrics and the dashboard.

    ``down_since``: wall-clock time (``time.time()``) of the failure that opened the breaker;
    ``retry_in``: seconds until the next probe is let through (0 while one is in flight);
    ``failures``: consecutive failed calls (the opening one and failed probes); ``reason``: the
    kind of the last failure (an exception type name, never a path or a URL).
    """

    up: bool
    state: State
    down_since: float | None = None
    retry_in: float | None = None
    failures: int = 0
    reason: str | None = None

    def describe(self) -> str:
        """One line for a readiness check: ``ok`` or why and since when it is down."""
        if self.up:
            return "ok"
        since = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.down_since))
            if self.down_since is not None
            else "?"
        )
        probe = "probing" if self.state == "half_open" else f"next probe in {self.retry_in:.1f}s"
        return f"unavailable: marked down since {since} ({self.reason or 'error'}; {probe})"


class StoreBreaker:
    """Implements :class:`CheckpointStore` around ``inner``; see the module docstring."""

    def __init__(
        self,
        inner: CheckpointStore,
        *,
        backoff_base_seconds: float = BACKOFF_BASE_SECONDS,
        backoff_max_seconds: float = BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = max(backoff_max_seconds, backoff_base_seconds)
        self._clock = clock
        self._wall_clock = wall_clock
        self._state: State = "closed"
        self._backoff = 0.0
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._failures = 0
        self._reason: str | None = None
        self._probe_started: float | None = None
        self._probe_id = 0  # which admitted call is the current probe
        self.opened = 0
        """Times the breaker went from closed to open (a counter for metrics)."""
        self.skipped = 0
        """Calls refused at once while open (a counter for metrics)."""

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> State:
        return self._state

    @property
    def foreign_values(self) -> int:
        """Foreign values the backend met (see :mod:`.base`); 0 when it does not count them."""
        count = getattr(self.inner, "foreign_values", 0)
        return count if isinstance(count, int) else 0

    def readiness(self) -> Readiness:
        if self._state == "closed":
            return Readiness(True, "closed")
        retry_in = 0.0 if self._state == "half_open" else self._retry_at - self._clock()
        return Readiness(
            False, self._state, self._down_since, max(0.0, retry_in), self._failures, self._reason
        )

    def _admit(self) -> int | None:
        """Lets a call go to the backend: None for an ordinary call, the probe's id for the
        half-open probe. Raises :class:`StoreMarkedDown` when it may not go.
        """
        if self._state == "closed":
            return None
        now = self._clock()
        if self._state == "open" and now < self._retry_at:
            self._refuse(now)
        if self._state == "half_open" and not self._probe_is_stale(now):
            self._refuse(now)
        self._state = "half_open"
        self._probe_started = now
        self._probe_id += 1
        return self._probe_id

    def _is_probe(self, probe: int | None) -> bool:
        """Whether this call is the current probe (not one that went stale and was replaced)."""
        return probe is not None and probe == self._probe_id and self._state == "half_open"

    def _probe_is_stale(self, now: float) -> bool:
        """A probe that never came back (a backend without a timeout of its own) must not
        keep the store down for good: after the longest back-off another one may go."""
        started = self._probe_started
        return started is None or now - started >= self.backoff_max_seconds

    def _refuse(self, now: float) -> NoReturn:
        self.skipped += 1
        wait = max(0.0, self._retry_at - now)
        raise StoreMarkedDown(
            f"{self.name} store marked down after a failure; skipped (next probe in {wait:.1f}s)"
        )

    def _failed(self, probe: int | None, exc: StoreUnavailable) -> None:
        now = self._clock()
        reason = _reason(exc)
        if self._is_probe(probe):
            self._backoff = min(
                max(self._backoff * 2, self.backoff_base_seconds), self.backoff_max_seconds
            )
            self._failures += 1
        elif probe is None and self._state == "closed":
            self._backoff = self.backoff_base_seconds
            self._failures = 1
            self._down_since = self._wall_clock()
            self.opened += 1
        else:
            return  # a call admitted before it opened, or a replaced probe: nothing new
        self._state = "open"
        self._retry_at = now + self._backoff
        self._probe_started = None
        self._reason = reason
        log.warning(
            "checkpoint store %s marked down for %.0fs after %s (%d consecutive failures)",
            self.name,
            self._backoff,
            reason,
            self._failures,
        )

    def _succeeded(self, probe: int | None) -> None:
        if not self._is_probe(probe):
            return  # closed already, or a late answer to a call made before it opened
        log.info(
            "checkpoint store %s answers again; marked up after %d failures",
            self.name,
            self._failures,
        )
        self._state = "closed"
        self._backoff = 0.0
        self._failures = 0
        self._down_since = None
        self._reason = None
        self._probe_started = None

    def _abandoned(self, probe: int | None) -> None:
        """The call ended without a verdict (cancelled, budget spent, a bug): the next call
        may probe instead."""
        if self._is_probe(probe):
            self._state = "open"
            self._probe_started = None

    async def _guard(self, call: Callable[[], Awaitable[T]]) -> T:
        probe = self._admit()
        try:
            result = await call()
        except StoreBudgetSpent:
            self._abandoned(probe)
            raise
        except StoreUnavailable as exc:
            self._failed(probe, exc)
            raise
        except BaseException:
            self._abandoned(probe)
            raise
        self._succeeded(probe)
        return result

    # ------------------------------------------------------------------ the protocol

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        return await self._guard(lambda: self.inner.find_longest(namespace, keys))

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        await self._guard(lambda: self.inner.put(namespace, key, checkpoint, ttl_seconds))

    async def delete(self, namespace: str, key: str) -> bool:
        return await self._guard(lambda: self.inner.delete(namespace, key))

    async def ping(self) -> None:
        await self._guard(self.inner.ping)

    @asynccontextmanager
    async def lock(self, name: str, ttl_seconds: float, wait_seconds: float) -> AsyncIterator[bool]:
        # Only taking the lock is judged: the body's exceptions are the caller's, and the
        # backend's release never raises.
        async with AsyncExitStack() as stack:

            async def enter() -> bool:
                return await stack.enter_async_context(
                    self.inner.lock(name, ttl_seconds, wait_seconds)
                )

            acquired = await self._guard(enter)
            yield acquired

    async def close(self) -> None:
        await self.inner.close()


def _reason(exc: StoreUnavailable) -> str:
    """The kind of failure, safe to show anywhere: the cause's type name, not its message
    (which may hold a file path or a host)."""
    cause = exc.__cause__
    return type(cause).__name__ if cause is not None else type(exc).__name__
