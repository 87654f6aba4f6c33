"""The edge's handle on the compaction core: built once per process from the settings.

It owns what the pure core must not: the tokenizer provider (encodings loaded at start-up),
the model catalog, one pipeline per configured model pattern, the compaction thread and parse
worker that keep large bodies off the event loop (compaction_proxy/engine/_offload.py), and
debug logging of decisions.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from compaction_proxy.compaction import (
    Calibration,
    CompactionReport,
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    EncodingLoader,
    ImagePricing,
    Mode,
    ModelCatalog,
    ModelFacts,
    Pipeline,
    RecallIds,
    Summarizer,
    TokenizerProvider,
    build_pipeline,
    build_view,
    compact,
    compact_async,
    compute_budget,
)
from compaction_proxy.compaction.pipeline import request_budget, unchanged_result
from compaction_proxy.compaction.prompt_bound import prompt_bound
from compaction_proxy.compaction.strategies.base import Strategy
from compaction_proxy.compaction.tokens import EnvelopeTokenizer
from compaction_proxy.config import Settings
from compaction_proxy.http import DECISIONS, debug_enabled
from compaction_proxy.wire.recall import RECALL

from ._calibration import CalibrationBook
from ._known import ConversationMemory, TokenLedger
from ._offload import OFFLOAD_BYTES, Offload, on_main_loop
from ._quiet import QuietLimits

log = DECISIONS  # the per-request decision log, on with COMPACTION_DEBUG

# Requests smaller than this are compacted inline: a thread hop costs more than counting them.
_INLINE_BYTES = OFFLOAD_BYTES
# Up to this size and this many messages the quiet check (nothing can fire: cached counts,
# one serialization pass, a few milliseconds at most) runs inline even so.
_QUIET_INLINE_BYTES = 4 << 20
_QUIET_INLINE_MESSAGES = 2_000
_BUILTIN_ENCODINGS = ("o200k_base", "cl100k_base")


# Summarization settings that change when or how a summary is made, not what it says: a
# changed value must not orphan every stored checkpoint.
_NOT_SHAPING = {"timeout", "dry_run", "prepare", "prepare_ttl", "prepare_max_in_flight"}
# Compaction settings that change only the forwarded output limit, never the messages.
RECALL_AS_CHAT = {
    "type": "function",
    "function": {
        "name": RECALL.name,
        "description": RECALL.description,
        "parameters": dict(RECALL.parameters),
    },
}
"""The recall tool in chat form, as the budget counts it (each format writes it its own way;
the count differs by a few tokens at most)."""
_NOT_SHAPING_COMPACTION: dict[str, Any] = {
    "lower_output_limit": True,
    # Only whether recall is on shapes a checkpoint (its placeholders name recall ids).
    "recall": {"max_rounds", "max_tokens", "ttl", "max_archive_mb", "time_budget"},
}


class Compactor:
    """Runs the configured pipeline for a request's model."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        tokenizer_settings = settings.compaction.tokenizer
        directories = [tokenizer_settings.encodings_dir] if tokenizer_settings.encodings_dir else []
        images = tokenizer_settings.images
        self.tokenizers = TokenizerProvider(
            EncodingLoader(directories=directories),
            cache_size=tokenizer_settings.cache_size,
            image_pricing=ImagePricing(
                base_tokens=images.base_tokens,
                tile_tokens=images.tile_tokens,
                unknown_size_tokens=images.unknown_size_tokens,
            ),
        )
        self.catalog = ModelCatalog(
            {pattern: m.facts_override() for pattern, m in settings.models.items()},
            default_context_window=settings.default_context_window,
            default_encoding=tokenizer_settings.default_encoding,
        )
        self._default_pipeline = build_pipeline(settings.compaction, settings.summarization)
        # Per-model `compaction` blocks, built eagerly so a bad one fails at start-up.
        self._model_pipelines: list[tuple[str, CompactionSettings, Pipeline]] = [
            (pattern, m.compaction, build_pipeline(m.compaction, settings.summarization))
            for pattern, m in settings.models.items()
            if m.compaction is not None
        ]
        self._pipeline_cache: dict[str, tuple[CompactionSettings, Pipeline]] = {}
        self._fingerprints: dict[tuple[str, int | None], str] = {}
        self._calibration = CalibrationBook()
        self._quiet = QuietLimits(settings.summarization.prepare)
        self.offload = Offload()
        # Each conversation's previous request (compaction_proxy/engine/_known.py).
        self.memory = ConversationMemory(settings.server.conversation_memory_mb << 20, self.offload)
        self.debug = debug_enabled()

    def warm_up(self) -> threading.Thread | None:
        """Load the builtin and every configured encoding now, so the first request does not
        pay ~0.5 s for it and `/readyz` reports a missing one before traffic arrives.

        The builtin encodings ship with the install (compaction_proxy/compaction/encodings.py).
        Other encodings not found on disk are fetched by tiktoken on a daemon thread (when
        `compaction.tokenizer.download` allows): requests never wait for the network, they
        count with the estimator until the files arrive. Returns that thread, if any.
        """
        configured = {m.encoding for m in self.settings.models.values() if m.encoding}
        default = self.settings.compaction.tokenizer.default_encoding
        self.tokenizers.prepare(sorted({*_BUILTIN_ENCODINGS, default, *configured}))
        missing = sorted(self.tokenizers.missing_encodings)
        if not missing or not self.settings.compaction.tokenizer.download:
            return None
        thread = threading.Thread(
            target=self._download, args=(missing,), name="tiktoken-download", daemon=True
        )
        thread.start()
        return thread

    def _download(self, encodings: list[str]) -> None:
        import tiktoken

        for name in encodings:
            try:
                tiktoken.get_encoding(name)  # fetches into tiktoken's cache directory
            except Exception as exc:  # no network, a proxy in the way: keep estimating
                log.warning("could not download tiktoken encoding %r: %s", name, exc)
                continue
            self.tokenizers.refresh(name)

    def close(self) -> None:
        self.offload.close()

    def settings_for(self, model: str) -> tuple[CompactionSettings, Pipeline]:
        hit = self._pipeline_cache.get(model)
        if hit is not None:
            return hit
        chosen = (self.settings.compaction, self._default_pipeline)
        for pattern, compaction, pipeline in self._model_pipelines:
            if model == pattern or fnmatch.fnmatchcase(model, pattern):
                chosen = (compaction, pipeline)
                break
        if len(self._pipeline_cache) < 4096:
            self._pipeline_cache[model] = chosen
        return chosen

    def enabled_for(self, model: str) -> bool:
        return self.settings_for(model)[0].enabled

    async def run(
        self,
        body: Mapping[str, Any],
        mode: Mode,
        *,
        size_hint: int,
        summarizer: Summarizer | None = None,
        window: RunWindow | None = None,
        extras: RunExtras | None = None,
    ) -> CompactionResult:
        """Compact a validated chat body.

        A body of ``size_hint`` bytes from :data:`_INLINE_BYTES` up is compacted on the
        compaction thread (compaction_proxy/engine/_offload.py), its summarizer calls sent back
        to this loop: counting, grouping and every strategy stay off the event loop. Only the
        quiet check of a request of at most :data:`_QUIET_INLINE_MESSAGES` messages stays
        here: it is what most agent requests need, and cheaper than the hop.

        `window`: the window to budget for when the edge knows better than the catalog
        (:class:`RunWindow`); `extras`: what the request brings besides its body
        (:class:`RunExtras`).
        """
        window = window or NO_WINDOW
        extra = extras or NO_EXTRAS
        ledger = extra.ledger
        if size_hint < _INLINE_BYTES:
            return await self._run(body, mode, summarizer, window, extra)
        quiet_checked = False
        if (
            size_hint < _QUIET_INLINE_BYTES
            and len(body["messages"]) <= _QUIET_INLINE_MESSAGES
            and mode is Mode.NORMAL
            and not self.debug
        ):
            # Most requests of an agent session fire nothing: their quiet check (cached
            # counts) costs less than the hop to the thread, and stays here.
            quiet, _ = self._quiet_result(
                self._request(body, mode, window, extra),
                extra.key,
                ledger,
            )
            if quiet is not None:
                return quiet
            quiet_checked = True
        if self.debug:
            log.debug(
                "compacting %d messages (%d bytes) on the compaction thread",
                len(body["messages"]),
                size_hint,
            )
        here = on_main_loop(summarizer, asyncio.get_running_loop())
        return await self.offload.run(
            self._run(body, mode, here, window, extra, quiet_checked=quiet_checked)
        )

    async def _run(
        self,
        body: Mapping[str, Any],
        mode: Mode,
        summarizer: Summarizer | None,
        window: RunWindow,
        extras: RunExtras,
        *,
        quiet_checked: bool = False,
    ) -> CompactionResult:
        request = self._request(body, mode, window, extras)
        # (The debug log wants the view's groups: no quiet path then.)
        if mode is Mode.NORMAL and not self.debug and not quiet_checked:
            quiet, request = self._quiet_result(request, extras.key, extras.ledger)
            if quiet is not None:
                return quiet
        result = await compact_async(request, summarizer=summarizer)
        if self.debug:
            self._debug_log(body, result.report)
        return result

    def _quiet_result(
        self,
        request: CompactionRequest,
        edits_key: str = "",
        ledger: TokenLedger | None = None,
    ) -> tuple[CompactionResult | None, CompactionRequest]:
        """The full path's result, without the view, for a request below every trigger.

        In an agent session every message but the newest step has been counted before, so
        `prompt_bound` gives the exact count for the price of one serialization pass and
        that step's tokenization; the view, the draft and the triggers would only confirm
        that nothing fires (compaction_proxy/engine/_quiet.py says when that is sure). The report is
        the one the full path writes for such a request; `metrics` is left out (the view's groups
        and turns are not known), which `Preparer.wants` reads as "not past the prepare
        threshold": the limit is kept under that threshold.

        Returns the result, or ``None`` for the full path, and the request with its facts and
        tokenizer resolved (asked of the provider once: it counts estimated requests).
        """
        facts = request.facts
        assert isinstance(facts, ModelFacts | ModelCatalog)
        model_facts = facts if isinstance(facts, ModelFacts) else facts.facts_for(request.model)
        tokenizer = self.tokenizers.get(model_facts.encoding)
        source = request.window_source
        if source is None and isinstance(facts, ModelCatalog):
            source = facts.window_source(request.model)  # said before the facts are resolved
        request = replace(request, facts=model_facts, tokenizer=tokenizer, window_source=source)
        if not isinstance(tokenizer, EnvelopeTokenizer):
            return None, request
        budget = request_budget(request, model_facts)
        limit = self._quiet.limit(request.pipeline, budget.limit)
        if limit is not None and request.edits:
            # The request's own strategies fire by their own triggers, below the pipeline's.
            own = self._quiet.edits_limit(edits_key, request.edits, budget.limit)
            limit = None if own is None else min(limit, own)
        if limit is None:
            return None, request
        known = ledger.known(tokenizer.name) if ledger is not None else (0, 0)
        bound = prompt_bound(
            request.messages,
            request.tools,
            tokenizer,
            count_bytes=_INLINE_BYTES,
            known=known,
            itemized=ledger is not None,
        )
        if ledger is not None and bound.exact:
            ledger.settle(tokenizer.name, known[0], bound.counts)
        calibration = request.calibration or Calibration()
        if not bound.exact or calibration.apply(bound.tokens) >= limit:
            return None, request
        return unchanged_result(request, tokenizer.name, budget, calibration, bound.tokens), request

    def facts_for(self, model: str, context_window: int | None = None) -> ModelFacts:
        """The catalog's facts for `model`, with `context_window` in place of its window.

        The output reserve is not adjusted here: the budget's one rule
        (compaction_proxy/compaction/budget.py) bounds it by whatever window is used, so a
        window learned from a refusal gets the reserve a declared one of the same size gets.
        """
        facts = self.catalog.facts_for(model)
        if context_window is None or context_window == facts.context_window:
            return facts
        return replace(facts, context_window=context_window)

    def output_reserve(self, body: Mapping[str, Any], context_window: int | None = None) -> int:
        """The completion budget the request's prompt budget leaves room for."""
        model: str = body["model"]
        return compute_budget(
            self.facts_for(model, context_window),
            max_completion_tokens=_int_or_none(body.get("max_completion_tokens")),
            max_tokens=_int_or_none(body.get("max_tokens")),
            output_share=self.settings_for(model)[0].output_reserve_share,
        ).output_reserve

    def _request(
        self,
        body: Mapping[str, Any],
        mode: Mode,
        window: RunWindow | None = None,
        extras: RunExtras | None = None,
    ) -> CompactionRequest:
        window = window or NO_WINDOW
        context_window = window.tokens
        model: str = body["model"]
        tools = body.get("tools") or body.get("functions")
        compaction = self.settings_for(model)[0]
        if compaction.recall.enabled and isinstance(tools, list) and tools:
            # An agent's request may be offered the recall tool: its definition is budgeted
            # whether or not this one is (docs/recall.md).
            tools = [*tools, RECALL_AS_CHAT]
        return CompactionRequest(
            body["messages"],
            model=model,
            pipeline=self.settings_for(model)[1],
            tokenizer=self.tokenizers,
            facts=self.catalog if context_window is None else self.facts_for(model, context_window),
            tools=tools if isinstance(tools, list) else None,
            max_completion_tokens=_int_or_none(body.get("max_completion_tokens")),
            max_tokens=_int_or_none(body.get("max_tokens")),
            reserve_ratio=self.settings.summarization.reserve_ratio,
            calibration=replace(self.calibration_for(model), offset=window.anticipate),
            mode=mode,
            window_source=window.source if context_window is not None else None,
            output_share=compaction.output_reserve_share,
            lower_output=compaction.lower_output_limit,
            edits=extras.strategies if extras is not None else (),
            recall=extras.recall if extras is not None and compaction.recall.enabled else None,
        )

    def calibrate(self, model: str, reported: int, counted: int) -> None:
        """Learn how far our count is from the upstream's `usage.prompt_tokens` for `model`.

        tiktoken miscounts models that are not OpenAI's behind OpenAI-compatible APIs; the
        triggers then compare the calibrated count. Weighted by request size, small requests
        ignored (compaction_proxy/engine/_calibration.py): the ratio that matters is that of
        requests near the budget, and one odd response cannot make compaction wild.
        """
        bounds = self.settings.compaction.calibration
        if not bounds.enabled:
            return
        self._calibration.observe(
            model, reported, counted, minimum=bounds.min_ratio, maximum=bounds.max_ratio
        )

    def calibration_for(self, model: str) -> Calibration:
        bounds = self.settings.compaction.calibration
        return Calibration(
            ratio=self._calibration.ratio(model),
            minimum=bounds.min_ratio,
            maximum=bounds.max_ratio,
        )

    def fingerprint(self, model: str, context_window: int | None = None) -> str:
        """Hash of everything that shapes a checkpoint for `model`: part of its namespace, so a
        changed configuration never reuses checkpoints made under the old one.

        `context_window`: the window the request is budgeted for, when not the catalog's; a
        checkpoint made for a window the upstream then refused is not reused for a smaller one.
        """
        cached = self._fingerprints.get((model, context_window))
        if cached is not None:
            return cached
        compaction, _ = self.settings_for(model)
        facts = self.facts_for(model, context_window)
        payload = orjson.dumps(
            [
                compaction.model_dump(mode="json", exclude=_NOT_SHAPING_COMPACTION),
                self.settings.summarization.model_dump(mode="json", exclude=_NOT_SHAPING),
                [
                    facts.context_window,
                    facts.max_output_tokens,
                    facts.encoding,
                    facts.output_reserve_share,
                ],
            ],
            option=orjson.OPT_SORT_KEYS,
        )
        value = hashlib.blake2b(payload, digest_size=8).hexdigest()
        if len(self._fingerprints) < 4096:
            self._fingerprints[(model, context_window)] = value
        return value

    def run_sync(
        self, body: Mapping[str, Any], mode: Mode, recall: RecallIds | None = None
    ) -> CompactionResult:
        """The same pipeline without a summarizer (the CLI, offline): summarization is skipped
        and says so in the report; every other strategy runs as on the server (`recall`: as
        in :meth:`run`)."""
        result = compact(self._request(body, mode, extras=RunExtras(recall=recall)))
        if self.debug:
            self._debug_log(body, result.report)
        return result

    def _debug_log(self, body: Mapping[str, Any], report: CompactionReport) -> None:
        """The budget, per-group token counts and each strategy's decision; never content."""
        facts = self.catalog.facts_for(body["model"])
        view = build_view(body["messages"], self.tokenizers.get(facts.encoding))
        groups = [
            {
                "kind": str(g.kind),
                "turn": g.turn,
                "messages": len(g.members),
                "tokens": g.token_count,
            }
            for g in view.groups
        ]
        log.debug(
            "compaction decision",
            extra={"report": report.to_dict(), "groups": groups},
        )


@dataclass(frozen=True, slots=True)
class RunWindow:
    """The window a run budgets for when the edge knows better than the catalog.

    ``tokens``: a window learned from a refusal or published by the upstream (None: the
    catalog's); ``source``: where it came from (compaction_proxy/upstream/_windows.py), for the
    report (None: the catalog says: config, builtin or default); ``anticipate``: tokens of
    growth to compact for as if they were already there (a summary prepared ahead of its
    trigger, compaction_proxy/engine/_prepare.py), 0 otherwise."""

    tokens: int | None = None
    source: str | None = None
    anticipate: int = 0


NO_WINDOW = RunWindow()


@dataclass(frozen=True, slots=True)
class RunExtras:
    """What a run takes from its request besides the body (:meth:`Compactor.run`).

    ``strategies``: the request's own (a client's context edits its format translated,
    compaction_proxy/wire/format.py ``ContextEdits``), run before the pipeline, and ``key``,
    which names them (their quiet limit is remembered by it); ``ledger``: the counts of the
    body's leading messages known from the conversation's previous request
    (compaction_proxy/engine/_known.py), carried to the quiet check wherever it runs, which
    counts only the rest and leaves every message's count in it for the next request;
    ``recall``: the keyed ids of its archive namespace
    (compaction_proxy/checkpoints/_archive_key.py), which name what the run archives when
    ``compaction.recall`` is on (None: nothing is archived or marked: the key could not be
    read, or a caller without an archive)."""

    strategies: tuple[Strategy, ...] = ()
    key: str = ""
    ledger: TokenLedger | None = None
    recall: RecallIds | None = None


NO_EXTRAS = RunExtras()


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
