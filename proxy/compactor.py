"""The edge's handle on the compaction core: built once per process from the settings.

It owns what the pure core must not: the tokenizer provider (encodings loaded at start-up),
the model catalog, one pipeline per configured model pattern, a worker thread so large
conversations are counted off the event loop, and debug logging of decisions.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from proxy.compaction import (
    CompactionReport,
    CompactionResult,
    CompactionSettings,
    EncodingLoader,
    ImagePricing,
    Mode,
    ModelCatalog,
    Pipeline,
    TokenizerProvider,
    build_pipeline,
    build_view,
    compact,
)
from proxy.config import Settings

log = logging.getLogger("compaction_proxy.compaction")

# Requests smaller than this are compacted inline: a thread hop costs more than counting them.
_INLINE_BYTES = 64 * 1024
_BUILTIN_ENCODINGS = ("o200k_base", "cl100k_base")


def debug_enabled() -> bool:
    return os.environ.get("COMPACTION_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Plan:
    """What the edge decided for one request: the compaction result, if any ran."""

    result: CompactionResult | None
    mode: Mode | None


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction")
        self.debug = debug_enabled()

    def warm_up(self) -> None:
        """Load the common encodings now, so the first request does not pay ~0.5 s for it."""
        for encoding in {*_BUILTIN_ENCODINGS, self.settings.compaction.tokenizer.default_encoding}:
            self.tokenizers.get(encoding)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

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

    async def run(self, body: Mapping[str, Any], mode: Mode, *, size_hint: int) -> CompactionResult:
        """Compact a validated chat body; large bodies are counted on the worker thread."""
        if size_hint < _INLINE_BYTES:
            return self.run_sync(body, mode)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run_sync, body, mode)

    def run_sync(self, body: Mapping[str, Any], mode: Mode) -> CompactionResult:
        model: str = body["model"]
        _, pipeline = self.settings_for(model)
        tools = body.get("tools") or body.get("functions")
        result = compact(
            body["messages"],
            model=model,
            pipeline=pipeline,
            tokenizer=self.tokenizers,
            facts=self.catalog,
            tools=tools if isinstance(tools, list) else None,
            max_completion_tokens=_int_or_none(body.get("max_completion_tokens")),
            max_tokens=_int_or_none(body.get("max_tokens")),
            reserve_ratio=self.settings.summarization.reserve_ratio,
            mode=mode,
        )
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


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
