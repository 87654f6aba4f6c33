"""Prompt caching the way Anthropic documents it, so a test can measure cache-read share.

- A block with ``cache_control`` is a *breakpoint*: the prefix up to and including it (tools ->
  system -> messages) is written to the cache, unless it is shorter than the minimum cacheable
  length (1,024 tokens by default, Sonnet's; ``cache_min_tokens`` changes it).
- A later request reads from the cache when its prefix up to some block boundary is identical
  to a prefix written before. Like the API, the fake checks each breakpoint and up to 20 block
  boundaries before it, and reads the longest prefix it finds. Identity is canonical content
  (see :mod:`tests.fakes.messages.prompt`) plus the model, and the messages part also depends on
  ``thinking`` and ``tool_choice``, whose changes invalidate cached messages on the real API.
- Usage: ``cache_read_input_tokens`` is the longest prefix read; ``cache_creation_input_tokens``
  what lies between it and the last breakpoint (split by each breakpoint's ``ttl`` into
  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``);
  ``input_tokens`` the rest, after the last breakpoint. Their sum is the whole prompt.

The fake's entries never expire: there is no clock in it (a test clears the cache through
``POST /_control {"clear_cache": true}`` or a reset). Refused requests write nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tests.fakes.messages.prompt import Prompt

LOOKBACK = 20
"""How many block boundaries before a breakpoint the API checks for an earlier entry."""

MAX_BREAKPOINTS = 4
DEFAULT_MIN_TOKENS = 1024


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_5m: int
    cache_creation_1h: int

    @property
    def cache_creation_input_tokens(self) -> int:
        return self.cache_creation_5m + self.cache_creation_1h

    def as_usage(self) -> dict[str, object]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m,
                "ephemeral_1h_input_tokens": self.cache_creation_1h,
            },
        }


class PromptCache:
    """Prefix entries written at breakpoints; bounded, the oldest go first."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, None] = OrderedDict()

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def account(self, prompt: Prompt, min_tokens: int, write: bool = True) -> CacheUsage:
        """The usage split of ``prompt``; with ``write``, its breakpoints are cached too."""
        breakpoints = prompt.breakpoints()
        read_end = -1
        for point in breakpoints:
            for index in range(point, max(-1, point - LOOKBACK), -1):
                if index <= read_end:
                    break
                if (
                    prompt.prefix_tokens[index] >= min_tokens
                    and prompt.cache_chain[index] in self._entries
                ):
                    read_end = index
                    break
        read = prompt.prefix_tokens[read_end] if read_end >= 0 else 0
        created = {"5m": 0, "1h": 0}
        covered = read_end
        for point in breakpoints:
            if point <= covered or prompt.prefix_tokens[point] < min_tokens:
                continue
            before = prompt.prefix_tokens[covered] if covered >= 0 else 0
            ttl = prompt.units[point].ttl or "5m"
            created[ttl if ttl in created else "5m"] += prompt.prefix_tokens[point] - before
            covered = point
            if write:
                self._store(prompt.cache_chain[point])
        if write and read_end >= 0:
            self._entries.move_to_end(prompt.cache_chain[read_end])
        creation = created["5m"] + created["1h"]
        return CacheUsage(prompt.total - read - creation, read, created["5m"], created["1h"])

    def _store(self, key: bytes) -> None:
        self._entries[key] = None
        self._entries.move_to_end(key)
        while len(self._entries) > self.LIMIT:
            self._entries.popitem(last=False)
