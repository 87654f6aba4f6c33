"""The store circuit breaker (compaction_proxy/checkpoints/_breaker.py), on a fake backend and
a fake clock: no assertion here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Literal

import pytest

from compaction_proxy.checkpoints import (
    Checkpoint,
    CheckpointStore,
    MemoryStore,
    StoreBreaker,
    StoreBudgetSpent,
    StoreMarkedDown,
    StoreUnavailable,
)
from compaction_proxy.checkpoints._deadline import bounded

Mode = Literal["ok", "fail", "hang", "budget"]
RECORD = Checkpoint(messages=(), created_at=1.0, meta={"x": 1})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeBackend:
    """Answers, fails, or hangs (bounded by a short timeout, as a real backend is), as told.

    ``mode`` sets both sides; ``read_mode`` and ``write_mode`` one each (a full disk fails
    the writes only). ``gate``: when set, every call first waits for it (to hold a probe in
    flight).
    """

    name = "fake"

    def __init__(self) -> None:
        self.read_mode: Mode = "ok"
        self.write_mode: Mode = "ok"
        self.calls = 0
        self.reads = 0
        self.writes = 0
        self.gate: asyncio.Event | None = None
        self.foreign_values = 3

    @property
    def mode(self) -> Mode:
        assert self.read_mode == self.write_mode
        return self.read_mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self.read_mode = self.write_mode = mode

    async def _answer(self, write: bool = False) -> None:
        self.calls += 1
        if write:
            self.writes += 1
        else:
            self.reads += 1
        mode = self.write_mode if write else self.read_mode  # as it was when the call was made
        if self.gate is not None:
            await self.gate.wait()
        if mode == "fail":
            try:
                raise ConnectionRefusedError("connection refused")
            except ConnectionRefusedError as exc:
                raise StoreUnavailable("fake store /secret/path/db: refused") from exc
        if mode == "budget":
            raise StoreBudgetSpent("budget used up")
        if mode == "hang":
            try:
                async with bounded(0.05):
                    await asyncio.Event().wait()
            except TimeoutError as exc:
                raise StoreUnavailable("fake store: timed out") from exc

    async def find_longest(
        self, namespace: str, keys: Sequence[str]
    ) -> tuple[int, Checkpoint] | None:
        await self._answer()
        return (1, RECORD) if keys else None

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl_seconds: int) -> None:
        await self._answer(write=True)

    async def delete(self, namespace: str, key: str) -> bool:
        await self._answer(write=True)
        return True

    async def ping(self) -> None:
        await self._answer()

    def lock(
        self, name: str, ttl_seconds: float, wait_seconds: float
    ) -> AbstractAsyncContextManager[bool]:
        return self._lock()

    @asynccontextmanager
    async def _lock(self) -> AsyncIterator[bool]:
        await self._answer(write=True)
        yield True

    async def close(self) -> None:
        return None


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def breaker(backend: FakeBackend, clock: FakeClock) -> StoreBreaker:
    return StoreBreaker(backend, clock=clock, wall_clock=lambda: 1_700_000_000.0)


async def every_call(store: StoreBreaker) -> None:
    """Each protocol call once; each must be refused with StoreMarkedDown."""
    with pytest.raises(StoreMarkedDown):
        await store.find_longest("ns", ["k"])
    with pytest.raises(StoreMarkedDown):
        await store.put("ns", "k", RECORD, 60)
    with pytest.raises(StoreMarkedDown):
        await store.delete("ns", "k")
    with pytest.raises(StoreMarkedDown):
        await store.ping()
    with pytest.raises(StoreMarkedDown):
        async with store.lock("l", 10, 1):
            pytest.fail("the lock body must not run while the store is down")


def test_is_a_checkpoint_store(breaker: StoreBreaker) -> None:
    assert isinstance(breaker, CheckpointStore)
    assert breaker.name == "fake"
    assert breaker.foreign_values == 3, "the backend's counter shows through"
    assert breaker.readiness().up


async def test_passes_calls_through_while_closed(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    assert await breaker.find_longest("ns", ["k"]) == (1, RECORD)
    await breaker.put("ns", "k", RECORD, 60)
    assert await breaker.delete("ns", "k") is True
    await breaker.ping()
    async with breaker.lock("l", 10, 1) as acquired:
        assert acquired
    assert backend.calls == 5
    assert breaker.reads.state == breaker.writes.state == "closed"
    assert breaker.reads.skipped == breaker.writes.skipped == 0


@pytest.mark.parametrize("mode", ["fail", "hang"])
async def test_one_failure_opens_it_and_later_calls_are_skipped_at_once(
    breaker: StoreBreaker, backend: FakeBackend, mode: Mode
) -> None:
    backend.mode = mode
    with pytest.raises(StoreUnavailable) as first:
        await breaker.find_longest("ns", ["k"])
    assert not isinstance(first.value, StoreMarkedDown), "the first call did reach the backend"
    assert backend.calls == 1
    ready = breaker.readiness().reads
    assert not ready.up and ready.state == "open"
    assert ready.down_since == 1_700_000_000.0
    assert ready.retry_in == pytest.approx(1.0)
    assert ready.failures == 1 and breaker.reads.opened == 1
    # A failed read: the backend cannot be reached, so the writes are marked down with it.
    writes = breaker.readiness().writes
    assert not writes.up and writes.with_reads and breaker.writes.opened == 1
    # While open nothing reaches the backend (which would hang for real in "hang" mode).
    await asyncio.wait_for(every_call(breaker), timeout=5)
    assert backend.calls == 1
    assert breaker.reads.skipped == 2 and breaker.writes.skipped == 3


async def test_back_off_doubles_up_to_thirty_seconds(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    seen = [breaker.readiness().reads.retry_in]
    for _ in range(7):
        clock.advance(0.5)
        with pytest.raises(StoreMarkedDown):  # still inside the back-off
            await breaker.ping()
        clock.advance(seen[-1] or 0)
        with pytest.raises(StoreUnavailable) as probe:  # the probe reaches the backend, fails
            await breaker.ping()
        assert not isinstance(probe.value, StoreMarkedDown)
        seen.append(breaker.readiness().reads.retry_in)
    assert seen == pytest.approx([1, 2, 4, 8, 16, 30, 30, 30])
    assert breaker.reads.opened == 1, "probes re-open it; only the first failure opens it"
    assert breaker.readiness().reads.failures == 8
    assert breaker.readiness().reads.down_since == 1_700_000_000.0, "down since the first"


async def test_a_successful_probe_closes_it_and_resets_the_back_off(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    clock.advance(1.0)
    with pytest.raises(StoreUnavailable):
        await breaker.ping()  # failed probe: 2 s now
    clock.advance(2.0)
    backend.mode = "ok"
    assert await breaker.find_longest("ns", ["k"]) == (1, RECORD)  # the probe
    assert breaker.readiness().up and breaker.reads.state == "closed"
    assert breaker.writes.state == "closed", "the writes that followed the reads are back too"
    assert breaker.readiness().reads.down_since is None
    await breaker.put("ns", "k", RECORD, 60)
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    assert breaker.readiness().reads.retry_in == pytest.approx(1.0), "the first back-off again"
    assert breaker.reads.opened == 2


async def test_half_open_lets_exactly_one_probe_through(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    clock.advance(1.0)
    backend.mode = "ok"
    backend.gate = asyncio.Event()
    probe = asyncio.create_task(breaker.find_longest("ns", ["k"]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert breaker.reads.state == "half_open" and not breaker.readiness().up
    calls = backend.calls
    with pytest.raises(StoreMarkedDown):  # others still skip while the probe is out
        await breaker.ping()
    with pytest.raises(StoreMarkedDown):  # and the writes wait for the reads
        await breaker.put("ns", "k", RECORD, 60)
    assert backend.calls == calls
    backend.gate.set()
    assert await probe == (1, RECORD)
    assert breaker.readiness().reads.state == "closed" and breaker.readiness().up


async def test_a_cancelled_probe_lets_the_next_call_probe(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    clock.advance(1.0)
    backend.mode = "ok"
    backend.gate = asyncio.Event()
    probe = asyncio.create_task(breaker.ping())
    await asyncio.sleep(0)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    backend.gate = None
    await breaker.ping()  # a new probe, not refused
    assert breaker.reads.state == "closed"


async def test_a_probe_that_never_returns_is_replaced_and_its_late_failure_ignored(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    clock.advance(1.0)
    gate = asyncio.Event()
    backend.gate = gate
    stuck = asyncio.create_task(breaker.ping())  # the probe; its answer will be a failure
    await asyncio.sleep(0)
    clock.advance(10.0)
    with pytest.raises(StoreMarkedDown):
        await breaker.ping()  # the probe is out: others skip
    clock.advance(20.0)  # the longest back-off: the stuck probe no longer holds the store down
    backend.gate = None
    backend.mode = "ok"
    await breaker.ping()
    assert breaker.readiness().up
    gate.set()
    with pytest.raises(StoreUnavailable):
        await stuck
    assert breaker.readiness().up, "the replaced probe's failure changes nothing"


async def test_late_answers_from_before_the_failure_neither_close_nor_double_it(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    gate = asyncio.Event()
    backend.gate = gate
    slow_ok = asyncio.create_task(breaker.find_longest("ns", ["k"]))
    await asyncio.sleep(0)
    backend.mode = "fail"
    slow_fail = asyncio.create_task(breaker.ping())
    await asyncio.sleep(0)
    backend.gate = None
    with pytest.raises(StoreUnavailable):
        await breaker.find_longest("ns", ["k2"])  # a third call fails first and opens it
    assert backend.calls == 3
    gate.set()
    assert await slow_ok == (1, RECORD)
    with pytest.raises(StoreUnavailable):
        await slow_fail
    ready = breaker.readiness().reads
    assert ready.state == "open", "an answer to a call made before the failure is no probe"
    assert ready.retry_in == pytest.approx(1.0) and ready.failures == 1
    assert breaker.reads.opened == 1


async def test_a_spent_request_budget_is_not_a_store_failure(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    backend.mode = "budget"
    with pytest.raises(StoreBudgetSpent):
        await breaker.find_longest("ns", ["k"])
    assert breaker.readiness().up and breaker.reads.opened == breaker.writes.opened == 0


async def test_a_failure_inside_the_lock_body_is_the_callers(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    with pytest.raises(StoreUnavailable):
        async with breaker.lock("l", 10, 1) as acquired:
            assert acquired
            raise StoreUnavailable("raised by the caller's own store call")
    assert breaker.readiness().up


async def test_a_lock_that_cannot_be_taken_opens_it(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        async with breaker.lock("l", 10, 1):
            pytest.fail("not acquired, not entered")
    assert breaker.writes.state == "open"
    assert breaker.reads.state == "closed", "a lease is a write: the reads go on"


async def test_readiness_names_no_path_and_says_since_when(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    backend.mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    ready = breaker.readiness()
    assert ready.reads.reason == "ConnectionRefusedError"
    text = ready.describe()
    assert "/secret/path" not in text
    assert text == (
        "degraded: reads and writes marked down since 2023-11-14T22:13:20Z "
        "(ConnectionRefusedError; next probe in 1.0s)"
    )
    with pytest.raises(StoreMarkedDown) as skipped:
        await breaker.ping()
    assert "/secret/path" not in str(skipped.value)


async def test_a_sqlite_error_opens_it_too(tmp_path: object, clock: FakeClock) -> None:
    """Every backend sits behind the breaker: a broken disk is a failure like a dead Redis."""

    class Broken(MemoryStore):
        async def find_longest(
            self, namespace: str, keys: Sequence[str]
        ) -> tuple[int, Checkpoint] | None:
            try:
                raise sqlite3.OperationalError("disk I/O error")
            except sqlite3.Error as exc:
                raise StoreUnavailable("sqlite store /data/cp.db: disk I/O error") from exc

    breaker = StoreBreaker(Broken(), clock=clock)
    with pytest.raises(StoreUnavailable):
        await breaker.find_longest("ns", ["k"])
    assert breaker.readiness().reads.reason == "OperationalError"
    with pytest.raises(StoreMarkedDown):
        await breaker.put("ns", "k", RECORD, 60)


# --------------------------------------------------------------------------- reads and writes


async def test_a_failed_write_leaves_the_reads_up(
    breaker: StoreBreaker, backend: FakeBackend
) -> None:
    """A full disk: every write fails, every stored checkpoint can still be read."""
    backend.write_mode = "fail"
    with pytest.raises(StoreUnavailable) as first:
        await breaker.put("ns", "k", RECORD, 60)
    assert not isinstance(first.value, StoreMarkedDown)
    for _ in range(4):
        assert await breaker.find_longest("ns", ["k"]) == (1, RECORD)
        await breaker.ping()
    assert backend.reads == 8, "every read reached the backend"
    writes = backend.writes
    with pytest.raises(StoreMarkedDown):
        await breaker.put("ns", "k2", RECORD, 60)
    with pytest.raises(StoreMarkedDown):
        await breaker.delete("ns", "k")
    with pytest.raises(StoreMarkedDown):
        async with breaker.lock("l", 10, 1):
            pytest.fail("no lease while the writes are down")
    assert backend.writes == writes, "the writes back off: none reached the backend"
    ready = breaker.readiness()
    assert ready.reads.up and not ready.writes.up and not ready.up
    assert not ready.writes.with_reads
    assert breaker.reads.opened == 0 and breaker.writes.opened == 1
    assert breaker.reads.skipped == 0 and breaker.writes.skipped == 3
    assert ready.describe() == (
        "degraded: reads ok; writes marked down since 2023-11-14T22:13:20Z "
        "(ConnectionRefusedError; next probe in 1.0s)"
    )


async def test_writes_back_off_on_their_own_clock(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.write_mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.put("ns", "k", RECORD, 60)
    seen = [breaker.readiness().writes.retry_in]
    for _ in range(3):
        clock.advance(0.5)
        with pytest.raises(StoreMarkedDown):
            await breaker.put("ns", "k", RECORD, 60)
        assert await breaker.find_longest("ns", ["k"]) == (1, RECORD)
        clock.advance(seen[-1] or 0)
        with pytest.raises(StoreUnavailable) as probe:  # one write probes, and fails
            await breaker.put("ns", "k", RECORD, 60)
        assert not isinstance(probe.value, StoreMarkedDown)
        seen.append(breaker.readiness().writes.retry_in)
    assert seen == pytest.approx([1, 2, 4, 8])
    assert backend.writes == 4, "one write per back-off, not one per call"
    backend.write_mode = "ok"
    clock.advance(8.0)
    await breaker.put("ns", "k", RECORD, 60)  # the probe that brings them back
    assert breaker.readiness().up
    assert breaker.reads.opened == 0, "the reads were never marked down"


async def test_a_failed_read_takes_the_writes_down_until_the_reads_are_back(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    """A hung or dead backend: a write would cost the request its whole store budget."""
    backend.read_mode = "hang"
    with pytest.raises(StoreUnavailable):
        await breaker.find_longest("ns", ["k"])
    ready = breaker.readiness()
    assert not ready.reads.up and ready.writes.with_reads
    assert ready.writes.describe().endswith("(TimeoutError; back when reads are)")
    clock.advance(5.0)  # past the reads' back-off: the writes still wait for them
    with pytest.raises(StoreMarkedDown):
        await breaker.put("ns", "k", RECORD, 60)
    assert backend.writes == 0
    backend.read_mode = "ok"
    await breaker.ping()  # the reads' probe
    assert breaker.readiness().up, "the writes come back with the reads"
    await breaker.put("ns", "k", RECORD, 60)
    assert backend.writes == 1


async def test_writes_down_on_their_own_keep_their_back_off_when_the_reads_recover(
    breaker: StoreBreaker, backend: FakeBackend, clock: FakeClock
) -> None:
    backend.write_mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.put("ns", "k", RECORD, 60)
    clock.advance(1.0)
    with pytest.raises(StoreUnavailable):
        await breaker.put("ns", "k", RECORD, 60)  # failed probe: 2 s now
    backend.read_mode = "fail"
    with pytest.raises(StoreUnavailable):
        await breaker.ping()
    backend.read_mode = "ok"
    clock.advance(1.0)
    await breaker.ping()  # reads back
    ready = breaker.readiness()
    assert ready.reads.up and not ready.writes.up and not ready.writes.with_reads
    assert ready.writes.failures == 2 and ready.writes.retry_in == pytest.approx(1.0)
    with pytest.raises(StoreMarkedDown):
        await breaker.put("ns", "k", RECORD, 60)
