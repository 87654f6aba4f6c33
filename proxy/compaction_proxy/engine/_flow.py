"""The compaction flow of one chat request: checkpoint, pipeline, checkpoint again.

1. Find the longest stored checkpoint for the request's messages (one store round trip) and
   build the effective view: system block + checkpoint + the messages after it.
2. Run the pipeline on the effective view. Below the trigger nothing changes, so the request
   goes upstream with the same prefix as the last forwarded one.
3. When the pipeline compacted and nothing failed, store the result as the new checkpoint.
   A failed summary is never stored: the next request tries again (after a back-off) instead
   of living with the truncated fallback for good.

Every dependency that can fail (store, summarizer) degrades to "no checkpoint" or "next
strategy"; the request itself never fails because of them, and each is a degraded path
(compaction_proxy/engine/_degraded.py). A checkpoint the store refuses is held in process
(compaction_proxy/checkpoints/_held.py): the summary in it is not paid for twice.

The namespace of every key the flow uses (checkpoints, prepared summaries, summaries in
flight) holds the request's scope (compaction_proxy/checkpoints/_keys.py: system block,
tools, per-user fields), and a summarizer paid with an operator's key runs only for a caller
let in (compaction_proxy/http/_admission.py); otherwise the pipeline runs without it, says why, and
stores nothing a summary would have made.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, cast

from compaction_proxy.checkpoints import (
    Archive,
    Checkpoints,
    CheckpointStore,
    Lookup,
    archive_namespace,
    leading_system_count,
    namespace_for,
    scope_of,
)
from compaction_proxy.compaction import (
    CompactionResult,
    Mode,
    RecallIds,
    Summarizer,
    firing_point,
)
from compaction_proxy.compaction.archive import Archived
from compaction_proxy.config import Settings
from compaction_proxy.http import Spending
from compaction_proxy.summarizer import (
    ForwardedRequest,
    GuardedSummarizer,
    HttpSummarizer,
    SummaryCalls,
    SummaryFlights,
)

from ._compactor import Compactor, RunExtras, RunWindow
from ._degraded import DegradedPaths
from ._flow_values import FlowRequest, FlowResult
from ._hit_report import as_prepared, as_sent, saved_meta
from ._known import Known, TokenLedger
from ._prepare import (
    JobOutcome,
    PreparedProbe,
    Preparer,
    PrepareState,
    conversation_key,
)
from ._recallable import ConversationArchive, Index

log = logging.getLogger("compaction_proxy.flow")


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the lookup decided for one request: the run's state, replaced (never mutated)
    when a prepared checkpoint takes over."""

    request: FlowRequest
    mode: Mode  # `dry-run-local` read as a dry run
    offline: bool  # the summarizer is kept out
    namespace: str
    lookup: Lookup
    store_error: str | None  # the first lookup's (a warning even when a prepared one is used)
    effective: dict[str, Any]  # the body the pipeline runs on
    withheld: Spending | None
    summarizer: GuardedSummarizer | None
    key: str | None  # the conversation's, when summaries may be prepared for it
    probe: PreparedProbe | None
    ledger: TokenLedger | None = None  # counts known from the previous request (_known.py)
    archive_namespace: str = ""  # the end user's (compaction_proxy/checkpoints/_archive.py)
    recall: RecallIds | None = None  # the ids what the run removes is archived under
    recall_problem: str | None = None  # recall is on, but its key could not be read


class CompactionFlow:
    def __init__(
        self,
        settings: Settings,
        compactor: Compactor,
        store: CheckpointStore | None,
        summarizer: HttpSummarizer | None,
        flights: SummaryFlights,
        archive_store: CheckpointStore | None = None,
    ) -> None:
        """``archive_store``: where the recall archive keeps its rows (default: ``store``;
        the memory backend's own, compaction_proxy/checkpoints/_factory.py)."""
        self.settings = settings
        self.compactor = compactor
        self.store = store
        self.checkpoints = (
            Checkpoints(store, settings.store.ttl_seconds) if store is not None else None
        )
        self.summarizer = summarizer
        self.flights = flights
        # The store, the summarizer and recall as degraded paths: one log line when each
        # starts failing and one when it recovers, counted between (the metrics read them).
        self.degraded = DegradedPaths()
        recall = settings.compaction.recall
        self.archive = ConversationArchive(
            Archive(archive_store or store, recall, health=self.degraded.recall)
            if store is not None
            else None,
            lambda model: compactor.settings_for(model)[0],
            settings.store.request_budget,
        )
        self.preparer = Preparer(settings.summarization, self.checkpoints)
        # Requests whose summary was withheld, by reason (compaction_proxy/http/_admission.py):
        # `compaction_proxy_summaries_withheld_total`.
        self.withheld: Counter[str] = Counter()

    def namespace(
        self,
        model: str,
        credential: str | None,
        context_window: int | None = None,
        *,
        scope: str = "",
        edits: str = "",
    ) -> str:
        """The key space of a request's checkpoints; `scope`: :func:`scope_of` its body;
        `edits`: the key of the context edits the proxy applies for it (``ContextEdits.key``),
        which shape its checkpoints as the configuration does."""
        summarizer = self.summarizer
        fingerprint = self.compactor.fingerprint(model, context_window)
        return namespace_for(
            credential=credential,
            summarizer_model=summarizer.model_for(model) if summarizer else "-",
            prompt_version=summarizer.prompt_version if summarizer else "-",
            fingerprint=f"{fingerprint}+{edits}" if edits else fingerprint,
            scope=scope,
        )

    def withholds(self, model: str, spend: Spending) -> Spending | None:
        """`spend` when it keeps the summarizer away from `model`'s requests: the summarizer's
        upstream has an `api_key` (the operator's), and the caller was not let in. A summarizer
        that sends the caller's own key needs nobody's leave."""
        if spend.allowed or self.summarizer is None:
            return None
        return spend if self.summarizer.upstream_for(model).api_key is not None else None

    async def run(self, request: FlowRequest) -> FlowResult:
        """One request's compaction: lookup, compact, use a prepared checkpoint, decide what
        to save. See :class:`FlowRequest` for what the request carries."""
        plan = await self._plan(request)
        result = await self._compact(plan, plan.probe or plan.summarizer)
        if request.known is not None:
            request.known.settle(plan.namespace, plan.lookup, plan.ledger)
        prepared: PrepareState = "none" if plan.key is None else self.preparer.state(plan.key)
        used = await self.preparer.prepared_for(plan.probe, result)
        if used is not None:
            # The trigger fired and a summary was made ahead of time: continue from it (the
            # first run stopped at the summarizer and is discarded).
            plan = self._continue_from(plan, used)
            result = await self._compact(plan, plan.summarizer)
        result, prepared = await self._settle(plan, result, used, prepared)
        return self._decide(plan, result, used, prepared)

    async def _plan(self, request: FlowRequest) -> _Plan:
        """The lookup: the checkpoint, the effective view, and the summarizer it may use."""
        data, mode = request.data, request.mode
        model: str = data["model"]
        # Kept off the summarizer (`dry-run-local`, `summarization.dryRun: skip` for dry runs,
        # or the caller's `summarize=False`): summarization reports itself skipped, nothing is
        # stored, and `dry-run-local` is an ordinary dry run otherwise.
        offline = (
            not request.summarize
            or mode is Mode.DRY_RUN_LOCAL
            or (mode is Mode.DRY_RUN and self.settings.summarization.dry_run == "skip")
        )
        if mode is Mode.DRY_RUN_LOCAL:
            mode = Mode.DRY_RUN
        scope = scope_of(data, request.tenant)
        namespace = self.namespace(
            model,
            request.credential,
            request.context_window,
            scope=scope,
            edits=request.edits.key if request.edits is not None else "",
        )
        # The end user's archive and the keyed ids compaction names what it removes with
        # (docs/recall.md): every field that separates checkpoints separates archives.
        archived_in = ""
        recall, recall_problem = None, None
        if self.archive.enabled(model):
            archived_in = archive_namespace(request.credential, request.tenant, data)
            recall, recall_problem = await self.archive.ids(model, archived_in)
        known = request.known
        lookup = await self._lookup(namespace, data["messages"], known)
        effective = {**data, "messages": lookup.messages} if lookup.hit else data
        withheld = None if offline else self.withholds(model, request.spend)
        summarizer = None
        if not offline and withheld is None:
            summarizer = self._summarizer_for(request, namespace, request.calls, effective)
        # Background summaries (compaction_proxy/engine/_prepare.py): only for ordinary requests.
        key = None
        if (
            self.preparer.enabled
            and summarizer is not None
            and mode is Mode.NORMAL
            and request.persist
            and recall_problem is None
        ):
            key = conversation_key(lookup)
        probe = None
        if key is not None and summarizer is not None:
            probe = PreparedProbe(summarizer, partial(self._find_prepared, namespace, lookup, key))
        return _Plan(
            request,
            mode,
            offline,
            namespace,
            lookup,
            lookup.store_error,
            effective,
            withheld,
            summarizer,
            key,
            probe,
            known.ledger(lookup) if known is not None else None,
            archived_in,
            recall,
            recall_problem,
        )

    async def _compact(self, plan: _Plan, summarizer: Summarizer | None) -> CompactionResult:
        request = plan.request
        return await self.compactor.run(
            plan.effective,
            plan.mode,
            size_hint=request.size_hint,
            summarizer=summarizer,
            window=RunWindow(request.context_window, request.window_source),
            extras=_extras_of(request, plan.ledger, plan.recall),
        )

    def _continue_from(self, plan: _Plan, used: Lookup) -> _Plan:
        """The plan on a prepared checkpoint's view, with a summarizer bound to it."""
        effective = {**plan.request.data, "messages": used.messages}
        summarizer = self._summarizer_for(
            plan.request, plan.namespace, plan.request.calls, effective
        )
        return replace(plan, lookup=used, effective=effective, summarizer=summarizer, ledger=None)

    async def _settle(
        self, plan: _Plan, result: CompactionResult, used: Lookup | None, prepared: PrepareState
    ) -> tuple[CompactionResult, PrepareState]:
        """The result in the client's terms, and the background summary it may start."""
        summarizer = plan.summarizer
        if summarizer is not None and _not_shorter(result):
            summarizer.reject()
        view_tokens = result.report.tokens_before  # the view's own count, before as_sent
        # On a hit, report what the client sent, not the view
        # (compaction_proxy/engine/_hit_report.py).
        data = plan.request.data
        result = await as_sent(result, data["messages"], plan.lookup, self.compactor)
        key = plan.key
        if used is not None:  # the prepared view is this event's result
            return replace(result, changed=True, report=as_prepared(result.report, used)), "ready"
        if key is not None and self.preparer.wants(result):
            job = self._prepare_job(plan, result, view_tokens)
            prepared = self.preparer.start(key, job, len(data["messages"]))
        return result, prepared

    def _decide(
        self,
        plan: _Plan,
        result: CompactionResult,
        used: Lookup | None,
        prepared: PrepareState,
    ) -> FlowResult:
        """What to forward, what to say about it, and whether to save a checkpoint."""
        lookup, data = plan.lookup, plan.request.data
        warnings = [plan.store_error] if plan.store_error else []
        self.degraded.note_lookup(plan.store_error, plan.lookup.asked)
        self.degraded.note_summaries(result.report)
        if plan.recall_problem is not None and result.changed:
            warnings.append(plan.recall_problem)
        fired = _summarization_fired(result)
        if plan.offline and self.summarizer is not None and fired:
            warnings.append(OFFLINE_NOTE)
        # What the fallback made instead of a withheld summary is not kept: the caller's next
        # request, once let in, summarizes that stretch (as after a failed summary).
        withheld = plan.withheld
        unsummarized = withheld is not None and fired
        if withheld is not None and fired:
            warnings.append(withheld.note)
            self.withheld[withheld.reason] += 1
        if plan.mode is Mode.DRY_RUN:
            return FlowResult(None, result, "hit" if lookup.hit else "none", warnings)
        index = self._index(plan, result)
        request = plan.request
        recall = self.archive.recallable(plan.archive_namespace, index)
        out = partial(
            FlowResult, result=result, warnings=warnings, prepared=prepared, recall=recall
        )
        if not result.changed:
            if lookup.hit:
                return out(lookup.messages, checkpoint="hit", request=data)
            return FlowResult(None, result, "none", warnings, prepared=prepared)
        # Nothing is stored for a preview or a forced run, after a failed summary, or when
        # recall is on but its key could not be read (a checkpoint without marks would keep
        # what this run removed out of the archive for good). When the store just failed the
        # lookup the write fails too (at once: it is marked down), and the checkpoint is held
        # in this process: what it holds was paid for.
        if (
            not request.persist
            or plan.offline
            or unsummarized
            or result.report.failures
            or self.checkpoints is None
            or plan.recall_problem is not None
        ):
            # The originals are kept all the same (not for a preview, nor when the store just
            # failed): the placeholders forwarded name them whether or not a checkpoint does.
            keep = None
            if request.persist and not lookup.store_error and result.archived:
                keep = partial(self._keep, plan, result.archived)
            return out(result.messages, checkpoint="none", save=keep, request=data)
        save = partial(self._save, self.checkpoints, plan, result, used, index)
        return out(result.messages, checkpoint="new", save=save, request=data)

    def _index(self, plan: _Plan, result: CompactionResult) -> Index | None:
        model: str = plan.request.data["model"]
        checkpoint = plan.lookup.checkpoint
        return self.archive.index(model, checkpoint, result.archived)

    async def _keep(self, plan: _Plan, archived: Archived) -> str | None:
        return await self.archive.keep(plan.archive_namespace, archived, plan.lookup.checkpoint)

    async def _save(
        self,
        checkpoints: Checkpoints,
        plan: _Plan,
        result: CompactionResult,
        used: Lookup | None,
        index: Index | None,
    ) -> str | None:
        """The new checkpoint, stored once the upstream accepted the request, then the originals
        it archived (on a store budget of their own): the checkpoint keeps the prefix stable
        whatever the archive's writes cost; both are written before the reply starts."""
        # The core hands back the client's own dicts (typed as read-only mappings).
        messages = cast("list[dict[str, Any]]", result.messages)
        model: str = plan.request.data["model"]
        meta = saved_meta(result, model, index)
        error = await checkpoints.save(plan.namespace, plan.lookup, messages, meta)
        if error is None:
            self.degraded.store_writes.recovered()
        else:
            self.degraded.store_writes.failed(error)
        if used is not None and error is None:
            # The ordinary checkpoint now stands for it; kept when that was not stored.
            await self.preparer.consume(plan.namespace, used, plan.key)
        kept = await self._keep(plan, result.archived) if result.archived else None
        if kept is not None:
            return kept if error is None else f"{error}; {kept}"
        return error

    async def _find_prepared(self, namespace: str, lookup: Lookup, key: str) -> Lookup | None:
        """A prepared checkpoint for this request, once a job making one here has finished."""
        await self.preparer.wait_for(key)
        return await self.preparer.find(namespace, lookup)

    def _prepare_job(
        self, plan: _Plan, seen: CompactionResult, view_tokens: int
    ) -> Callable[[], Awaitable[JobOutcome]]:
        """The background job for a request past the prepare threshold: the pipeline on its
        view, as if the growth up to the trigger were already there, stored as prepared."""
        preparer = self.preparer
        key = plan.key
        assert key is not None

        async def job() -> JobOutcome:
            if seen.metrics is None:
                return "empty"
            if await preparer.find(plan.namespace, plan.lookup) is not None:
                return "found"
            async with preparer.lease(plan.namespace, key) as acquired:
                if not acquired:
                    return "elsewhere"
                if await preparer.find(plan.namespace, plan.lookup) is not None:
                    return "found"  # made by another replica while we waited for the lease
                return await self._prepare(plan, seen, view_tokens)

        return job

    async def _prepare(self, plan: _Plan, seen: CompactionResult, view_tokens: int) -> JobOutcome:
        """The prepared checkpoint made and stored (the job's work, under its lease)."""
        request = plan.request
        model: str = request.data["model"]
        assert seen.metrics is not None
        # The calibration may have moved since the request (its reply was read): the
        # distance to the trigger is measured with the one this run will use.
        now = replace(seen.metrics, tokens=self.compactor.calibration_for(model).apply(view_tokens))
        point = firing_point(self.compactor.settings_for(model)[1], now)
        if point is None:
            return "empty"  # growth alone would never fire anything
        summarizer = self._summarizer_for(request, plan.namespace, None, plan.effective)
        made = await self.compactor.run(
            plan.effective,
            Mode.NORMAL,
            size_hint=request.size_hint,
            summarizer=summarizer,
            window=RunWindow(request.context_window, anticipate=point - now.tokens),
            extras=_extras_of(request, None, plan.recall),
        )
        self.degraded.note_summaries(made.report)
        if made.report.failures:
            for failure in made.report.failures:
                log.info(
                    "background summary: %s failed (%s): %s",
                    failure.strategy,
                    failure.reason,
                    failure.message,
                )
            if summarizer is not None and _not_shorter(made):
                summarizer.reject()
            return "failed"
        if not made.changed:
            log.info("background summary: nothing to fold (%s)", made.report.changed_by)
            return "empty"
        made = await as_sent(made, request.data["messages"], plan.lookup, self.compactor)
        messages = cast("list[dict[str, Any]]", made.messages)
        index = self._index(plan, made)
        if made.archived and index is not None:
            kept = await self._keep(plan, made.archived)
            if kept is not None:
                log.info("background summary: %s", kept)
        meta = saved_meta(made, model, index)
        saved = await self.preparer.save(plan.namespace, plan.lookup, messages, meta)
        return "made" if saved else "failed"

    async def _lookup(
        self, namespace: str, messages: list[dict[str, Any]], known: Known | None
    ) -> Lookup:
        if self.checkpoints is None:
            return Lookup(messages, 0, [], 0, None)
        chained = known.chained(namespace, leading_system_count(messages)) if known else ()
        return await self.checkpoints.lookup(namespace, messages, chained=chained)

    def _summarizer_for(
        self,
        request: FlowRequest,
        namespace: str,
        calls: SummaryCalls | None,
        body: dict[str, Any],
    ) -> GuardedSummarizer | None:
        if self.summarizer is None:
            return None
        model: str = request.data["model"]
        upstream_name = request.upstream_name
        target = self.summarizer.upstream_for(model)
        # The caller's key was meant for the upstream its request goes to; a summarizer on
        # another provider must use that provider's own key (an upstream `api_key`).
        caller_key = request.caller_key if target.name == upstream_name else None
        # The request as it goes upstream (the checkpoint view on a hit): a summary call built
        # on its prefix is served from the upstream's prompt cache
        # (compaction_proxy/summarizer/_prefix.py). A format whose view is not chat completions
        # (`prefix_summaries` False) gets the transcript form, unless its call writes the prefix
        # in its own form from the client's own request (`native`).
        wire = request.wire
        native = request.native
        forwarded = (
            ForwardedRequest.from_body(body, upstream_name, native)
            if wire.prefix_summaries or native is not None
            else None
        )
        bound = self.summarizer.bind(
            caller_key=caller_key,
            calls=calls,
            request=forwarded,
            wire=wire,
            upstream=upstream_name,
        )
        return self.flights.bind(bound, namespace)


OFFLINE_NOTE = (
    "summarizer not called (dry-run-local, summarization.dryRun: skip or a local preview): "
    "summarization was skipped and later strategies stood in for it"
)


def _extras_of(
    request: FlowRequest, ledger: TokenLedger | None, recall: RecallIds | None
) -> RunExtras:
    """What :meth:`Compactor.run` takes of ``request`` besides its body: its context edits
    (none: none), the token ledger and the recall ids."""
    edits = request.edits
    if edits is None:
        return RunExtras(ledger=ledger, recall=recall)
    return RunExtras(tuple(edits.strategies), edits.key, ledger, recall)


def _not_shorter(result: CompactionResult) -> bool:
    """A summary came back no shorter than what it replaced: the summarizer backs off."""
    return any(failure.reason == "not_shorter" for failure in result.report.failures)


def _summarization_fired(result: CompactionResult) -> bool:
    return any(step.name == "summarization" and step.fired for step in result.report.walk())
