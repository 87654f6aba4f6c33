"""The background-summary bookkeeping (compaction_proxy/engine/_prepare.py), without a server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from compaction_proxy.checkpoints import (
    Checkpoints,
    Lookup,
    MemoryStore,
    chain,
    namespace_for,
    scope_of,
)
from compaction_proxy.compaction import SummaryError, SummaryRequest
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.engine._prepare import (
    PREPARED_META,
    JobOutcome,
    PreparedProbe,
    Preparer,
    conversation_key,
    prepared_namespace,
)

SYSTEM = {"role": "system", "content": "s"}
MESSAGES = [SYSTEM, *({"role": "user", "content": f"m{i}"} for i in range(6))]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Lets the loop run until ``condition`` holds; fails after a generous bound."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def preparer(store: MemoryStore | None = None, clock: Clock | None = None, **settings: object):
    checkpoints = Checkpoints(MemoryStore() if store is None else store, ttl_seconds=600)
    config = SummarizationSettings.model_validate({"prepareTtl": 60, **settings})
    return Preparer(config, checkpoints, clock=clock or Clock())


def lookup_for(messages: list[dict[str, str]], namespace: str = "ns") -> Lookup:
    return Lookup(list(messages), 1, chain(namespace, messages[1:]), 0, None)


def _namespace(body: dict[str, object], tenant: str | None = None) -> str:
    return namespace_for(
        credential="Bearer k",
        summarizer_model="m",
        prompt_version="v",
        fingerprint="f",
        scope=scope_of(body, tenant),
    )


def test_the_conversation_key_is_shared_by_every_request_of_the_stretch() -> None:
    short, longer = lookup_for(MESSAGES[:5]), lookup_for(MESSAGES)
    assert conversation_key(short) == conversation_key(longer) is not None
    assert conversation_key(lookup_for([SYSTEM])) is None
    assert prepared_namespace("ns") != "ns"


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "system", "content": "other"}, *MESSAGES[1:]]},
        {"tools": [{"type": "function", "function": {"name": "t"}}]},
        {"user": "end-user-2"},
        {"safety_identifier": "hash-2"},
    ],
    ids=["system", "tools", "user", "safety_identifier"],
)
def test_another_scope_over_the_same_first_messages_is_another_conversation(
    change: dict[str, object],
) -> None:
    """The key comes from the chain, which starts from the namespace: for tenant isolation
    the namespace holds the system block, tools and per-user fields (it used to be the key
    alone that took the system block in, and tools or users were not told apart)."""
    body: dict[str, object] = {"model": "m", "messages": MESSAGES, "user": "end-user-1"}
    mine = lookup_for(MESSAGES, _namespace(body))
    other_body = {**body, **change}
    messages = other_body["messages"]
    assert isinstance(messages, list)
    other = lookup_for(messages, _namespace(other_body))
    assert conversation_key(other) != conversation_key(mine)
    tenant = lookup_for(MESSAGES, _namespace(body, "tenant-b"))
    assert conversation_key(tenant) != conversation_key(mine)


async def test_a_job_reports_pending_then_ready() -> None:
    prep = preparer()
    gate = asyncio.Event()

    async def job() -> JobOutcome:
        await gate.wait()
        return "made"

    assert prep.start("k", job) == "pending"
    assert prep.start("k", job) == "pending"  # one job per conversation
    assert prep.stats.in_flight == 1
    gate.set()
    await until(lambda: prep.stats.in_flight == 0)
    assert prep.state("k") == "ready" and prep.stats.made == 1 and prep.stats.in_flight == 0
    await prep.close()


async def test_the_oldest_job_is_dropped_for_a_new_one() -> None:
    prep = preparer(prepareMaxInFlight=2)
    never = asyncio.Event()
    cancelled: list[str] = []
    running: list[str] = []

    def job(name: str):
        async def run() -> JobOutcome:
            running.append(name)
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise
            return "made"

        return run

    for name in ("a", "b", "c"):
        prep.start(name, job(name))
        await until(lambda started=name: started in running)  # so a cancellation reaches it
    await until(lambda: cancelled == ["a"])
    assert cancelled == ["a"] and prep.stats.dropped == 1
    assert prep.state("a") == "none" and prep.state("c") == "pending"
    # The dropped conversation's next request does not start it again (it would drop "b",
    # whose next request would drop "c"...: with more conversations than jobs none finishes).
    # (Starting it would drop "b" at once, inside start().)
    assert prep.start("a", job("a")) == "none"
    assert prep.stats.dropped == 1 and prep.state("b") == "pending"
    await prep.close()
    # After close (shutdown), nothing new starts.
    assert prep.start("d", job("d")) == "none" and prep.stats.in_flight == 0


async def test_a_broken_job_fails_quietly_and_cools_down() -> None:
    clock = Clock()
    prep = preparer(clock=clock)

    async def broken() -> JobOutcome:
        raise RuntimeError("bug")

    prep.start("k", broken)
    await until(lambda: prep.stats.in_flight == 0)
    assert prep.stats.failed == 1 and prep.state("k") == "none"
    ran: list[int] = []

    async def again() -> JobOutcome:
        ran.append(1)
        return "empty"

    # Within the cool-down: not started (a started job is in flight at once).
    assert prep.start("k", again) == "none" and prep.stats.in_flight == 0
    assert ran == []
    clock.now += 31
    prep.start("k", again, size=10)
    await until(lambda: prep.stats.in_flight == 0)
    assert ran == [1]
    # Nothing to fold yet: tried again only once the conversation has grown by a step.
    assert prep.start("k", again, size=11) == "none" and prep.stats.in_flight == 0
    assert ran == [1] and prep.state("k") == "none"
    prep.start("k", again, size=12)
    await until(lambda: prep.stats.in_flight == 0)
    assert ran == [1, 1]
    await prep.close()


async def test_another_replica_holding_the_lease_reads_as_pending() -> None:
    store = MemoryStore()
    one, two = preparer(store), preparer(store)
    async with one.lease("ns", "k") as first, two.lease("ns", "k") as second:
        assert first and not second

    async def elsewhere() -> JobOutcome:
        return "elsewhere"

    two.start("k", elsewhere)
    await until(lambda: two.stats.in_flight == 0)  # done, and still reported pending
    assert two.state("k") == "pending"
    await one.close()
    await two.close()


async def test_found_used_and_deleted_or_swept_as_wasted() -> None:
    store, clock = MemoryStore(), Clock()
    prep = preparer(store, clock)
    early = lookup_for(MESSAGES[:5])  # the request that was prepared
    summary = {"role": "user", "content": "<summary>\nearly\n</summary>"}
    assert await prep.save("ns", early, [SYSTEM, summary], {"strategies": ["summarization"]})
    later = lookup_for(MESSAGES)  # the request on which the trigger fires
    found = await prep.find("ns", later)
    assert found is not None and found.covered == 4
    assert found.messages == [SYSTEM, summary, *MESSAGES[5:]]
    assert found.checkpoint is not None and found.checkpoint.meta[PREPARED_META] == clock.now
    clock.now += 5
    await prep.consume("ns", found, conversation_key(later))
    assert prep.stats.used == 1 and prep.stats.ages_used == [5.0]
    assert await prep.find("ns", later) is None  # deleted once used
    clock.now += 3600
    assert await prep.sweep() == 0  # used: not wasted
    # One nobody used is counted wasted once it outlives prepareTtl, and deleted.
    assert await prep.save("ns", early, [SYSTEM, summary], {})
    clock.now += 61
    assert await prep.sweep() == 1 and prep.stats.wasted == 1
    assert await prep.find("ns", later) is None
    await prep.close()


async def test_a_prepared_checkpoint_must_reach_past_the_ordinary_one() -> None:
    prep = preparer()
    summary = {"role": "user", "content": "<summary>\nx\n</summary>"}
    await prep.save("ns", lookup_for(MESSAGES[:3]), [SYSTEM, summary], {})
    ordinary = Lookup(
        [SYSTEM, summary, *MESSAGES[4:]],
        1,
        chain("ns", MESSAGES[1:]),
        3,
        None,
    )
    assert await prep.find("ns", ordinary) is None
    await prep.close()


async def test_the_probe_stops_the_first_run_only_when_something_is_prepared() -> None:
    calls: list[SummaryRequest] = []

    class Inner:
        async def summarize(self, request: SummaryRequest) -> str:
            calls.append(request)
            return "text"

    request = SummaryRequest(messages=(), previous_summary=None, model="m")

    async def nothing() -> Lookup | None:
        return None

    probe = PreparedProbe(Inner(), nothing)
    assert await probe.summarize(request) == "text" and probe.found is None

    async def something() -> Lookup | None:
        return lookup_for(MESSAGES)

    probe = PreparedProbe(Inner(), something)
    with pytest.raises(SummaryError):
        await probe.summarize(request)
    assert probe.found is not None and len(calls) == 1


def test_the_prepare_setting_takes_any_trigger_form_or_false() -> None:
    from compaction_proxy.compaction.triggers import TokenRatio, TokensExceed

    assert SummarizationSettings().prepare == TokenRatio(0.7)
    assert SummarizationSettings.model_validate({"prepare": False}).prepare is None
    ours = SummarizationSettings.model_validate({"prepare": {"tokens_exceed": 9000}})
    assert ours.prepare == TokensExceed(9000)
    dumped = ours.model_dump(mode="json")["prepare"]
    assert dumped == {"type": "tokens_exceed", "value": 9000}
    assert SummarizationSettings.model_validate({"prepare": dumped}).prepare == ours.prepare
    assert SummarizationSettings.model_validate({"prepare": False}).model_dump()["prepare"] is False
    with pytest.raises(ValueError, match="prepare"):
        SummarizationSettings.model_validate({"prepare": {"type": "token_ratio", "value": 7}})


async def test_a_store_down_at_the_lease_lets_the_job_go_ahead_and_its_errors_propagate() -> None:
    from contextlib import asynccontextmanager

    from compaction_proxy.checkpoints import StoreUnavailable

    class DownStore(MemoryStore):
        @asynccontextmanager
        async def _down(self):  # type: ignore[no-untyped-def]
            raise StoreUnavailable("down")
            yield True

        def lock(self, name, ttl_seconds, wait_seconds):  # type: ignore[no-untyped-def]
            return self._down()

    prep = preparer(DownStore())
    async with prep.lease("ns", "k") as acquired:
        assert acquired
    # A store failure inside the job is the job's, not a second "go ahead".
    with pytest.raises(StoreUnavailable):
        async with prep.lease("ns", "k"):
            raise StoreUnavailable("inside the job")
    await prep.close()
