"""The recall loop: the model's calls to ``compaction_recall`` answered by the proxy, hidden
from the client (docs/recall.md).

A request whose conversation has something archived, and which declares tools of its own, is
forwarded with the recall tool appended (:func:`offer_for`). Its 2xx reply is then read whole
before anything reaches the client (a stream too: every event is held until the stream ends,
so nothing of a hidden step can leak). A reply that calls no recall goes out as it came. One
that calls only the recall tool is answered from the archive and the request continued with
the answers, at most ``recall.max_rounds`` times and for ``recall.time_budget`` seconds; a
model that still asks after that gets one closing round (``tool_choice`` none) with the answer
"limit reached". A mixed turn (recall beside the client's own tools) goes out without the
recall calls: the model asks again on the next request, which carries the client's results.

What the client gets is the reply of the last round, with ``X-Compaction-Recall`` saying what
was done; the usage it reports is that round's (its prompt holds the recalled text), while the
request's telemetry keeps the first round's prompt for the calibration (the prompt the proxy
counted).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from compaction_proxy.compaction import RecallSettings
from compaction_proxy.engine import Recallable
from compaction_proxy.upstream import Window
from compaction_proxy.wire import WireFormat
from compaction_proxy.wire.recall import RECALL, RECALL_TOOL, RecallAnswer, RecallTurn, RecallWire

from ._context import RequestContext
from ._forward import HeldReply, Outcome
from ._outcome import RecallStats
from ._usage import UsageProbe

log = logging.getLogger("compaction_proxy.recall")

RECALL_HOLD = 8 * 1024 * 1024
"""The largest reply the loop holds to read (a longer one is relayed as it comes, unread)."""
OK_STATUSES = frozenset({200})
LIMIT_TEXT = (
    "Recall limit reached for this request: answer with what you have now; you may recall "
    "again in a later step."
)
UNFIT_TEXT = (
    "The recalled text did not fit the model's context window; answer with what you have, "
    "or recall fewer ids (or a narrower query) in a later step."
)


@dataclass(frozen=True, slots=True)
class RecallOffer:
    """A request that was offered the recall tool: its format's side of the loop, what its
    conversation may recall, and the settings of the model's block."""

    wire: RecallWire
    recallable: Recallable
    settings: RecallSettings


def offer_for(
    wire: WireFormat,
    body: Mapping[str, Any],
    recallable: Recallable | None,
    settings: RecallSettings,
) -> tuple[RecallOffer | None, dict[str, Any]]:
    """The offer for a request and the body members that declare the tool, or ``(None, {})``:
    recall is off, nothing is archived, the format has no recall side, or the request is not
    an agent's (it declares no tools)."""
    side = wire.recall
    if recallable is None or side is None or not settings.enabled or not side.declared(body):
        return None, {}
    return RecallOffer(side, recallable, settings), side.offer(body, RECALL)


def clashes(wire: WireFormat, body: Mapping[str, Any]) -> bool:
    """Whether the client declares a tool of the recall tool's name (a 400 when recall is on)."""
    side = wire.recall
    return side is not None and side.clashes(body, RECALL_TOOL)


def is_stream(held: HeldReply) -> bool:
    for name, value in held.headers:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
    return False


def prompt_tokens(held: HeldReply, wire: WireFormat) -> int | None:
    """The prompt's tokens the held reply's usage states (read as a relayed reply's is)."""
    content_type = next((v.decode("latin-1") for n, v in held.headers if n == b"content-type"), "")
    probe = UsageProbe.start(
        content_type,
        held.content_encoding,
        None,
        wire.usage_tokens,
        at_start=wire.usage_at_start,
    )
    if probe is None:
        return None
    probe.feed(held.body)
    return probe.prompt_tokens()


_MARKED = re.compile(rb"recall id ([rs][a-z2-7]{11})")


def marked(body: bytes) -> frozenset[str]:
    """The recall ids the forwarded request's marks name, in any format (the marks are plain
    text inside its JSON strings)."""
    return frozenset(m.decode("ascii") for m in _MARKED.findall(body))


async def settle(
    ctx: RequestContext,
    wire: WireFormat,
    offer: RecallOffer,
    first: Outcome,
    sent_body: bytes,
    headers: list[tuple[bytes, bytes]],
    window: Window | None,
    post: Callable[[bytes, list[tuple[bytes, bytes]]], Awaitable[Outcome]],
    deliver: Callable[[HeldReply, list[tuple[bytes, bytes]]], Awaitable[int]],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Outcome, RecallStats]:
    """The reply the client gets for a request that offered the recall tool, whose first 2xx
    reply ``first.held`` was read whole; ``post(body, headers)`` sends a round upstream (held
    like the first), ``deliver(held, headers)`` sends the client a held reply."""
    assert first.held is not None
    stats = RecallStats()
    held = first.held
    settings = offer.settings
    started = clock()
    data: dict[str, Any] | None = None
    allowed: frozenset[str] | None = None
    desk = ctx.state.recall_desk
    usage = prompt_tokens(held, wire)
    outcome = first
    while True:
        turn = _turn(offer, held)
        if turn is None:
            if RECALL_TOOL.encode() in held.body and held.status in OK_STATUSES:
                # A reply that echoes the request's tools (Responses) shows none of ours.
                stripped = offer.wire.strip(held.body, stream=is_stream(held), name=RECALL_TOOL)
                held = replace(held, body=stripped)
            break
        if turn.others:
            # A mixed turn: the client gets its own calls; the model asks again next request.
            stripped = offer.wire.strip(held.body, stream=is_stream(held), name=RECALL_TOOL)
            held = replace(held, body=stripped)
            stats.deferred += len(turn.calls)
            break
        if data is None:
            data = orjson.loads(sent_body)
        over = stats.rounds >= settings.max_rounds or clock() - started >= settings.time_budget
        if over:
            stats.limited = True
            answers = [RecallAnswer(c.call_id, LIMIT_TEXT, True) for c in turn.calls]
        else:
            if allowed is None:
                allowed = frozenset(offer.recallable.index) | marked(sent_body)
            answers = []
            for call in turn.calls:
                if desk is None:  # never: the desk exists wherever a block turns recall on
                    answers.append(RecallAnswer(call.call_id, "archive not available", True))
                    stats.unavailable = True
                    continue
                answer = await desk.answer(
                    offer.recallable.namespace, allowed, call, _answer_tokens(settings, window)
                )
                answers.append(answer.answer)
                stats.calls += 1
                stats.ids += answer.ids
                stats.tokens += answer.tokens
                stats.unavailable = stats.unavailable or answer.unavailable
        base = data
        members = offer.wire.continuation(base, turn, answers)
        if over:
            members.update(offer.wire.closing(base))
        data = {**base, **members}
        stats.rounds += 1
        body = orjson.dumps(data)
        round_headers = [*headers, stats.header()]
        outcome = await post(body, round_headers)
        if outcome.held is None:
            stats.seconds = clock() - started
            return replace(outcome, prompt_tokens=usage), stats  # relayed: nothing to read
        held = outcome.held
        if held.status not in OK_STATUSES:
            # The continuation was refused (the recalled text made it too long, most likely):
            # one more round that says so and lets no tool be called; then whatever comes.
            answers = [RecallAnswer(a.call_id, UNFIT_TEXT, True) for a in answers]
            members = offer.wire.continuation(base, turn, answers)
            members.update(offer.wire.closing(base))
            data = {**base, **members}
            stats.rounds += 1
            stats.limited = True
            outcome = await post(orjson.dumps(data), [*headers, stats.header()])
            if outcome.held is None:
                stats.seconds = clock() - started
                return replace(outcome, prompt_tokens=usage), stats
            held = outcome.held
            break
    stats.seconds = clock() - started
    sent = await deliver(held, [*headers, stats.header()])
    delivered = replace(
        outcome, status=held.status, bytes_out=sent, held=None, completed=True, prompt_tokens=usage
    )
    return delivered, stats


def _turn(offer: RecallOffer, held: HeldReply) -> RecallTurn | None:
    """The recall calls of a held reply; None for one the loop cannot read (compressed)."""
    if held.status not in OK_STATUSES:
        return None
    encoding = (held.content_encoding or "identity").strip().lower()
    if encoding != "identity":
        return None
    try:
        return offer.wire.read(held.body, stream=is_stream(held), name=RECALL_TOOL)
    except Exception:  # a reply the reader did not expect goes out as it came
        log.exception("reading a reply for recall calls failed; relayed as it came")
        return None


def _answer_tokens(settings: RecallSettings, window: Window | None) -> int:
    """The most one answer returns: the setting, and never more than a quarter of the window
    (the recalled text joins a prompt that was compacted to fit)."""
    if window is None:
        return settings.max_tokens
    return max(100, min(settings.max_tokens, window.tokens // 4))
