"""One time budget for all the store calls of one request.

A compacted request makes several store round trips (the learned window, the checkpoint
lookup, the shared summary, the summary lock, the checkpoint write). Each one alone is bounded
by its backend's timeout, but in a row against a slow store they add up: four 3 s timeouts are
12 s. A :class:`StoreBudget` entered around the request caps their sum.

It is a budget of *time spent inside store calls*, not a wall-clock deadline: between the
calls the request waits for a summarizer (seconds) and polls a lock held by another replica.
A wall-clock deadline would expire during those waits and then cut off the calls that must
follow them (storing the summary, releasing the lock, writing the checkpoint), on every
request that summarizes, with a perfectly healthy store.

The budget lives in a context variable, so every coroutine of the request (and tasks it
starts) shares it without passing it around; backends read it through :func:`bounded`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar, Token
from types import TracebackType

from ._contract import StoreUnavailable

_active: ContextVar[tuple[StoreBudget, ...]] = ContextVar("store_budgets", default=())


class StoreBudgetSpent(StoreUnavailable):
    """The request's store budget was used up before this call started: it was not attempted,
    so it says nothing about the store's health (the circuit breaker does not count it)."""


class StoreBudget:
    """``with StoreBudget(2.0): ...``: store calls inside spend at most 2 s in total.

    The same object may be entered again later in the request (e.g. around the checkpoint
    write after the upstream answered): it keeps what is left. Nested budgets all apply; the
    tightest one bounds a call and every one of them is charged for it.
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = max(0.0, seconds)
        self.spent = 0.0
        self.clock = clock
        self._tokens: list[Token[tuple[StoreBudget, ...]]] = []

    def left(self) -> float:
        return self.seconds - self.spent

    def charge(self, seconds: float) -> None:
        self.spent += max(0.0, seconds)

    def __enter__(self) -> StoreBudget:
        active = _active.get()
        if self not in active:
            self._tokens.append(_active.set((*active, self)))
        else:
            self._tokens.append(_active.set(active))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _active.reset(self._tokens.pop())


def store_deadline(seconds: float) -> StoreBudget:
    """``with store_deadline(2.0):``: the store calls of the block share 2 s (see module doc)."""
    return StoreBudget(seconds)


@contextmanager
def detached_budget(seconds: float) -> Iterator[StoreBudget]:
    """A block whose store calls are bounded by a budget of their own instead of the
    request's: the archive's many writes (docs/recall.md) must neither be cut short by what
    the request spent nor spend what its later calls need."""
    budget = StoreBudget(seconds)
    token = _active.set((budget,))
    try:
        yield budget
    finally:
        _active.reset(token)


def budget_left() -> float | None:
    """Seconds the tightest active budget has left; None when no budget is active."""
    active = _active.get()
    if not active:
        return None
    return min(budget.left() for budget in active)


@asynccontextmanager
async def bounded(timeout: float | None) -> AsyncIterator[None]:
    """Runs one store call under ``min(timeout, the budget left)``.

    Raises :class:`StoreBudgetSpent` at once when nothing is left, and ``TimeoutError`` when
    the call runs out of time (the backend turns it into :class:`StoreUnavailable`). The time
    the call took is charged to every active budget, whether it succeeded or not.
    """
    active = _active.get()
    limit = timeout
    if active:
        left = min(budget.left() for budget in active)
        if left <= 0:
            raise StoreBudgetSpent("this request's store time budget is used up")
        limit = left if limit is None else min(limit, left)
    clock = active[0].clock if active else time.monotonic
    started = clock()
    try:
        async with asyncio.timeout(limit):
            yield
    finally:
        elapsed = clock() - started
        for budget in active:
            budget.charge(elapsed)
