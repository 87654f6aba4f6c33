"""How big a summary call may be, and how much smaller the one after a "too long" refusal is.

A summary call is sized before it is sent: the summarizer model's window (a window learned
from a refusal included, the edge's ``facts_for``) less the output limit and a safety share,
and the proxy's count of the call scaled by the calibration measured from that model's
``usage`` (:class:`SummarizerWindow` ``ratio``). A local model whose tokenizer counts 1.63x
ours otherwise gets calls that look like 2,400 tokens to us and are 3,900 to it: refused
every time, for good.

When an upstream still refuses a call as too long (a window or a ratio not known yet), the
refusal is read as a request's is (compaction_proxy/upstream/_overflow.py) and teaches the
same things: the window it states (or one shrunk from what it refused), and the ratio of its
count to ours. The call is then made once more, smaller (:func:`smaller_after`), before the
summary counts as failed: an overflow is fixed by a smaller call, not by waiting.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from compaction_proxy.compaction.summarizer_contract import SummaryError
from compaction_proxy.upstream import SHRINK, Overflow, window_after_refusal

from ._transcript import SummarizerWindow

log = logging.getLogger("compaction_proxy.summaries")


async def _learn_nothing(_upstream: str, _model: str, _window: int) -> None:
    return None


@dataclass(frozen=True, slots=True)
class SummarySizing:
    """What the edge knows about the summarizer model's counts and windows.

    ``ratio``: the calibration for a model (its upstream's ``prompt_tokens`` over our count,
    clamped; 1.0 before any observation). ``calibrate``: one observation (model, the
    upstream's count, ours), from a refusal that states the count. ``learn``: the window a
    refusal taught for (upstream, model), kept where the requests' windows are.
    """

    ratio: Callable[[str], float] = lambda _model: 1.0
    calibrate: Callable[[str, int, int], None] = lambda _model, _reported, _counted: None
    learn: Callable[[str, str, int], Awaitable[None]] = _learn_nothing


class SummaryOverflow(SummaryError):
    """The upstream refused a summary call as too long for its window (``overflow``), after
    ``sent`` tokens by our count."""

    def __init__(self, message: str, overflow: Overflow, sent: int) -> None:
        super().__init__("overflow", message)
        self.overflow = overflow
        self.sent = sent


@dataclass(frozen=True, slots=True)
class Smaller:
    """What one refusal teaches: the window the retry is sized for, the window to learn (None:
    nothing new) and the ratio of the upstream's count to ours it states (None: not stated,
    or only a floor)."""

    window: SummarizerWindow
    learned: int | None
    observed: float | None


def smaller_after(refused: SummaryOverflow, window: SummarizerWindow) -> Smaller:
    """The window the retry of a call ``window`` sized and the upstream refused is sized for.

    The new window is the one the refusal states, or the one :func:`window_after_refusal`
    shrinks from what was refused, when smaller; the ratio rises to the one the refusal's count
    shows (a floor counts too: the ratio is at least that). When neither moves (the upstream
    states a window no smaller than ours and no count), the input is cut by
    :data:`~compaction_proxy.upstream.SHRINK` all the same: the retry is always smaller.
    """
    overflow, sent = refused.overflow, refused.sent
    used = window.context_window
    seen: float | None = None
    if overflow.prompt_tokens is not None and sent > 0:
        seen = overflow.prompt_tokens / sent
    ratio = max(window.ratio, seen or 0.0)
    learned = window_after_refusal(
        overflow,
        sent_tokens=math.ceil(sent * window.ratio),
        output_reserve=window.max_output_tokens,
        requested_output=window.max_output_tokens,
    )
    tokens = used if learned is None else min(used, learned)
    if tokens >= used and ratio <= window.ratio:
        ratio = window.ratio / SHRINK
    teaches = None
    if learned is not None and (overflow.window is not None or learned < used):
        teaches = learned
    # As for a request's refusal: the count calibrates only when the refusal states the window
    # too, and not as a floor (newer vLLM stops counting past the window).
    observed = None
    if seen is not None and overflow.window is not None and not overflow.prompt_is_floor:
        observed = seen
    return Smaller(replace(window, context_window=tokens, ratio=ratio), teaches, observed)


async def learn_from(
    refused: SummaryOverflow,
    window: SummarizerWindow,
    sizing: SummarySizing,
    upstream: str,
    model: str,
) -> SummarizerWindow:
    """What a refused call teaches, kept where the requests' windows and calibration are, and
    the window its retry is sized for."""
    smaller = smaller_after(refused, window)
    if smaller.observed is not None and refused.overflow.prompt_tokens is not None:
        sizing.calibrate(model, refused.overflow.prompt_tokens, refused.sent)
    if smaller.learned is not None:
        await sizing.learn(upstream, model, smaller.learned)
    log.info(
        "summary call of %s tokens (ours) refused as too long by upstream %r (%s, %s): "
        "retried for a window of %s at %.2f of its tokens per one of ours",
        refused.sent,
        upstream,
        model,
        refused.overflow.family,
        smaller.window.context_window,
        smaller.window.ratio,
    )
    return smaller.window
