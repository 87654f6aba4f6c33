"""Single-flight, back-off and the time budget around the summarizer
(compaction_proxy/summarizer/_flights.py)."""

from __future__ import annotations

import asyncio

import pytest

from compaction_proxy.checkpoints import MemoryStore, StoredValues
from compaction_proxy.compaction.summarizer import SummaryError, SummaryRequest
from compaction_proxy.summarizer import SummaryFlights

STRETCH = ({"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"})


class Recording:
    """A summarizer that counts its calls; optionally slow or failing."""

    def __init__(self, *, delay: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise SummaryError("error", "upstream said 500")
        return f"summary of {len(request.messages)} messages"


def request(*extra: dict[str, str]) -> SummaryRequest:
    return SummaryRequest(messages=(*STRETCH, *extra), previous_summary=None, model="m")


async def test_concurrent_identical_requests_share_one_call() -> None:
    inner = Recording(delay=0.05)
    flights = SummaryFlights(StoredValues(MemoryStore(100)))
    results = await asyncio.gather(
        *(flights.bind(inner, "ns").summarize(request()) for _ in range(6))
    )
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
    flights = SummaryFlights(None, backoff_base_seconds=0.2)
    guarded = flights.bind(inner, "ns")
    with pytest.raises(SummaryError) as first:
        await guarded.summarize(request())
    assert first.value.reason == "error"
    # The stretch grew by a turn; it starts at the same message: no new call.
    with pytest.raises(SummaryError) as again:
        await guarded.summarize(request({"role": "user", "content": "more"}))
    assert again.value.reason == "backoff" and inner.calls == 1
    await asyncio.sleep(0.25)
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
    inner = Recording(delay=5.0)
    flights = SummaryFlights(None, total_timeout_seconds=0.1)
    started = asyncio.get_running_loop().time()
    with pytest.raises(SummaryError) as caught:
        await flights.bind(inner, "ns").summarize(request())
    assert caught.value.reason == "timeout"
    assert asyncio.get_running_loop().time() - started < 2
