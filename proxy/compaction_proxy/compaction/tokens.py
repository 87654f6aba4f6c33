"""Token counting the way OpenAI bills chat completions.

The envelope follows OpenAI's published accounting for chat models: every message costs
``TOKENS_PER_MESSAGE`` (3) plus the tokens of its role and content, a ``name`` costs its tokens
plus 1, and the reply is primed with ``REPLY_PRIMING`` (3) tokens.  On top of that we count
what OpenAI does not document precisely, as documented approximations:

* content part lists: text/refusal parts as text, ``image_url`` parts by :mod:`.images`;
  any other part (audio, files) by its JSON, through the 4-characters estimate when large so a
  multi-megabyte base64 blob is never pushed through the BPE;
* assistant ``tool_calls``: function name + arguments + ``TOKENS_PER_TOOL_CALL``; legacy
  ``function_call`` likewise; ``tool_call_id`` is not counted (the model does not see it);
* any other field: strings as text, other JSON values as their serialized text (over-counting
  is the safe side of a budget);
* the ``tools`` schema: see :mod:`.tool_schema`.

Per-message counts are cached by a key of the message's canonical bytes
(:class:`~.token_cache.CountCache`, :func:`~.canonical.cache_key`), so a new turn costs only its
new messages; :meth:`EnvelopeTokenizer.count_message_batch` does a whole request with one cache
lock.  The tools schema's count is cached by a key of its canonical bytes too, and the counts of
short strings that repeat on every message (roles, function names) are memoized.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import tiktoken

from .canonical import cache_key, canonical_bytes
from .images import ImagePricing
from .token_cache import CountCache
from .tool_schema import count_tools_tokens

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3
LARGE_BLOB_BYTES = 4096
"""Above this size a non-text part or field is estimated at 4 bytes per token, not encoded."""

_SKIPPED_FIELDS = frozenset(
    {"role", "content", "name", "tool_calls", "function_call", "tool_call_id"}
)
_SHORT_TEXT = 64
"""Strings up to this length may be memoized (roles, names): they repeat on every message."""
_SHORT_MEMO_SIZE = 4096
_TOOLS_MEMO_SIZE = 64


@runtime_checkable
class Tokenizer(Protocol):
    """What the compaction core needs from a tokenizer.

    Implementations must be deterministic; ``count_message`` may use ``canonical`` (the
    message's canonical JSON bytes, when the caller already has them) as a cache key.
    """

    @property
    def name(self) -> str:
        """Identifies the counting scheme (encoding name or estimator), for reports."""
        ...

    @property
    def reply_priming(self) -> int:
        """Tokens added once per request for the assistant reply header."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_message(self, message: Mapping[str, Any], canonical: bytes | None = None) -> int:
        """Tokens of one message including its envelope overhead."""
        ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        """Tokens of the request's tool definitions."""
        ...


class EnvelopeTokenizer(ABC):
    """Shared envelope rules and cache; subclasses only say how text becomes tokens."""

    def __init__(
        self, *, cache_size: int = 65_536, image_pricing: ImagePricing | None = None
    ) -> None:
        self.cache = CountCache(cache_size)
        self.image_pricing = image_pricing or ImagePricing()
        self._short_counts: dict[str, int] = {}
        self._tools_counts: dict[int, int] = {}

    @property
    @abstractmethod
    def name(self) -> str:
        """Identifies the counting scheme."""

    @abstractmethod
    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""

    @property
    def reply_priming(self) -> int:
        """OpenAI primes every reply with ``<|start|>assistant<|message|>``."""
        return REPLY_PRIMING

    def count_message(self, message: Mapping[str, Any], canonical: bytes | None = None) -> int:
        """Tokens of one message, served from the cache when this exact message was seen."""
        data = canonical if canonical is not None else canonical_bytes(message)
        key = cache_key(data)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        count = self._count_uncached(message)
        self.cache.put(key, count)
        return count

    def count_message_batch(
        self, messages: Sequence[Mapping[str, Any]], canonicals: Sequence[bytes]
    ) -> list[int]:
        """:meth:`count_message` for many messages (with their canonical bytes) at once.

        The same counts, with one cache lock for the lookups and one for the stores.  A
        message repeated within the batch is counted once.
        """
        keys = [cache_key(data) for data in canonicals]
        found = self.cache.get_many(keys)
        if None not in found:
            return found  # type: ignore[return-value]  # no None left
        new: dict[int, int] = {}
        counts: list[int] = []
        for message, key, count in zip(messages, keys, found, strict=True):
            if count is None:
                count = new.get(key)
                if count is None:
                    count = new[key] = self._count_uncached(message)
            counts.append(count)
        self.cache.put_many(list(new.items()))
        return counts

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a whole message list including reply priming (the prompt total)."""
        return sum(self.count_message(m) for m in messages) + self.reply_priming

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        """Tokens of the tool definitions (see :mod:`.tool_schema`), cached by their bytes.

        Clients send the same ``tools`` on every turn; rendering and encoding them costs far
        more than serializing them for the key.
        """
        if not tools:
            return count_tools_tokens(tools, self.count_text)
        try:
            key = cache_key(canonical_bytes(list(tools)))
        except TypeError:  # not JSON-serializable: count without the cache
            return count_tools_tokens(tools, self.count_text)
        count = self._tools_counts.get(key)
        if count is None:
            count = count_tools_tokens(tools, self.count_text)
            if len(self._tools_counts) >= _TOOLS_MEMO_SIZE:
                self._tools_counts.clear()
            self._tools_counts[key] = count
        return count

    def _count_short(self, text: str) -> int:
        """``count_text`` memoized for short strings (roles, function names)."""
        count = self._short_counts.get(text)
        if count is None:
            count = self.count_text(text)
            if len(text) <= _SHORT_TEXT:
                if len(self._short_counts) >= _SHORT_MEMO_SIZE:
                    self._short_counts.clear()
                self._short_counts[text] = count
        return count

    def _count_uncached(self, message: Mapping[str, Any]) -> int:
        total = TOKENS_PER_MESSAGE
        role = message.get("role")
        if isinstance(role, str):
            total += self._count_short(role)
        name = message.get("name")
        if isinstance(name, str):
            total += self._count_short(name) + TOKENS_PER_NAME
        total += self._count_content(message.get("content"))
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                total += self._count_tool_call(call)
        function_call = message.get("function_call")
        if function_call is not None and isinstance(function_call, Mapping):
            total += self._count_function(function_call)
        for key, value in message.items():
            if key not in _SKIPPED_FIELDS and value is not None:
                total += self._count_value(value)
        return total

    def _count_content(self, content: object) -> int:
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, list):
            return 0 if content is None else self._count_value(content)
        total = 0
        for part in content:
            if type(part) is not dict and not isinstance(part, Mapping):
                total += self._count_value(part)
                continue
            kind = part.get("type")
            if kind in ("text", "refusal", "input_text", "output_text"):
                text = part.get(kind) if kind == "refusal" else part.get("text")
                total += self.count_text(text) if isinstance(text, str) else 0
            elif kind == "image_url":
                total += self.image_pricing.tokens_for_part(part)
            else:
                total += self._count_value(part)
        return total

    def _count_tool_call(self, call: object) -> int:
        if type(call) is not dict and not isinstance(call, Mapping):
            return self._count_value(call)
        function = call.get("function")
        if type(function) is not dict and not isinstance(function, Mapping):
            function = call.get("custom")
        if type(function) is dict or isinstance(function, Mapping):
            return self._count_function(function) + TOKENS_PER_TOOL_CALL
        return self._count_value(call)

    def _count_function(self, function: Mapping[str, Any]) -> int:
        total = 0
        name = function.get("name")
        if isinstance(name, str):
            total += self._count_short(name)
        for key in ("arguments", "input"):
            value = function.get(key)
            if isinstance(value, str):
                total += self.count_text(value)
        return total

    def _count_value(self, value: object) -> int:
        text = value if isinstance(value, str) else canonical_bytes(value).decode("utf-8")
        if len(text) > LARGE_BLOB_BYTES:
            return _estimate(text)
        return self.count_text(text)


def _estimate(text: str) -> int:
    """Four characters per token, rounded up (the character estimator's rule)."""
    return (len(text) + 3) // 4


class CharacterEstimatorTokenizer(EnvelopeTokenizer):
    """Four characters a token: the fallback when no encoding file is available.

    It keeps OpenAI's envelope (per-message overhead, names, priming, image tiles), so budgets
    computed with it stay in the same ballpark as real counts.
    """

    @property
    def name(self) -> str:
        return "char-estimator"

    def count_text(self, text: str) -> int:
        return _estimate(text)


class TiktokenTokenizer(EnvelopeTokenizer):
    """Exact text counts with a tiktoken encoding (loaded offline by :mod:`.encodings`).

    ``counter``: a faster function giving the same counts as the encoding (see
    :func:`.fast_bpe.exact_counter`, which checks that before handing one out); a string it
    refuses is counted by tiktoken.
    """

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        *,
        cache_size: int = 65_536,
        image_pricing: ImagePricing | None = None,
        counter: Callable[[str], int] | None = None,
    ) -> None:
        super().__init__(cache_size=cache_size, image_pricing=image_pricing)
        self.encoding = encoding
        self.counter = counter
        core_bpe = getattr(encoding, "_core_bpe", None)
        self._core_encode: Callable[[str], list[int]] | None = getattr(
            core_bpe, "encode_ordinary", None
        )

    @property
    def name(self) -> str:
        return str(self.encoding.name)

    def count_text(self, text: str) -> int:
        counter = self.counter
        if counter is not None:
            try:
                return counter(text)
            except (UnicodeEncodeError, ValueError):
                pass  # lone surrogates: tiktoken's wrapper below repairs them
        # encode_ordinary: special-token text in user content is plain text, never an error.
        # The Rust core is called directly (tiktoken's wrapper adds a call per string); a
        # string the core rejects (lone surrogates) goes through the wrapper, which fixes it.
        core = self._core_encode
        if core is not None:
            try:
                return len(core(text))
            except UnicodeEncodeError:
                pass
        return len(self.encoding.encode_ordinary(text))
