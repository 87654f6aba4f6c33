"""The compaction flow of one chat request: checkpoint, pipeline, checkpoint again.

1. Find the longest stored checkpoint for the request's messages (one store round trip) and
   build the effective view: system block + checkpoint + the messages after it.
2. Run the pipeline on the effective view. Below the trigger nothing changes, so the request
   goes upstream with the same prefix as the last forwarded one.
3. When the pipeline compacted and nothing failed, store the result as the new checkpoint.
   A failed summary is never stored: the next request tries again (after a back-off) instead
   of living with the truncated fallback for good.

Every dependency that can fail (store, summarizer) degrades to "no checkpoint" or "next
strategy"; the request itself never fails because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import orjson

from proxy.compaction import CompactionResult, Mode, ModelFacts
from proxy.config import Settings
from proxy.engine.compactor import Compactor
from proxy.summaries.checkpoints import Checkpoints, Lookup, namespace_for
from proxy.summaries.flight import GuardedSummarizer, SummaryFlights
from proxy.summaries.prefix import ForwardedRequest
from proxy.summaries.stores.base import CheckpointStore
from proxy.summaries.summarizer import HttpSummarizer, SummaryCalls
from proxy.windows import WindowBook

log = logging.getLogger("compaction_proxy.flow")


@dataclass(slots=True)
class FlowResult:
    """What to forward and what to tell the client about it.

    `save` stores the new checkpoint; the caller runs it only once the upstream accepted the
    compacted request (a 2xx), so a compaction the upstream refused never becomes sticky.
    """

    body: bytes | None  # None: forward the client's original bytes
    result: CompactionResult
    checkpoint: str  # "hit" | "new" (stored once the upstream accepts it) | "none"
    warnings: list[str] = field(default_factory=list)
    save: Callable[[], Awaitable[str | None]] | None = None


class CompactionFlow:
    def __init__(
        self,
        settings: Settings,
        compactor: Compactor,
        store: CheckpointStore | None,
        summarizer: HttpSummarizer | None,
        flights: SummaryFlights,
    ) -> None:
        self.settings = settings
        self.compactor = compactor
        self.store = store
        self.checkpoints = (
            Checkpoints(store, settings.store.ttl_seconds) if store is not None else None
        )
        self.summarizer = summarizer
        self.flights = flights

    def namespace(
        self, model: str, credential: str | None, context_window: int | None = None
    ) -> str:
        summarizer = self.summarizer
        return namespace_for(
            credential=credential,
            summarizer_model=summarizer.model_for(model) if summarizer else "-",
            prompt_version=summarizer.prompt_version if summarizer else "-",
            fingerprint=self.compactor.fingerprint(model, context_window),
        )

    async def run(
        self,
        data: dict[str, Any],
        mode: Mode,
        *,
        size_hint: int,
        credential: str | None,
        authorization: str | None,
        upstream_name: str,
        persist: bool = True,
        context_window: int | None = None,
        calls: SummaryCalls | None = None,
    ) -> FlowResult:
        """`credential` names the tenant (hashed into the namespace); `authorization` is what
        the summarizer may send upstream (None when the client authenticated to the proxy).
        `context_window`: the window to budget for, when not the catalog's (proxy/windows.py);
        it is part of the checkpoint namespace. `calls`: the request's log of summarizer HTTP
        calls (the request's telemetry counts them when it ends); None: counted as they happen.
        """
        model: str = data["model"]
        namespace = self.namespace(model, credential, context_window)
        lookup = await self._lookup(namespace, data["messages"])
        warnings = [lookup.store_error] if lookup.store_error else []
        effective = {**data, "messages": lookup.messages} if lookup.hit else data
        summarizer = self._summarizer_for(
            model, namespace, authorization, upstream_name, calls, effective
        )
        result = await self.compactor.run(
            effective,
            mode,
            size_hint=size_hint,
            summarizer=summarizer,
            context_window=context_window,
        )
        if summarizer is not None and any(
            failure.reason == "not_shorter" for failure in result.report.failures
        ):
            summarizer.reject()
        if mode is Mode.DRY_RUN:
            return FlowResult(None, result, "hit" if lookup.hit else "none", warnings)
        if result.changed:
            body = orjson.dumps({**data, "messages": result.messages})
            checkpoints = self.checkpoints
            # Nothing is stored for a preview or a forced run, after a failed summary, or when
            # the store just failed the lookup (it would fail the write too).
            if not persist or result.report.failures or checkpoints is None or lookup.store_error:
                return FlowResult(body, result, "none", warnings)

            async def save() -> str | None:
                assert checkpoints is not None
                # The core hands back the client's own dicts (typed as read-only mappings).
                messages = cast("list[dict[str, Any]]", result.messages)
                return await checkpoints.save(namespace, lookup, messages, _meta(result, model))

            return FlowResult(body, result, "new", warnings, save)
        if lookup.hit:
            return FlowResult(orjson.dumps(effective), result, "hit", warnings)
        return FlowResult(None, result, "none", warnings)

    async def _lookup(self, namespace: str, messages: list[dict[str, Any]]) -> Lookup:
        if self.checkpoints is None:
            return Lookup(messages, 0, [], 0, None)
        return await self.checkpoints.lookup(namespace, messages)

    def _summarizer_for(
        self,
        model: str,
        namespace: str,
        authorization: str | None,
        upstream_name: str,
        calls: SummaryCalls | None,
        body: dict[str, Any],
    ) -> GuardedSummarizer | None:
        if self.summarizer is None:
            return None
        target = self.summarizer.upstream_for(model)
        # The caller's key was meant for the upstream its request goes to; a summarizer on
        # another provider must use that provider's own key (an upstream `api_key`).
        if target.name != upstream_name:
            authorization = None
        # The request as it goes upstream (the checkpoint view on a hit): a summary call built
        # on its prefix is served from the upstream's prompt cache (proxy/summaries/prefix.py).
        bound = self.summarizer.bind(
            authorization=authorization,
            calls=calls,
            request=ForwardedRequest.from_body(body, upstream_name),
        )
        return self.flights.bind(bound, namespace)


def _meta(result: CompactionResult, model: str) -> dict[str, Any]:
    report = result.report
    return {
        "model": model,
        "strategies": list(report.changed_by),
        "tokens_before": report.tokens_before,
        "tokens_after": report.tokens_after,
    }


def build_flow(
    settings: Settings,
    compactor: Compactor,
    store: CheckpointStore | None,
    client: httpx.AsyncClient,
    windows: WindowBook | None = None,
) -> CompactionFlow:
    summarizer = None
    if settings.summarization.enabled:
        catalog = compactor.catalog

        def facts_for(model: str) -> ModelFacts:
            # A window learned or published for the summarizer's model beats the catalog's
            # guess: the summarizer cuts its transcript to fit it.
            known = windows.known(model) if windows is not None else None
            return compactor.facts_for(model, known)

        summarizer = HttpSummarizer.from_settings(
            settings,
            client,
            facts_for=facts_for,
            timeout=settings.summarization.timeout,
            tokenizer_for=lambda model: compactor.tokenizers.get(catalog.facts_for(model).encoding),
        )
    flights = SummaryFlights(
        store,
        result_ttl_seconds=min(settings.store.ttl_seconds, 86_400),
        total_timeout_seconds=settings.summarization.timeout,
    )
    return CompactionFlow(settings, compactor, store, summarizer, flights)
