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

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import orjson

from compaction_proxy.compaction import RecallSettings
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.engine import Recallable
from compaction_proxy.upstream import (
    REFUSAL_STATUSES,
    HeldReply,
    Outcome,
    ReplyHandling,
    UsageProbe,
    Window,
    post_upstream,
    send_held,
)
from compaction_proxy.wire import WireFormat
from compaction_proxy.wire.recall import RECALL, RECALL_TOOL, RecallAnswer, RecallTurn, RecallWire

from ._context import RequestContext
from ._recall_stats import RecallStats

log = logging.getLogger("compaction_proxy.recall")

RECALL_HOLD = 8 * 1024 * 1024
"""The largest reply the loop holds to read (a longer one is relayed as it comes, unread)."""
OK_STATUSES = frozenset({200})
ROUND_HOLD = frozenset(range(100, 600))
"""A hidden round's reply is held whatever its status: a failure is the loop's to answer."""
OFF_LOOP = 256 * 1024
"""From this size a held reply is read (and rewritten) on a worker thread."""
LIMIT_TEXT = (
    "Recall limit reached for this request: answer with what you have now; you may recall "
    "again in a later step."
)
MAX_CALLS = 4
"""Recall calls one round answers; the others get :data:`TOO_MANY_TEXT`."""
TOO_MANY_TEXT = "Too many recall calls in one turn: ask for fewer ids, or one query, at a time."
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


def without_recall(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the recall tool in its ``tools`` (or legacy ``functions``), whatever
    the format's form of a tool (``name`` or ``function.name``)."""
    out = dict(data)
    for key in ("tools", "functions"):
        tools = out.get(key)
        if isinstance(tools, list):
            out[key] = [t for t in tools if _tool_name(t) != RECALL_TOOL]
    return out


def _tool_name(tool: object) -> object:
    if not isinstance(tool, Mapping):
        return None
    function = tool.get("function")
    return function.get("name") if isinstance(function, Mapping) else tool.get("name")


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The request as it went upstream with the offer: its body, the headers the client gets
    (the request's own, the attempt's report, a retry's), the header values its format's
    amendment lists, the window it was compacted for."""

    offer: RecallOffer
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    listed: tuple[tuple[str, str], ...]
    window: Window | None


@dataclass(frozen=True, slots=True)
class Rounds:
    """How the loop reaches the upstream and the client: ``post(body, headers)`` sends a
    round (its reply held whatever its status, an unreachable upstream too),
    ``deliver(held, headers)`` sends the client a held reply, ``relay(body, headers)`` sends
    a body whose reply goes to the client as it comes (the fallback); ``clock`` times the
    rounds against ``recall.time_budget``."""

    post: Callable[[bytes, list[tuple[bytes, bytes]]], Awaitable[Outcome]]
    deliver: Callable[[HeldReply, list[tuple[bytes, bytes]]], Awaitable[int]]
    relay: Callable[[bytes, list[tuple[bytes, bytes]]], Awaitable[Outcome]]
    clock: Callable[[], float] = time.monotonic


async def settle(
    ctx: RequestContext, wire: WireFormat, forwarded: Forwarded, first: Outcome, rounds: Rounds
) -> tuple[Outcome, RecallStats]:
    """The reply the client gets for ``forwarded``, a request that offered the recall tool,
    whose first 2xx reply ``first.held`` was read whole (see the module docstring)."""
    return await _Loop(ctx, wire, forwarded, rounds).run(first)


class _Loop:
    """One request's hidden rounds."""

    def __init__(
        self, ctx: RequestContext, wire: WireFormat, forwarded: Forwarded, rounds: Rounds
    ) -> None:
        self.ctx, self.wire, self.offer, self.rounds = ctx, wire, forwarded.offer, rounds
        self.sent_body, self.headers = forwarded.body, list(forwarded.headers)
        self.window = forwarded.window
        self.stats = RecallStats()
        self.started = rounds.clock()
        self.allowed: frozenset[str] | None = None
        self.closed = False  # a closing round was sent: no more rounds, whatever comes

    async def run(self, first: Outcome) -> tuple[Outcome, RecallStats]:
        assert first.held is not None
        usage = prompt_tokens(first.held, self.wire)
        outcome, held = first, first.held
        data: dict[str, Any] | None = None
        while True:
            turn = await _turn(self.offer, held)
            if turn is None or turn.others or self.closed:
                # No call; a mixed turn (the client gets its own calls, the model asks again
                # next request); or a model past its closing round: out without our calls.
                if turn is not None:
                    self.stats.deferred += len(turn.calls) if turn.others else 0
                held = await self._without_ours(held)
                break
            data = orjson.loads(self.sent_body) if data is None else data
            answers, closing = await self._answers(turn)
            sent = await self._round(data, turn, answers, closing)
            outcome, data = sent
            if outcome.held is None:  # relayed as it came: nothing more to read
                self.stats.seconds = self.rounds.clock() - self.started
                return replace(outcome, prompt_tokens=usage), self.stats
            held = outcome.held
        self.stats.seconds = self.rounds.clock() - self.started
        sent_bytes = await self.rounds.deliver(held, [*self.headers, *self.stats.headers()])
        delivered = replace(
            outcome,
            status=held.status,
            bytes_out=sent_bytes,
            held=None,
            completed=True,
            prompt_tokens=usage,
        )
        return delivered, self.stats

    async def _without_ours(self, held: HeldReply) -> HeldReply:
        """``held`` without the recall tool's calls, nor its echo in a reply that repeats the
        request's tools (Responses). One the format cannot rewrite goes as it came (logged):
        the client gets an answer it can read, if with a call it does not know."""
        if held.status not in OK_STATUSES or RECALL_TOOL.encode() not in held.body:
            return held
        strip = partial(self.offer.wire.strip, held.body, stream=is_stream(held), name=RECALL_TOOL)
        try:
            body = await asyncio.to_thread(strip) if len(held.body) > OFF_LOOP else strip()
        except Exception:
            log.exception("removing the recall calls from a reply failed; relayed as it came")
            return held
        return replace(held, body=body)

    async def _answers(self, turn: RecallTurn) -> tuple[list[RecallAnswer], bool]:
        """The answers to ``turn``'s calls, and whether this round must close (the caps)."""
        settings, stats = self.offer.settings, self.stats
        spent = self.rounds.clock() - self.started
        if stats.rounds >= settings.max_rounds or spent >= settings.time_budget:
            stats.limited = True
            return [RecallAnswer(c.call_id, LIMIT_TEXT, True) for c in turn.calls], True
        if self.allowed is None:
            # Only what this conversation's own index holds (and, in the desk, its spans'
            # members): never an id because some text of the request names it, which a
            # client's message or a tool result (prompt injection) can.
            self.allowed = frozenset(self.offer.recallable.index)
        desk = self.ctx.state.recall_desk
        answers: list[RecallAnswer] = []
        # The answers of one round share one budget, and a round answers a few calls at most:
        # five calls each returning a quarter of the window would overflow it by themselves.
        calls = turn.calls[:MAX_CALLS]
        share = max(100, _answer_tokens(settings, self.window) // max(1, len(calls)))
        for call in calls:
            if desk is None:  # never: the desk exists wherever a block turns recall on
                answers.append(RecallAnswer(call.call_id, "archive not available", True))
                stats.unavailable = True
                continue
            namespace = self.offer.recallable.namespace
            answer = await desk.answer(namespace, self.allowed, call, share)
            answers.append(answer.answer)
            stats.calls += 1
            stats.ids += answer.ids
            stats.tokens += answer.tokens
            stats.unavailable = stats.unavailable or answer.unavailable
        # Every call gets its result, in the turn's order.
        answers.extend(RecallAnswer(c.call_id, TOO_MANY_TEXT, True) for c in turn.calls[MAX_CALLS:])
        return answers, False

    async def _round(
        self, base: dict[str, Any], turn: RecallTurn, answers: list[RecallAnswer], closing: bool
    ) -> tuple[Outcome, dict[str, Any]]:
        """One hidden round: ``base`` continued with the turn and its answers; a refused one
        (the recalled text made it too long, most likely) is sent once more as a closing round
        that says so instead."""
        outcome, data = await self._send(base, turn, answers, closing)
        held = outcome.held
        if held is None or held.status in OK_STATUSES:
            return outcome, data
        if held.status in REFUSAL_STATUSES and not closing:
            unfit = [RecallAnswer(a.call_id, UNFIT_TEXT, True) for a in answers]
            self.stats.limited = True
            outcome, data = await self._send(base, turn, unfit, True)
            held = outcome.held
            if held is None or held.status in OK_STATUSES:
                return outcome, data
        return await self._fallback(), data

    async def _fallback(self) -> Outcome:
        """A hidden round failed (rate limited, refused, unreachable): the request goes as it
        would have without recall (the forwarded body without the tool), its reply relayed as
        it comes. The client never gets an error about a turn it did not send."""
        log.warning("a hidden recall round failed; the request is sent again without recall")
        self.stats.fallback = True
        data = without_recall(orjson.loads(self.sent_body))
        return await self.rounds.relay(orjson.dumps(data), [*self.headers, *self.stats.headers()])

    async def _send(
        self, base: dict[str, Any], turn: RecallTurn, answers: list[RecallAnswer], closing: bool
    ) -> tuple[Outcome, dict[str, Any]]:
        side = self.offer.wire
        members = side.continuation(base, turn, answers)
        if closing:
            members.update(side.closing(base))
            self.closed = True
        data = {**base, **members}
        self.stats.rounds += 1
        headers = [*self.headers, *self.stats.headers()]
        return await self.rounds.post(orjson.dumps(data), headers), data


async def _turn(offer: RecallOffer, held: HeldReply) -> RecallTurn | None:
    """The recall calls of a held reply; None for one the loop cannot read (compressed)."""
    if held.status not in OK_STATUSES:
        return None
    encoding = (held.content_encoding or "identity").strip().lower()
    if encoding != "identity":
        return None
    read = partial(offer.wire.read, held.body, stream=is_stream(held), name=RECALL_TOOL)
    try:
        # A reply of megabytes (a long stream's events) is read off the event loop.
        return await asyncio.to_thread(read) if len(held.body) > OFF_LOOP else read()
    except Exception:  # a reply the reader did not expect goes out as it came
        log.exception("reading a reply for recall calls failed; relayed as it came")
        return None


def _answer_tokens(settings: RecallSettings, window: Window | None) -> int:
    """The most one answer returns: the setting, and never more than a quarter of the window
    (the recalled text joins a prompt that was compacted to fit)."""
    if window is None:
        return settings.max_tokens
    return max(100, min(settings.max_tokens, window.tokens // 4))


async def recalled(
    ctx: RequestContext,
    upstream: UpstreamSettings,
    wire: WireFormat,
    forwarded: Forwarded,
    first: Outcome,
) -> Outcome:
    """The loop over a reply read whole, for ``forwarded``, through ``upstream`` and the
    client's ``send``; its figures go on ``ctx``."""

    async def post(body: bytes, round_headers: list[tuple[bytes, bytes]]) -> Outcome:
        handling = ReplyHandling(
            wire, round_headers, hold=ROUND_HOLD, hold_limit=RECALL_HOLD, hold_failures=True
        )
        return await post_upstream(ctx, upstream, body, handling, listed=forwarded.listed)

    async def relay(body: bytes, final_headers: list[tuple[bytes, bytes]]) -> Outcome:
        handling = ReplyHandling(wire, final_headers)
        return await post_upstream(ctx, upstream, body, handling, listed=forwarded.listed)

    async def deliver(held: HeldReply, final_headers: list[tuple[bytes, bytes]]) -> int:
        return await send_held(ctx.send, held, final_headers)

    delivered, stats = await settle(ctx, wire, forwarded, first, Rounds(post, deliver, relay))
    ctx.recall = stats
    return delivered
