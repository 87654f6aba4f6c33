"""A cheap upper bound of a request's prompt tokens, for deciding that nothing can fire.

Most requests of an agent session are far below every trigger, yet the full path builds the
view, groups every message and evaluates every strategy's trigger before it finds that out.
An upper bound is enough to skip all of that when it is below the point where the pipeline
would first fire, and it costs little:

* a message counted before (the count cache, keyed by its canonical bytes) contributes its
  exact count: in an agent session that is every message but the newest step;
* any other message contributes its canonical JSON length in bytes plus the envelope's 3
  tokens. A BPE token stands for at least one byte of the UTF-8 text it encodes, the
  canonical form holds every counted string in full, JSON-escaped (never shorter), and values
  counted as their JSON verbatim; the other fixed costs (1 a name, 3 a tool call) are
  outweighed by their keys' bytes (``"name":``, a call's ``{"function":{...}}``). So the
  bound never undercounts (:func:`message_bound`, checked by a property test);
* except an image: it is priced by its tiles (765 tokens for a remote URL a few bytes long),
  so a message with an ``image_url`` part is counted exactly instead.

Uncached messages up to ``count_bytes`` are counted exactly (and cached) rather than bounded,
so a request that adds one step to a known conversation gets its exact count for the price of
that step. The tools' count is the tokenizer's own (cached per tools schema).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .canonical import cache_key, canonical_bytes
from .tokens import TOKENS_PER_MESSAGE, EnvelopeTokenizer

_IMAGE_PART = b'"image_url"'
"""Present in the canonical bytes of any message with an image part (as a JSON string token
it cannot come from inside a string value, where the quotes would be escaped)."""


@dataclass(frozen=True, slots=True)
class PromptBound:
    """An upper bound of the prompt's tokens (messages + tools + reply priming)."""

    tokens: int
    exact: bool
    """Every message was counted (from the cache or now): ``tokens`` is the prompt's count."""
    bounded: int
    """Messages bounded by their byte length rather than counted."""
    counts: tuple[int, ...] = ()
    """Each message's own count (after the ``known`` ones), when asked for and ``exact``."""


def message_bound(data: bytes) -> int | None:
    """The bound for one message from its canonical bytes; ``None`` when it has an image."""
    if _IMAGE_PART in data:
        return None
    return len(data) + TOKENS_PER_MESSAGE


def prompt_bound(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tokenizer: EnvelopeTokenizer,
    *,
    count_bytes: int = 0,
    known: tuple[int, int] = (0, 0),
    itemized: bool = False,
) -> PromptBound:
    """An upper bound of the prompt tokens of ``messages`` and ``tools``.

    ``count_bytes``: uncached messages are counted exactly (and cached) while their canonical
    bytes add up to at most this; the rest are bounded by their length. A message with an
    image is always counted.

    ``known``: ``(n, tokens)``, the exact count of the first ``n`` messages with this
    tokenizer, known without looking at them (the conversation's previous request,
    compaction_proxy/engine/_known.py); only the messages after them are serialized.
    ``itemized``: also return those messages' own counts (:attr:`PromptBound.counts`).
    """
    skip, total = known
    rest = messages[skip:] if skip else messages
    datas = [canonical_bytes(message) for message in rest]
    found = tokenizer.cache.get_many([cache_key(data) for data in datas])
    total += tokenizer.count_tools(tools) + tokenizer.reply_priming
    budget = count_bytes
    bounded = 0
    counts: list[int] = []
    for message, data, count in zip(rest, datas, found, strict=True):
        if count is None:
            bound = message_bound(data)
            if bound is not None and len(data) > budget:
                total += bound
                bounded += 1
                continue
            if bound is not None:
                budget -= len(data)
            count = tokenizer.count_message(message, data)
        total += count
        if itemized:
            counts.append(count)
    return PromptBound(total, bounded == 0, bounded, tuple(counts) if not bounded else ())
