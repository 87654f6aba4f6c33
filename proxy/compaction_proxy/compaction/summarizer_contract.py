"""The summarizer contract between the pure core and the edge (see "Checkpoints" in
compaction_proxy/checkpoints/README.md).

The core never talks to a model itself.  The summarization strategy hands a
:class:`SummaryRequest` to whatever :class:`Summarizer` the edge passed to
:func:`~compaction_proxy.compaction.pipeline.compact_async` and gets back the summary text, or a
:class:`SummaryError` saying why there is none.  Everything model-facing -- prompts, transcript
guards (images, reasoning, oversized messages), chunking, the HTTP call, single-flight and
back-off -- lives behind this protocol in :mod:`compaction_proxy.summarizer`.

A failure never fails the request: the strategy changes nothing, reports the failure, and the
pipeline moves on to its next strategy (truncation at worst).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import CompactionProxyError

SummaryFailureReason = Literal[
    "timeout", "error", "empty", "oversized", "not_shorter", "backoff", "overflow"
]
"""Why a summary was not produced (``SummaryError.reason``; also the report's ``failed``)."""


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """One stretch of conversation to fold into a checkpoint.

    ``messages``: the stretch, in order, as the client's dicts (the current form in the
    pipeline: a tool result an earlier strategy trimmed arrives trimmed).  It never contains the
    previous checkpoint message itself, nor system/developer messages (those stay in place).
    ``previous_summary``: the text of the checkpoint being extended (a rolling update, to be
    merged with ``messages`` by the update prompt), without its ``<summary>`` wrapper; ``None``
    for a first summary.
    ``model``: the chat request's model (the default summarizer model).
    ``prefix``: the chat request's messages exactly as it carries them (the same dicts, the
    system messages included), from its start to the stretch's last message inclusive, so a
    summarizer can send them as they are and hit the upstream's prompt cache (stretch messages
    an earlier strategy made up may follow in their current form); ``None``: not available
    (the edge may find it itself).  ``tools``: the request's ``tools``, as sent;
    ``None``: not available or none.
    ``max_tokens``: the most tokens the summary may have, from the budget it must fit (the
    summarizer's output limit is the smaller of this and its own ``maxSummaryTokens``);
    ``None``: only the summarizer's own limit.
    """

    messages: tuple[dict[str, Any], ...]
    previous_summary: str | None
    model: str
    prefix: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None


class SummaryError(CompactionProxyError):
    """No usable summary.

    ``reason`` is one of ``"timeout"``, ``"error"``, ``"empty"``, ``"oversized"``,
    ``"not_shorter"``, ``"backoff"`` (the summarizer failed recently for this stretch and is
    not asked again yet) or ``"overflow"`` (the upstream refused the call as too long for its
    window, and its smaller retry too); ``message`` is a human-readable detail (never message
    content or credentials: it reaches logs and a response header).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


CUT_MARK = "[Part of this summary was cut at its length limit and is missing.]"
"""The last line of a summary kept from a reply the model ran past its limit in: its complete
lines, then this, so the model that reads it knows it is not whole (and the report says so)."""


def is_cut(summary: str) -> bool:
    """Whether ``summary`` was kept from a reply cut at its limit (ends with :data:`CUT_MARK`)."""
    return summary.rstrip().endswith(CUT_MARK)


def without_cut_mark(summary: str) -> str:
    """``summary`` without a trailing :data:`CUT_MARK`: an update folds the earlier summary into a
    new one, which says for itself whether it was cut."""
    text = summary.rstrip()
    if text.endswith(CUT_MARK):
        return text[: -len(CUT_MARK)].rstrip()
    return summary


@runtime_checkable
class Summarizer(Protocol):
    """Turns a :class:`SummaryRequest` into summary text (stripped, non-empty).

    A summary kept from a reply cut at its limit ends with :data:`CUT_MARK`.

    Raises :class:`SummaryError` for every expected failure.  Anything else it raises is
    treated by the core as ``reason="error"``; cancellation propagates.
    """

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary text of ``request`` (see the class docstring)."""
        ...
