"""Sticky compaction: what the pipeline made of a prefix, found again on the next turn.

Clients resend the whole history every turn. Without memory the proxy would re-summarize (a
summarizer call per turn) and re-cut (a new prefix per turn, so the upstream prompt cache is
lost every time). A checkpoint records the compacted form of the messages `m_1..m_k`; the next
request that starts with the same messages continues from it, so the forwarded prefix stays
byte-identical until the next compaction. :class:`Checkpoints` finds the longest one in one
store round trip over the chain (:mod:`._keys`) and stores the next; a store failure degrades
to "no checkpoint", except for the checkpoints the store refused to write: those are held in
this process (:mod:`._held`) and found there, so a full disk does not make every request pay
the summarizer again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._breaker import StoreMarkedDown
from ._contract import Checkpoint, CheckpointStore, StoreUnavailable, check_messages
from ._held import HeldCheckpoints
from ._keys import Message, chain, could_have_checkpoint, leading_system_count

log = logging.getLogger("compaction_proxy.checkpoints")

FOLDED_TOKENS = "folded_tokens"
"""Meta key: how many tokens fewer a checkpoint's messages have than the client messages they
stand for, so a hit can report the client's count without counting them
(compaction_proxy/engine/_hit_report.py)."""
OFF_LOOP_MESSAGES = 2_000
"""From this many messages the chain is hashed on a worker thread."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """The effective view of one request and where it came from."""

    messages: list[Message]  # system block + checkpoint messages + the verbatim rest
    system_count: int
    hashes: list[str]  # chain over the request's non-system messages
    covered: int  # how many of those messages the checkpoint stands for (0: none)
    checkpoint: Checkpoint | None
    store_error: str | None = None
    held: bool = False
    """The checkpoint is one the store refused to write, held in this process."""
    asked: bool = False
    """The store was asked (a request that cannot have a checkpoint never asks it)."""

    @property
    def hit(self) -> bool:
        return self.checkpoint is not None

    @property
    def folded_tokens(self) -> int | None:
        """The checkpoint's :data:`FOLDED_TOKENS`; None on a miss or when it has none (it was
        stored before the figure existed, or its meta is not ours)."""
        if self.checkpoint is None:
            return None
        value = self.checkpoint.meta.get(FOLDED_TOKENS)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 40:
            return value
        return None


HELD_NOTE = "kept in this process's memory only"
"""What a save the store refused says it did instead (:mod:`._held`)."""


class Checkpoints:
    """Finds and stores checkpoints; a store failure degrades to "no checkpoint", or to the
    checkpoints held in this process when the store refused to write them (:mod:`._held`)."""

    def __init__(
        self, store: CheckpointStore, ttl_seconds: int, held: HeldCheckpoints | None = None
    ) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.held = held if held is not None else HeldCheckpoints()

    async def lookup(
        self, namespace: str, messages: Sequence[Message], *, chained: Sequence[str] = ()
    ) -> Lookup:
        """The effective view of ``messages``; ``chained``: the leading chain hashes of its
        non-system messages, known from the conversation's previous request (:func:`chain`)."""
        system_count = leading_system_count(messages)
        rest = messages[system_count:]
        # A long conversation's chain (a serialization and a hash per message) is computed
        # off the event loop, like the rest of a large request's work.
        if len(rest) - len(chained) >= OFF_LOOP_MESSAGES:
            hashes = await asyncio.to_thread(chain, namespace, rest, chained)
        else:
            hashes = chain(namespace, rest, chained)
        found: tuple[int, Checkpoint] | None = None
        error: str | None = None
        held = False
        asked = bool(hashes) and could_have_checkpoint(rest)
        if asked:
            try:
                found = await self.store.find_longest(namespace, hashes)
            except StoreUnavailable as exc:
                # Details (paths, hosts) go to the log; the client's header says only what.
                # A store the breaker marked down was logged once, when it was marked.
                error = f"checkpoint store unavailable ({self.store.name}); no checkpoint used"
                log.log(_level(exc), "%s: %s", error, exc)
            found, held = self._with_held(namespace, hashes, found)
        if found is None:
            return Lookup(list(messages), system_count, hashes, 0, None, error, asked=asked)
        if error is not None and held:
            error = f"checkpoint store unavailable ({self.store.name}); a checkpoint {HELD_NOTE}"
        covered, checkpoint = found  # 1-based: how many messages the checkpoint stands for
        effective = [*messages[:system_count], *checkpoint.messages, *rest[covered:]]
        return Lookup(effective, system_count, hashes, covered, checkpoint, error, held, asked)

    def _with_held(
        self, namespace: str, hashes: Sequence[str], found: tuple[int, Checkpoint] | None
    ) -> tuple[tuple[int, Checkpoint] | None, bool]:
        """``found`` or, when longer, the checkpoint held here for the same chain (and whether
        it is the held one)."""
        kept = self.held.find_longest(namespace, hashes)
        if kept is not None and (found is None or kept[0] > found[0]):
            return kept, True
        return found, False

    async def find_in(self, namespace: str, lookup: Lookup) -> Lookup | None:
        """The longest checkpoint for ``lookup``'s request in another ``namespace`` (prepared
        summaries, :mod:`compaction_proxy.engine._prepare`), reusing its chain: the chain starts
        from the request's own namespace, so the keys are the same request's in both.

        ``None`` on a miss or a store failure (logged): a missing prepared summary only means
        the request summarizes as it would without one.
        """
        if not lookup.hashes:
            return None
        found: tuple[int, Checkpoint] | None = None
        try:
            found = await self.store.find_longest(namespace, lookup.hashes)
        except StoreUnavailable as exc:
            log.log(_level(exc), "prepared checkpoint lookup failed: %s", exc)
        found, _ = self._with_held(namespace, lookup.hashes, found)
        if found is None or found[0] <= lookup.covered:
            return None
        covered, checkpoint = found
        # `lookup.messages` is the system block, the ordinary checkpoint (if any) standing for
        # the first `lookup.covered` client messages, then the client's messages verbatim.
        system = lookup.system_count
        stand_in = len(lookup.checkpoint.messages) if lookup.checkpoint is not None else 0
        tail = lookup.messages[system + stand_in + (covered - lookup.covered) :]
        effective = [*lookup.messages[:system], *checkpoint.messages, *tail]
        return Lookup(effective, system, lookup.hashes, covered, checkpoint)

    async def save(
        self,
        namespace: str,
        lookup: Lookup,
        compacted: Sequence[Message],
        meta: dict[str, Any],
        *,
        ttl_seconds: int | None = None,
    ) -> str | None:
        """Store the compacted form of the whole request under its last chain hash.

        Returns an error text when the store failed (the request goes on regardless); the
        checkpoint is then held in this process (:mod:`._held`) and the text says so.
        """
        if not lookup.hashes:
            return None
        # The client's system block is kept in place by every strategy, so it has the same
        # length in the output; a summary placed as a system message comes after it and
        # belongs to the checkpoint.
        checkpoint = Checkpoint(
            messages=tuple(compacted[lookup.system_count :]), created_at=time.time(), meta=meta
        )
        issue = check_messages(checkpoint.messages)
        if issue is not None:
            # Read back it would be a foreign value (deleted on sight): not worth the write.
            log.warning("checkpoint not stored: %s", issue)
            return None
        ttl = self.ttl_seconds if ttl_seconds is None else ttl_seconds
        try:
            await self.store.put(namespace, lookup.hashes[-1], checkpoint, ttl)
        except StoreUnavailable as exc:
            # Logged at DEBUG: the flow reports the path once, when it starts and when it ends
            # (compaction_proxy/engine/_degraded.py); the breaker logs each time it opens.
            log.debug("checkpoint not stored (%s): %s", self.store.name, exc)
            error = f"checkpoint not stored ({self.store.name} unavailable)"
            if self.held.put(namespace, lookup.hashes[-1], checkpoint, ttl):
                error = f"{error}; {HELD_NOTE}"
            return error
        return None


def _level(exc: StoreUnavailable) -> int:
    """A call skipped because the store is marked down is routine until it is up again."""
    return logging.DEBUG if isinstance(exc, StoreMarkedDown) else logging.WARNING
