"""A checkpoint hit's report in the client's terms: what it sent, not what the proxy rebuilt.

On a hit the pipeline runs on the checkpoint view (system block + checkpoint + the messages
after it), so its report starts from that view: a client that sent 110k tokens saw
``X-Compaction-Tokens-Before: 1008`` and ``Strategies: none``, and the dashboard counted the
hit as saving nothing. The report the client, the metrics and the dashboard get instead says:

- ``tokens_before``: the client's whole request (by our count), ``messages_before`` its length;
- a first step named ``checkpoint``, from the client's count to the view's, so
  ``X-Compaction-Strategies`` reads ``checkpoint`` (then whatever ran on top of it this time);
- ``tokens_after``: unchanged, what went upstream.

Counting the client's whole request again would cost a tokenizer pass over everything the
checkpoint stands for, on every request, exactly what checkpoints exist to avoid. Instead each
checkpoint stores ``folded_tokens`` in its meta: how many tokens fewer its messages have than
the client messages they stand for, which is the saving request's ``tokens_before -
tokens_after`` (the system block, tools and reply priming are the same on both sides and
cancel). A hit then costs one addition: ``view tokens + folded_tokens``. Checkpoints stored
before the figure existed are counted once the slow way, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from compaction_proxy.checkpoints import FOLDED_TOKENS, INDEX_META, Lookup
from compaction_proxy.compaction import (
    CompactionReport,
    CompactionResult,
    StrategyReport,
    Tokenizer,
)
from compaction_proxy.compaction.strategies.summarization import contradiction_warning
from compaction_proxy.compaction.summary_check import SummaryCheck, check_from_dict

from ._compactor import Compactor

__all__ = ["CHECKPOINT_STEP", "as_sent", "checkpoint_meta"]

SUMMARY_CHECKS_META = "summary_checks"
PREPARED_WARNINGS_META = "warnings"
"""A prepared run's warnings (what its ledger left out, a summary's contradiction...): said by
the request that forwards it, since no response carried the background run's."""
"""Meta key: what the summaries the run that made a checkpoint wrote kept on their own."""

CHECKPOINT_STEP = "checkpoint"
"""The step's name in reports, ``X-Compaction-Strategies`` and the strategy metrics."""


async def as_sent(
    result: CompactionResult,
    messages: Sequence[Mapping[str, Any]],
    lookup: Lookup,
    compactor: Compactor,
) -> CompactionResult:
    """``result`` (run on ``lookup``'s view) reported from the client's ``messages``.

    Returns ``result`` itself when the lookup was a miss. ``compactor`` gives the model's
    tokenizer, needed only for a checkpoint without ``folded_tokens``.
    """
    checkpoint = lookup.checkpoint
    if checkpoint is None:
        return result
    folded = lookup.folded_tokens
    if folded is None:
        # A checkpoint stored before `folded_tokens` existed: count both sides once.
        report = result.report
        covered = messages[lookup.system_count : lookup.system_count + lookup.covered]
        tokenizer = compactor.tokenizers.get(compactor.catalog.facts_for(report.model).encoding)
        folded = await asyncio.to_thread(_folded, tokenizer, covered, checkpoint.messages)
    report = result.report
    view_tokens = report.tokens_before
    made_by = checkpoint.meta.get("strategies")
    notes = [
        f"{lookup.covered} message(s) sent as {len(checkpoint.messages)} stored in a checkpoint"
    ]
    if isinstance(made_by, list) and made_by and all(isinstance(s, str) for s in made_by):
        notes.append("the checkpoint was made by " + ", ".join(made_by))
    step = StrategyReport(
        CHECKPOINT_STEP,
        fired=True,
        changed=True,
        tokens_before=view_tokens + folded,
        tokens_after=view_tokens,
        messages_affected=lookup.covered,
        notes=tuple(notes),
    )
    honest: CompactionReport = replace(
        report,
        tokens_before=view_tokens + folded,
        messages_before=len(messages),
        strategies=(step, *report.strategies),
    )
    return replace(result, report=honest)


def checkpoint_meta(report: CompactionReport) -> dict[str, Any]:
    """What a new checkpoint stores so a later hit can report the client's count for free.

    ``report`` must be in the client's terms (:func:`as_sent` applied on a hit): its
    ``tokens_before`` is then the client's whole request and ``tokens_after`` the forwarded
    one, whose non-system messages are what the checkpoint stores.
    """
    return {FOLDED_TOKENS: report.tokens_before - report.tokens_after}


def _folded(
    tokenizer: Tokenizer,
    covered: Sequence[Mapping[str, Any]],
    stored: Sequence[Mapping[str, Any]],
) -> int:
    return sum(tokenizer.count_message(m) for m in covered) - sum(
        tokenizer.count_message(m) for m in stored
    )


def as_prepared(report: CompactionReport, used: Lookup) -> CompactionReport:
    """The event that used a prepared checkpoint, told as what it is: a ``prepared`` step
    (from the client's count to the prepared view's) whose children name the strategies that
    made it in the background, so ``X-Compaction-Strategies`` reads e.g. ``summarization``; the
    checks of the summaries it made (its meta's :data:`SUMMARY_CHECKS_META`) on the first of
    them, and the run's warnings (:data:`PREPARED_WARNINGS_META`), so what a prepared run
    checked and left out is reported, once, by the request that forwards it."""
    if not report.strategies or report.strategies[0].name != CHECKPOINT_STEP:
        return report
    first, *rest = report.strategies
    meta = used.checkpoint.meta if used.checkpoint is not None else {}
    made_by = meta.get("strategies")
    names = [n for n in made_by if isinstance(n, str)] if isinstance(made_by, list) else []
    children = tuple(
        StrategyReport(name, True, True, first.tokens_after, first.tokens_after)
        for name in names or [CHECKPOINT_STEP]
    )
    checks = prepared_checks(meta)
    if checks and children:  # the summary reaches the model now: its check is reported here
        children = (replace(children[0], summary_checks=checks), *children[1:])
    said = meta.get(PREPARED_WARNINGS_META)
    if isinstance(said, list):
        warnings = tuple(w for w in said if isinstance(w, str))
    else:  # stored before the warnings were
        warnings = tuple(contradiction_warning(r) for c in checks for r in c.contradictions)
    note = "prepared in the background before the trigger fired; the request did not wait"
    step = replace(first, name="prepared", children=children, notes=(*first.notes, note))
    return replace(report, strategies=(step, *rest), warnings=(*report.warnings, *warnings))


def prepared_checks(meta: Mapping[str, Any]) -> tuple[SummaryCheck, ...]:
    """The checks of the summaries a checkpoint's run wrote (:data:`SUMMARY_CHECKS_META`);
    what does not read as one is left out."""
    raw = meta.get(SUMMARY_CHECKS_META)
    found = (check_from_dict(item) for item in raw) if isinstance(raw, list) else ()
    return tuple(check for check in found if check is not None)


def saved_meta(
    result: CompactionResult, model: str, index: list[list[Any]] | None
) -> dict[str, Any]:
    """The meta a checkpoint is stored with: what made it, its counts, and its conversation's
    archive index (docs/recall.md)."""
    report = result.report
    meta: dict[str, Any] = {
        "model": model,
        "strategies": list(report.changed_by),
        "tokens_before": report.tokens_before,
        "tokens_after": report.tokens_after,
        **checkpoint_meta(report),
    }
    if report.summary_checks:  # reported by the request that forwards a prepared one
        meta[SUMMARY_CHECKS_META] = [check.to_dict() for check in report.summary_checks]
    if report.warnings:  # likewise
        meta[PREPARED_WARNINGS_META] = list(report.warnings)
    if index:
        meta[INDEX_META] = index
    return meta
