"""Single-flight, back-off and the time budget around the summarizer
(compaction_proxy/summarizer/_flights.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from compaction_proxy.checkpoints import MemoryStore, StoredValues
from compaction_proxy.compaction.summarizer_contract import SummaryError, SummaryRequest
from compaction_proxy.summarizer import SummaryFlights

STRETCH = ({"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"})


class Recording:
    """A summarizer that counts its calls; optionally held at a gate (until the test opens
    it, or forever) or failing."""

    def __init__(self, *, gate: asyncio.Event | None = None, fail: bool = False) -> None:
        self.calls = 0
        self.gate = gate
        self.fail = fail

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise SummaryError("error", "upstream said 500")
        return f"summary of {len(request.messages)} messages"


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Yields to the loop until ``condition`` holds; fails after a generous bound."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


def request(*extra: dict[str, str]) -> SummaryRequest:
    return SummaryRequest(messages=(*STRETCH, *extra), previous_summary=None, model="m")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_identical_requests_share_one_call() -> None:
    gate = asyncio.Event()
    inner = Recording(gate=gate)
    flights = SummaryFlights(StoredValues(MemoryStore(100)))
    callers = [
        asyncio.create_task(flights.bind(inner, "ns").summarize(request())) for _ in range(6)
    ]
    # Every caller is waiting while the one call is held at the gate.
    await wait_until(lambda: inner.calls == 1 and all(not c.done() for c in callers))
    for _ in range(20):
        await asyncio.sleep(0)  # let any second call start, if one would
    assert inner.calls == 1
    gate.set()
    results = await asyncio.gather(*callers)
    assert inner.calls == 1
    assert set(results) == {"summary of 2 messages"}


async def test_a_stored_result_serves_another_replica_without_a_call() -> None:
    store = StoredValues(MemoryStore(100))
    first, second = Recording(), Recording()
    await SummaryFlights(store).bind(first, "ns").summarize(request())
    text = await SummaryFlights(store).bind(second, "ns").summarize(request())
    assert (first.calls, second.calls) == (1, 0)
    assert text == "summary of 2 messages"


async def test_namespaces_never_share_a_result() -> None:
    inner = Recording()
    flights = SummaryFlights(StoredValues(MemoryStore(100)))
    await flights.bind(inner, "tenant-a").summarize(request())
    await flights.bind(inner, "tenant-b").summarize(request())
    assert inner.calls == 2


async def test_after_a_failure_the_same_start_backs_off_then_retries() -> None:
    inner = Recording(fail=True)
    clock = Clock()
    flights = SummaryFlights(None, backoff_base_seconds=30, clock=clock)
    guarded = flights.bind(inner, "ns")
    with pytest.raises(SummaryError) as first:
        await guarded.summarize(request())
    assert first.value.reason == "error"
    # The stretch grew by a turn; it starts at the same message: no new call.
    with pytest.raises(SummaryError) as again:
        await guarded.summarize(request({"role": "user", "content": "more"}))
    assert again.value.reason == "backoff" and inner.calls == 1
    clock.now += 29.9  # not yet
    with pytest.raises(SummaryError) as still:
        await guarded.summarize(request())
    assert still.value.reason == "backoff" and inner.calls == 1
    clock.now += 0.2  # the back-off has run out
    inner.fail = False
    assert await guarded.summarize(request()) == "summary of 2 messages"
    assert inner.calls == 2


async def test_a_summary_the_pipeline_rejected_backs_off_too() -> None:
    inner = Recording()
    flights = SummaryFlights(None)
    guarded = flights.bind(inner, "ns")
    await guarded.summarize(request())
    guarded.reject()  # e.g. not shorter than what it would replace
    with pytest.raises(SummaryError) as caught:
        await guarded.summarize(request({"role": "user", "content": "more"}))
    assert caught.value.reason == "backoff"


async def test_one_summary_has_one_time_budget() -> None:
    inner = Recording(gate=asyncio.Event())  # never opened: the call would never return
    flights = SummaryFlights(None, total_timeout_seconds=0.1)
    with pytest.raises(SummaryError) as caught:
        # The budget, not this generous bound, ends the wait.
        await asyncio.wait_for(flights.bind(inner, "ns").summarize(request()), 30)
    assert caught.value.reason == "timeout"
