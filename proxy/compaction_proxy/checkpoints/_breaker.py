"""A circuit breaker in front of a checkpoint store: a store that fails is not asked again at once.

Without it, a Redis that accepts connections but never answers costs every compacted request
one full timeout per store call (four in a row: about 12 s), and nothing remembers that the
last request just found the store dead. With it, each side of the store has a state machine:

* **closed** (normal): calls go through. The first call that fails with
  :class:`StoreUnavailable` (a timeout, a refused connection, a disk error) opens it.
* **open**: every call raises :class:`StoreMarkedDown` at once, without touching the backend,
  so callers degrade exactly as they do for a failed call (no checkpoint, a warning header),
  only without waiting. It stays open for a back-off: 1 s, doubled after each failed probe,
  at most 30 s.
* **half-open**: once the back-off has passed, one call is let through as a probe (the others
  are still refused at once). Its success closes it and resets the back-off; its failure
  re-opens it for twice as long.

Reads and writes are two such sides, because a store can fail one way only: a full disk (or a
quota, or a Redis out of memory that still answers reads) refuses every write while every
checkpoint already stored can still be read. Marking the whole store down for a failed write
would throw those checkpoints away: every request compacted afresh, a summarizer call each,
and the upstream's prompt cache lost. So:

* **reads** (``find_longest``, ``ping``) fail and recover on their own;
* **writes** (``put``, ``delete``, and ``lock``: taking a lease writes a row or a key in every
  shared backend) have a back-off of their own, so a full disk costs one failed write per
  back-off, not one per request;
* a failed **read** means the backend cannot be reached at all, so writes are marked down
  with it (a hung Redis must not cost each request its whole store budget on a write); they
  *follow* the reads and come back when the reads' probe succeeds. Writes that failed on their
  own keep their own back-off.

A caller refused a lease falls back as for any store failure (the summary flights go ahead in
this process, still single-flight here). :meth:`StoreBreaker.readiness` says which side is up,
and since when the other is down, for ``/readyz``, the metrics and the dashboard. A call refused
because the request's store budget was spent (:class:`~.deadline.StoreBudgetSpent`) never
reached the backend and is not counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeVar

from ._contract import Checkpoint, CheckpointStore, StoreUnavailable
from ._deadline import StoreBudgetSpent

log = logging.getLogger("compaction_proxy.stores")

T = TypeVar("T")

State = Literal["closed", "open", "half_open"]
Side = Literal["reads", "writes"]

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


class StoreMarkedDown(StoreUnavailable):
    """Raised at once while that side of the store is marked down: the backend was not asked."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """One side of the store (reads or writes), for ``/readyz``, metrics and the dashboard.

    ``down_since``: wall-clock time (``time.time()``) of the failure that marked it down;
    ``retry_in``: seconds until the next probe is let through (0 while one is in flight or
    due); ``failures``: consecutive failed calls (the opening one and failed probes);
    ``reason``: the kind of the last failure (an exception type name, never a path or a URL);
    ``with_reads``: writes marked down because a read failed (they come back with the reads).
    """

    up: bool
    state: State
    down_since: float | None = None
    retry_in: float | None = None
    failures: int = 0
    reason: str | None = None
    with_reads: bool = False

    def describe(self) -> str:
        """``ok``, or since when and why this side is marked down."""
        if self.up:
            return "ok"
        since = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.down_since))
            if self.down_since is not None
            else "?"
        )
        if self.with_reads:
            probe = "back when reads are"
        elif self.state == "half_open":
            probe = "probing"
        else:
            probe = f"next probe in {self.retry_in or 0.0:.1f}s"
        return f"marked down since {since} ({self.reason or 'error'}; {probe})"


@dataclass(frozen=True, slots=True)
class StoreReadiness:
    """Both sides of the store. ``up``: both answer. A store that is down (either side) is
    *degraded*, never unready: every request is still served, without checkpoints (reads
    down) or without storing new ones (writes down)."""

    reads: Readiness
    writes: Readiness

    @property
    def up(self) -> bool:
        return self.reads.up and self.writes.up

    def describe(self) -> str:
        """One line for ``/readyz``: ``ok``, or ``degraded:`` and each side's state."""
        if self.up:
            return "ok"
        reads, writes = self.reads, self.writes
        if not reads.up and writes.with_reads:
            return f"degraded: reads and writes {reads.describe()}"
        return f"degraded: reads {reads.describe()}; writes {writes.describe()}"


class _Side:
    """The breaker's state machine for one side (see the module docstring)."""

    def __init__(self, side: Side, breaker: StoreBreaker) -> None:
        self.side = side
        self._breaker = breaker
        self.state: State = "closed"
        self.with_reads = False
        self._backoff = 0.0
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._failures = 0
        self._reason: str | None = None
        self._probe_started: float | None = None
        self._probe_id = 0  # which admitted call is the current probe
        self.opened = 0
        """Times this side went from closed to open (a counter for metrics)."""
        self.skipped = 0
        """Calls refused at once while this side was down (a counter for metrics)."""

    def readiness(self) -> Readiness:
        if self.state == "closed":
            return Readiness(True, "closed")
        if self.with_reads:
            retry_in = self._breaker.reads.readiness().retry_in
        elif self.state == "half_open":
            retry_in = 0.0
        else:
            retry_in = max(0.0, self._retry_at - self._breaker.clock())
        return Readiness(
            False,
            self.state,
            self._down_since,
            retry_in,
            self._failures,
            self._reason,
            self.with_reads,
        )

    def admit(self) -> int | None:
        """Lets a call go to the backend: None for an ordinary call, the probe's id for the
        half-open probe. Raises :class:`StoreMarkedDown` when it may not go."""
        if self.state == "closed":
            return None
        now = self._breaker.clock()
        if self.with_reads:
            self._refuse("with the reads")
        if self.state == "open" and now < self._retry_at:
            self._refuse(f"next probe in {self._retry_at - now:.1f}s")
        if self.state == "half_open" and not self._probe_is_stale(now):
            self._refuse("a probe is in flight")
        self.state = "half_open"
        self._probe_started = now
        self._probe_id += 1
        return self._probe_id

    def _is_probe(self, probe: int | None) -> bool:
        """Whether this call is the current probe (not one that went stale and was replaced)."""
        return probe is not None and probe == self._probe_id and self.state == "half_open"

    def _probe_is_stale(self, now: float) -> bool:
        """A probe that never came back (a backend without a timeout of its own) must not
        keep the store down for good: after the longest back-off another one may go."""
        started = self._probe_started
        return started is None or now - started >= self._breaker.backoff_max_seconds

    def _refuse(self, why: str) -> NoReturn:
        self.skipped += 1
        raise StoreMarkedDown(
            f"{self._breaker.name} store {self.side} marked down after a failure; skipped ({why})"
        )

    def failed(self, probe: int | None, reason: str) -> bool:
        """Notes a failed call; True when it opened this side from closed."""
        breaker = self._breaker
        opened = False
        if self._is_probe(probe):
            self._backoff = min(
                max(self._backoff * 2, breaker.backoff_base_seconds), breaker.backoff_max_seconds
            )
            self._failures += 1
        elif probe is None and self.state == "closed":
            self._backoff = breaker.backoff_base_seconds
            self._failures = 1
            self._down_since = breaker.wall_clock()
            self.opened += 1
            opened = True
        else:
            return False  # a call admitted before it opened, or a replaced probe: nothing new
        self.state = "open"
        self.with_reads = False
        self._retry_at = breaker.clock() + self._backoff
        self._probe_started = None
        self._reason = reason
        log.warning(
            "checkpoint store %s: %s marked down for %.0fs after %s (%d consecutive failures)",
            breaker.name,
            self.side,
            self._backoff,
            reason,
            self._failures,
        )
        return opened

    def follow_reads(self, reads: _Side) -> None:
        """Marks a closed side down because the reads failed: it comes back with them."""
        if self.state != "closed":
            return  # down on its own already: its own back-off stands
        self.state = "open"
        self.with_reads = True
        self._failures = 1
        self._down_since = reads._down_since
        self._reason = reads._reason
        self._probe_started = None
        self.opened += 1

    def succeeded(self, probe: int | None) -> bool:
        """Notes a successful call; True when it closed this side (it was the probe)."""
        if not self._is_probe(probe):
            return False  # closed already, or a late answer to a call made before it opened
        log.info(
            "checkpoint store %s: %s answer again; marked up after %d failures",
            self._breaker.name,
            self.side,
            self._failures,
        )
        self.close()
        return True

    def close(self) -> None:
        self.state = "closed"
        self.with_reads = False
        self._backoff = 0.0
        self._failures = 0
        self._down_since = None
        self._reason = None
        self._probe_started = None

    def abandoned(self, probe: int | None) -> None:
        """The call ended without a verdict (cancelled, budget spent, a bug): the next call
        may probe instead."""
        if self._is_probe(probe):
            self.state = "open"
            self._probe_started = None


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
        self.clock = clock
        self.wall_clock = wall_clock
        self.reads = _Side("reads", self)
        self.writes = _Side("writes", self)

    @property
    def foreign_values(self) -> int:
        """Foreign values the backend met (see :mod:`._contract`); 0 when it does not count them."""
        count = getattr(self.inner, "foreign_values", 0)
        return count if isinstance(count, int) else 0

    def readiness(self) -> StoreReadiness:
        return StoreReadiness(self.reads.readiness(), self.writes.readiness())

    # ------------------------------------------------------------------ guarding

    def _failed(self, side: _Side, probe: int | None, exc: StoreUnavailable) -> None:
        if side.failed(probe, _reason(exc)) and side is self.reads:
            self.writes.follow_reads(self.reads)

    def _succeeded(self, side: _Side, probe: int | None) -> None:
        if side.succeeded(probe) and side is self.reads and self.writes.with_reads:
            self.writes.close()

    async def _guard(self, side: _Side, call: Callable[[], Awaitable[T]]) -> T:
        probe = side.admit()
        try:
            result = await call()
        except StoreBudgetSpent:
            side.abandoned(probe)
            raise
        except StoreUnavailable as exc:
            self._failed(side, probe, exc)
            raise
        except BaseException:
            side.abandoned(probe)
            raise
        self._succeeded(side, probe)
        return result

    # ------------------------------------------------------------------ the protocol

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        return await self._guard(self.reads, lambda: self.inner.find_longest(namespace, keys))

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        await self._guard(
            self.writes, lambda: self.inner.put(namespace, key, checkpoint, ttl_seconds)
        )

    async def delete(self, namespace: str, key: str) -> bool:
        return await self._guard(self.writes, lambda: self.inner.delete(namespace, key))

    async def ping(self) -> None:
        await self._guard(self.reads, self.inner.ping)

    @asynccontextmanager
    async def lock(self, name: str, ttl_seconds: float, wait_seconds: float) -> AsyncIterator[bool]:
        # Taking a lease writes (a row, a key), so it is judged with the writes. Only taking
        # it is judged: the body's exceptions are the caller's, and the backend's release
        # never raises.
        async with AsyncExitStack() as stack:

            async def enter() -> bool:
                return await stack.enter_async_context(
                    self.inner.lock(name, ttl_seconds, wait_seconds)
                )

            acquired = await self._guard(self.writes, enter)
            yield acquired

    async def close(self) -> None:
        await self.inner.close()


def _reason(exc: StoreUnavailable) -> str:
    """The kind of failure, safe to show anywhere: the cause's type name, not its message
    (which may hold a file path or a host)."""
    cause = exc.__cause__
    return type(cause).__name__ if cause is not None else type(exc).__name__
