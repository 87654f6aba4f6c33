"""The compaction flow built from the settings: its summarizer (when summarization is on)
and the summary flights that share one call per stretch across requests and replicas."""

from __future__ import annotations

from compaction_proxy.checkpoints import CheckpointStore, StoredValues, make_archive_store
from compaction_proxy.compaction import ModelFacts
from compaction_proxy.config import Settings
from compaction_proxy.summarizer import HttpSummarizer, SummaryFlights, SummarySizing
from compaction_proxy.upstream import UpstreamTransport, WindowBook

from ._compactor import Compactor
from ._flow import CompactionFlow


def build_flow(
    settings: Settings,
    compactor: Compactor,
    store: CheckpointStore | None,
    transport: UpstreamTransport,
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

        async def learn(upstream: str, model: str, tokens: int) -> None:
            if windows is not None:
                await windows.learn(upstream, model, tokens)

        # Summary calls are counted as the requests' triggers count: our count times the
        # calibration measured from the model's usage; a refusal teaches both, as a request's
        # does (compaction_proxy/summarizer/_sizing.py).
        sizing = SummarySizing(
            ratio=lambda model: compactor.calibration_for(model).effective,
            calibrate=compactor.calibrate,
            learn=learn,
        )
        summarizer = HttpSummarizer.from_settings(
            settings,
            transport,
            facts_for=facts_for,
            timeout=settings.summarization.timeout,
            tokenizer_for=lambda model: compactor.tokenizers.get(catalog.facts_for(model).encoding),
            sizing=sizing,
        )
    flights = SummaryFlights(
        StoredValues(store) if store is not None else None,
        result_ttl_seconds=min(settings.store.ttl_seconds, 86_400),
        total_timeout_seconds=settings.summarization.timeout,
    )
    archive_store = make_archive_store(settings.store, store) if store is not None else None
    return CompactionFlow(settings, compactor, store, summarizer, flights, archive_store)
