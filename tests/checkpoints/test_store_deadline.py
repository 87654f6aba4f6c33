"""One store time budget per request (compaction_proxy/checkpoints/_deadline.py), honoured by
the backends. Timing bounds here are generous: they fail only when a call waits out its own
timeout instead of the budget."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction_proxy.checkpoints import (
    Checkpoint,
    RedisStore,
    SqliteStore,
    StoreBudget,
    StoreBudgetSpent,
    StoreUnavailable,
    budget_left,
    store_deadline,
)
from compaction_proxy.checkpoints._deadline import bounded
from tests.reliability.hung_server import HungServer

RECORD = Checkpoint(messages=(), created_at=1.0, meta={})


class Ticks:
    """A fake monotonic clock for budgets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hung() -> Iterator[HungServer]:
    with HungServer(lifetime=60) as server:
        yield server


async def test_no_budget_means_the_calls_own_timeout() -> None:
    assert budget_left() is None
    with pytest.raises(TimeoutError):
        async with bounded(0.05):
            await asyncio.sleep(5)


async def test_calls_share_the_budget_and_are_charged_what_they_took() -> None:
    ticks = Ticks()
    with StoreBudget(2.0, clock=ticks) as budget:
        for _ in range(3):
            async with bounded(10.0):
                ticks.now += 0.5
        assert budget.spent == pytest.approx(1.5)
        assert budget_left() == pytest.approx(0.5)
        ticks.now += 0.5  # time outside store calls (a summarizer call) costs nothing
        assert budget_left() == pytest.approx(0.5)
        async with bounded(10.0):
            ticks.now += 0.7
        with pytest.raises(StoreBudgetSpent):
            async with bounded(10.0):
                pytest.fail("a call with no budget left is not attempted")
    assert budget_left() is None, "the budget ends with its block"


async def test_a_call_is_cut_at_what_is_left_of_the_budget() -> None:
    async def cut() -> bool:
        with store_deadline(0.2):
            try:
                async with bounded(3600.0):  # the call's own bound: an hour
                    await asyncio.Event().wait()  # a call that never returns
            except TimeoutError:
                return True
        return False

    # Only the 0.2 s budget can end this within the outer bound (a TimeoutError of its own).
    assert await asyncio.wait_for(cut(), 30)


async def test_re_entering_a_budget_keeps_what_is_left() -> None:
    ticks = Ticks()
    budget = StoreBudget(1.0, clock=ticks)
    with budget:
        async with bounded(None):
            ticks.now += 0.75
    with budget:  # e.g. around the checkpoint write once the upstream answered
        assert budget_left() == pytest.approx(0.25)
        with budget:  # re-entered while active: still one budget, charged once
            async with bounded(None):
                ticks.now += 0.1
    assert budget.spent == pytest.approx(0.85)


async def test_nested_budgets_the_tightest_bounds_and_all_are_charged() -> None:
    ticks = Ticks()
    outer = StoreBudget(5.0, clock=ticks)
    inner = StoreBudget(1.0, clock=ticks)
    with outer, inner:
        assert budget_left() == pytest.approx(1.0)
        async with bounded(None):
            ticks.now += 1.0
        with pytest.raises(StoreBudgetSpent):
            async with bounded(None):
                pass
    assert outer.spent == pytest.approx(1.0)


async def test_concurrent_requests_have_their_own_budgets() -> None:
    async def request(seconds: float) -> float | None:
        with store_deadline(seconds):
            await asyncio.sleep(0.01)
            return budget_left()

    left = list(await asyncio.gather(request(1.0), request(3.0)))
    assert left == [pytest.approx(1.0), pytest.approx(3.0)]


async def test_redis_calls_share_the_budget_against_a_hung_redis(hung: HungServer) -> None:
    # The store's own timeouts are long (120 s a call): only the 0.3 s budget can end these
    # calls within the 30 s bound below.
    store = RedisStore(hung.url, socket_timeout=120, connect_timeout=120, op_timeout=120)
    async with asyncio.timeout(30):
        await _share_the_budget(store)
    assert hung.accepted >= 1, "the store did connect: the server accepts, it never answers"
    await store.close()


async def _share_the_budget(store: RedisStore) -> None:
    with store_deadline(0.3):
        with pytest.raises(StoreUnavailable) as first:
            await store.find_longest("ns", ["k"])
        assert not isinstance(first.value, StoreBudgetSpent), "the first call was attempted"
        with pytest.raises(StoreBudgetSpent):
            await store.put("ns", "k", RECORD, 60)
        with pytest.raises(StoreBudgetSpent):
            async with store.lock("l", 10, 1):
                pass


async def test_sqlite_calls_honour_the_budget(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "cp.db", busy_timeout_ms=120_000)
    await store.ping()
    blocker = sqlite3.connect(store.path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # every write now waits for the busy timeout
    try:
        # Only the 0.3 s budget can end the write within the 30 s bound (busy timeout 120 s).
        with store_deadline(0.3), pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.put("ns", "k", RECORD, 60), 30)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await store.put("ns", "k", RECORD, 60)  # the store works again once the lock is gone
    assert await store.find_longest("ns", ["k"]) == (1, RECORD)
    await store.close()
