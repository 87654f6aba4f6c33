"""Summaries made ahead of time, so the compaction turn does not wait for the summarizer.

Without this, the request on which summarization fires waits for a whole summarizer call
(seconds with a real model) before it goes upstream. With ``summarization.prepare`` (default
``token_ratio: 0.6``, below the trigger's 0.8) the proxy sees the conversation coming:

1. A request that crosses the prepare threshold, but not the trigger, goes upstream at once and
   untouched. In the background the pipeline runs on it *as if the growth still to come up to
   the trigger were already there* (:class:`~compaction_proxy.compaction.Calibration` ``offset``),
   so its result lands at the target by the time it is used. The result is stored as a *prepared*
   checkpoint, keyed like any checkpoint by the hash chain of the client messages it stands
   for, in a namespace of its own: it is not used before the trigger fires (forwarding it
   earlier would compact at 0.6 and change the prefix sooner).
2. When the trigger fires and the pipeline asks for a summary, the flow first looks for a
   prepared checkpoint covering a prefix of the request (waiting for one still being made here,
   at most ``summarization.timeout``). Found: the request continues from it, the messages after
   its prefix verbatim, and the pipeline runs again on that view; normally nothing fires (a
   rolling update only if it is still over the trigger). The result is stored as an ordinary
   checkpoint, so the following requests keep its prefix. An event that asked for no summary
   (a collapse, or carried user messages released, reached the target) continues from one
   too, after the same wait: it was paid for, and a checkpoint stored past the prefix it was
   made on would leave it unused for good.

Bounded and harmless: at most ``prepareMaxInFlight`` jobs per process (a new one drops the
oldest), one per conversation in a process and, through a store lease, across replicas; jobs
run outside the request's store budget and never raise into a request; nothing is prepared for
``X-Compaction: off``, dry runs or forced runs; an unused prepared checkpoint expires after
``prepareTtl`` and is counted as wasted by the process that made it.

A conversation is recognised by the chain hash a few messages past its newest checkpoint
(:func:`conversation_key`): the same for every request of the stretch being prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from compaction_proxy.checkpoints import Checkpoints, Lookup, StoreUnavailable
from compaction_proxy.compaction import CompactionResult, Summarizer, SummaryError, SummaryRequest
from compaction_proxy.compaction.canonical import digest
from compaction_proxy.compaction.settings import SummarizationSettings

log = logging.getLogger("compaction_proxy.prepare")

PrepareState = Literal["pending", "ready", "none"]
"""``X-Compaction-Prepared``: a summary is being made for this conversation (here or in another
replica), one is stored and waits for the trigger (or was just used), or neither."""

JobOutcome = Literal["made", "found", "elsewhere", "empty", "failed"]
Outcome = Literal["made", "used", "wasted", "failed", "dropped"]
"""What :class:`PreparedStats` counts (the ``outcome`` label of the metric)."""

PREPARED_META = "prepared_at"
"""Meta key of a prepared checkpoint: when it was made (seconds since the epoch)."""
_GRACE_SECONDS = 120
"""Stored entries outlive ``prepareTtl`` by this much, so the process that made one can still
tell at expiry whether it was used (deleted) or wasted (still there)."""
_COOLDOWN_SECONDS = 30.0
"""After a job that failed, the conversation is not prepared again for this long (the
summarizer's own back-off applies besides)."""
_EMPTY_GROWTH = 2
"""After a job that found nothing to fold, messages the conversation must grow by (one step:
a call and its result) before it is tried again."""
_MAX_TRACKED = 10_000


def prepared_namespace(namespace: str) -> str:
    """Prepared checkpoints live apart from the ordinary ones of the same namespace."""
    return digest(("prepared\x1f" + namespace).encode()).hex()


def conversation_key(lookup: Lookup) -> str | None:
    """The chain hash three messages past the newest checkpoint (or the last message).

    Every request of the stretch being prepared shares it: they all extend the same checkpoint
    and the same first messages after it. The chain starts from the request's namespace, which
    holds its system block, tools and per-user fields (compaction_proxy/checkpoints/_keys.py),
    so two conversations of one tenant that open with the same three messages under different
    system prompts, tools or users have different keys. Two that
    share all of it share the key: one may wait for the other's job, or be told ``ready`` for
    a summary that is not its own, and then summarizes as without ``prepare``. Nothing is ever
    used for the wrong conversation: prepared checkpoints are found by the full chain.
    """
    if not lookup.hashes:
        return None
    return lookup.hashes[min(lookup.covered + 2, len(lookup.hashes) - 1)]


@dataclass(slots=True)
class PreparedStats:
    """Counters for ``/metrics`` and the dashboard (read, never reset)."""

    made: int = 0
    used: int = 0
    wasted: int = 0
    failed: int = 0
    dropped: int = 0
    in_flight: int = 0
    ages_used: list[float] = field(default_factory=list)
    listeners: list[Callable[[str, float | None], None]] = field(default_factory=list)

    def count(self, outcome: Outcome, age: float | None = None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        for listener in self.listeners:
            try:
                listener(outcome, age)
            except Exception:  # a metrics bug must not break the job
                log.exception("prepared-summary listener failed")


class Preparer:
    """Process-wide state of the background summaries: jobs, what is ready, what to sweep."""

    def __init__(
        self,
        settings: SummarizationSettings,
        checkpoints: Checkpoints | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.condition = settings.prepare
        self.ttl_seconds = settings.prepare_ttl
        self.max_in_flight = settings.prepare_max_in_flight
        self.wait_seconds = settings.timeout
        self.checkpoints = checkpoints
        self.stats = PreparedStats()
        self._clock = clock
        self._jobs: OrderedDict[str, asyncio.Task[None]] = OrderedDict()
        self._ready: OrderedDict[str, float] = OrderedDict()  # key -> expires at
        self._quiet: OrderedDict[str, tuple[float, PrepareState]] = OrderedDict()
        self._empty: OrderedDict[str, int] = OrderedDict()  # key -> messages when tried
        self._made: OrderedDict[tuple[str, str], float] = OrderedDict()  # (ns, hash) -> made at
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.condition is not None and self.checkpoints is not None

    def wants(self, result: CompactionResult) -> bool:
        """Whether a request the pipeline left alone has crossed the prepare threshold."""
        if not self.enabled or result.changed or result.metrics is None:
            return False
        assert self.condition is not None
        return self.condition.fires(result.metrics)

    # -- state --------------------------------------------------------------------------------

    def state(self, key: str) -> PrepareState:
        if key in self._jobs:
            return "pending"
        now = self._clock()
        expires = self._ready.get(key)
        if expires is not None:
            if expires > now:
                return "ready"
            del self._ready[key]
        quiet = self._quiet.get(key)
        if quiet is not None:
            if quiet[0] > now:
                return quiet[1]
            del self._quiet[key]
        return "none"

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > _MAX_TRACKED:
            table.popitem(last=False)

    # -- jobs ---------------------------------------------------------------------------------

    def start(
        self, key: str, job: Callable[[], Awaitable[JobOutcome]], size: int = 0
    ) -> PrepareState:
        """Run ``job`` in the background for conversation ``key`` unless one is running or
        done; returns the state to report. Never blocks, never raises.

        ``size``: the request's message count. A job that found nothing to fold (the stretch
        past the checkpoint was still all kept verbatim) is tried again once the conversation
        has grown by a step, not before.
        """
        state = self.state(key)
        if state != "none" or key in self._quiet:
            return state  # running, done, or cooling down after a job that failed
        tried = self._empty.get(key)
        if tried is not None and size < tried + _EMPTY_GROWTH:
            return "none"
        self._empty.pop(key, None)
        if self._closed:
            return "none"
        while len(self._jobs) >= self.max_in_flight:
            dropped, oldest = self._jobs.popitem(last=False)
            oldest.cancel()
            self.stats.count("dropped")
            # Not restarted by its next request (it would drop another in turn: with more
            # conversations than jobs, none would ever finish).
            self._remember(self._quiet, dropped, (self._clock() + _COOLDOWN_SECONDS, "none"))
        # A fresh context: the job must not inherit the request's store budget (it outlives
        # the request) nor anything else request-scoped.
        task = asyncio.get_running_loop().create_task(
            self._run(key, job, size), context=contextvars.Context()
        )
        self._jobs[key] = task
        self.stats.in_flight = len(self._jobs)
        self._ensure_sweeper()
        return "pending"

    async def _run(self, key: str, job: Callable[[], Awaitable[JobOutcome]], size: int) -> None:
        outcome: JobOutcome = "failed"
        try:
            outcome = await job()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in a background job must not surface anywhere else
            log.exception("background summary failed")
        finally:
            if self._jobs.get(key) is asyncio.current_task():
                del self._jobs[key]
            self.stats.in_flight = len(self._jobs)
        log.info("background summary: %s (%s)", outcome, key[:8])
        now = self._clock()
        if outcome in ("made", "found"):
            self._remember(self._ready, key, now + self.ttl_seconds)
        elif outcome == "elsewhere":
            # Another replica holds the lease: report it pending for as long as a job may take.
            self._remember(self._quiet, key, (now + self.wait_seconds, "pending"))
        elif outcome == "empty":
            self._remember(self._empty, key, size)
        else:
            self._remember(self._quiet, key, (now + _COOLDOWN_SECONDS, "none"))
        if outcome == "made":
            self.stats.count("made")
        elif outcome == "failed":
            self.stats.count("failed")

    async def prepared_for(
        self, probe: PreparedProbe | None, result: CompactionResult
    ) -> Lookup | None:
        """The prepared checkpoint a request continues from, if any (the flow then runs the
        pipeline again on its view): the one ``probe`` found when the pipeline asked for a
        summary; or, when the trigger fired and the strategies before summarization reached
        the target (no summary asked: a collapse, or carried user messages released), one
        prepared for this moment, which was paid for and is used rather than left to expire
        (it puts the next event further away). A job still making it here is waited for, as
        when a summary is asked: the event would otherwise store a checkpoint past the one the
        job bases its summary on, and the summary paid for would never be used."""
        if probe is None:
            return None
        if probe.looked or not result.changed:
            return probe.found
        return await probe.look()

    async def wait_for(self, key: str) -> None:
        """Wait (at most ``summarization.timeout``) for this process's job for ``key``."""
        task = self._jobs.get(key)
        if task is None:
            return
        await asyncio.wait([asyncio.ensure_future(asyncio.shield(task))], timeout=self.wait_seconds)

    @asynccontextmanager
    async def lease(self, namespace: str, key: str) -> AsyncIterator[bool]:
        """One replica prepares a conversation; the others see it pending. Without a store
        (or when it fails) every process goes ahead on its own."""
        checkpoints = self.checkpoints
        if checkpoints is None:
            yield True
            return
        name = f"prepare:{prepared_namespace(namespace)}:{key}"
        async with contextlib.AsyncExitStack() as stack:
            lock = checkpoints.store.lock(name, self.wait_seconds + 30.0, 0.0)
            try:
                acquired = await stack.enter_async_context(lock)
            except StoreUnavailable:
                acquired = True  # the store is down: no replica can coordinate, go ahead
            yield acquired

    # -- prepared checkpoints -------------------------------------------------------------------

    async def find(self, namespace: str, lookup: Lookup) -> Lookup | None:
        """The prepared checkpoint for the longest prefix of ``lookup``'s request, when it
        covers more than the ordinary checkpoint the request already continues from."""
        if self.checkpoints is None:
            return None
        found = await self.checkpoints.find_in(prepared_namespace(namespace), lookup)
        if found is None or found.covered <= lookup.covered:
            return None
        return found

    async def save(
        self,
        namespace: str,
        lookup: Lookup,
        messages: list[dict[str, Any]],
        meta: dict[str, Any],
    ) -> bool:
        """Store a prepared checkpoint for the whole of ``lookup``'s request."""
        if self.checkpoints is None or not lookup.hashes:
            return False
        made_at = self._clock()
        pns = prepared_namespace(namespace)
        error = await self.checkpoints.save(
            pns,
            lookup,
            messages,
            {**meta, PREPARED_META: made_at},
            ttl_seconds=self.ttl_seconds + _GRACE_SECONDS,
        )
        if error is not None:
            return False
        self._made[(pns, lookup.hashes[-1])] = made_at
        while len(self._made) > _MAX_TRACKED:
            self._made.popitem(last=False)
        return True

    async def consume(self, namespace: str, prepared: Lookup, key: str | None) -> None:
        """A prepared checkpoint was used: count it, and delete it (the ordinary checkpoint
        stored for this request takes over; its maker then knows it was not wasted)."""
        checkpoint = prepared.checkpoint
        made_at = checkpoint.meta.get(PREPARED_META) if checkpoint is not None else None
        age = self._clock() - made_at if isinstance(made_at, int | float) else None
        self.stats.count("used", age)
        if age is not None:
            self.stats.ages_used.append(age)
            del self.stats.ages_used[:-1000]
        if key is not None:
            self._ready.pop(key, None)
        if self.checkpoints is None or not prepared.hashes or not prepared.covered:
            return
        pns = prepared_namespace(namespace)
        stored_under = prepared.hashes[prepared.covered - 1]
        self._made.pop((pns, stored_under), None)
        # On a store failure it expires on its own (and its maker may count it wasted).
        with contextlib.suppress(StoreUnavailable):
            await self.checkpoints.store.delete(pns, stored_under)

    # -- waste ----------------------------------------------------------------------------------

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_forever(), context=contextvars.Context()
            )

    async def _sweep_forever(self) -> None:
        period = min(60.0, max(1.0, self.ttl_seconds / 4))
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep()
            except Exception:
                log.exception("sweeping prepared summaries failed")

    async def sweep(self) -> int:
        """Count as wasted the prepared checkpoints made here that outlived ``prepareTtl``
        unused (still stored), and delete them. Returns how many."""
        if self.checkpoints is None:
            return 0
        store = self.checkpoints.store
        now = self._clock()
        expired = [item for item, made in self._made.items() if now - made >= self.ttl_seconds]
        wasted = 0
        for pns, key in expired:
            self._made.pop((pns, key), None)
            try:
                if await store.delete(pns, key):
                    wasted += 1
                    self.stats.count("wasted")
            except StoreUnavailable:
                continue
        return wasted

    async def settled(self) -> None:
        """Wait for the background jobs running now to end. A session replayed without an
        agent's think time (a test, a bench) calls it between requests, so whether the next
        request finds a prepared summary does not depend on the machine's load."""
        if self._jobs:
            await asyncio.gather(*self._jobs.values(), return_exceptions=True)

    async def close(self) -> None:
        self._closed = True  # a request finishing during shutdown starts nothing new
        tasks = [*self._jobs.values(), *([self._sweeper] if self._sweeper else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs.clear()


class PreparedProbe:
    """The summarizer the pipeline sees while a prepared summary may exist.

    The first time the pipeline asks for a summary (the trigger fired and summarization is
    about to wait for the summarizer), it looks for a prepared checkpoint first. Found: it
    refuses, so the run stops costing anything, and the flow starts again from the prepared
    view. Not found: it passes the request on, exactly as without preparation.
    """

    def __init__(self, inner: Summarizer, find: Callable[[], Awaitable[Lookup | None]]) -> None:
        self._inner = inner
        self._find = find
        self._looked = False
        self.found: Lookup | None = None

    @property
    def looked(self) -> bool:
        """Whether the pipeline asked for a summary (and so the store was looked in)."""
        return self._looked

    async def look(self) -> Lookup | None:
        """The prepared checkpoint, looked for once (after a job making it here finished)."""
        if not self._looked:
            self._looked = True
            self.found = await self._find()
        return self.found

    async def summarize(self, request: SummaryRequest) -> str:
        await self.look()
        if self.found is not None:
            raise SummaryError("error", "a prepared summary is used instead")
        return await self._inner.summarize(request)
