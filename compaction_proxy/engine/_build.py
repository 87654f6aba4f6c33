"""The compaction flow built from the settings: its summarizer (when summarization is on)
and the summary flights that share one call per stretch across requests and replicas."""

from __future__ import annotations

import httpx

from compaction_proxy.checkpoints import CheckpointStore, StoredValues, make_archive_store
from compaction_proxy.compaction import ModelFacts
from compaction_proxy.config import Settings
from compaction_proxy.summarizer import HttpSummarizer, SummaryFlights
from compaction_proxy.upstream import WindowBook

from ._compactor import Compactor
from ._flow import CompactionFlow


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
        StoredValues(store) if store is not None else None,
        result_ttl_seconds=min(settings.store.ttl_seconds, 86_400),
        total_timeout_seconds=settings.summarization.timeout,
    )
    archive_store = make_archive_store(settings.store, store) if store is not None else None
    return CompactionFlow(settings, compactor, store, summarizer, flights, archive_store)
