"""A Messages request as the fake sees it: a flat list of units, each counted and digested.

Anthropic renders a request in the order tools -> system -> messages, and both prompt caching
and thinking-block binding are defined on prefixes of that order. So the fake turns every
request into one list of *units*: each tool definition, each system text block, each content
block of each message (a string ``content`` is one text block). A unit knows its path in the
request (``tools.0``, ``system.1``, ``messages.3.content.0``, the form the API's errors use),
its token count, and a digest of its canonical content.

Token counting is the fake's own rule, not Claude's (no public tokenizer exists): o200k_base
over the unit's text (a text block's ``text``, a thinking block's ``thinking``, a tool result's
text parts, a tool use's name plus its JSON input, a tool definition's JSON) through the chat
fake's :class:`~tests.fakes.upstream.TokenCounter`, plus 3 tokens for the first unit of every
message (its role), and a flat 1,600 tokens for an image or a non-text document. The same
request always gets the same count.

Canonical content: the block without ``cache_control`` and without ``null`` fields, with sorted
keys, so a breakpoint moved from one block to another, a string ``content`` turned into one text
block (Claude Code does both between turns), or another JSON key order is the same prompt, as it
is for the real API. Any change of text, ids or inputs is a different prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from tests.fakes.upstream import TokenCounter

ROLE_TOKENS = 3
"""What the fake charges per message for its role, on the message's first unit."""

MEDIA_TOKENS = 1_600
"""An image (or a non-text document): about what Anthropic bills a 1092x1092 image."""

DIGEST_SIZE = 16


@dataclass(frozen=True)
class Unit:
    """One tool, system block or message content block, in prompt order."""

    path: str
    section: str  # "tools" | "system" | "messages"
    message: int | None  # the index in ``messages``, for message units
    block: int | None  # the index in the message's content (or in tools/system)
    role: str | None
    kind: str  # the block's ``type`` ("tool" for a tool definition)
    tokens: int
    digest: bytes
    ttl: str | None  # "5m" / "1h" when the block carries ``cache_control``
    raw: Any = field(repr=False, compare=False, default=None)


@dataclass(frozen=True)
class Prompt:
    """A request's units with running totals and two digest chains.

    ``content_chain[i]`` digests units ``0..i`` alone (the *prefix* thinking blocks are bound to:
    system, tools, earlier messages); ``cache_chain[i]`` also folds in what invalidates Anthropic's
    cache without being content (the model; ``thinking`` and ``tool_choice`` before the messages).
    """

    units: tuple[Unit, ...]
    prefix_tokens: tuple[int, ...]
    content_chain: tuple[bytes, ...]
    cache_chain: tuple[bytes, ...]

    @property
    def total(self) -> int:
        return self.prefix_tokens[-1] if self.prefix_tokens else 0

    def tokens_before(self, index: int) -> int:
        return self.prefix_tokens[index - 1] if index > 0 else 0

    def content_before(self, index: int) -> bytes:
        """The binding digest of everything before unit ``index``."""
        return self.content_chain[index - 1] if index > 0 else EMPTY

    def index_of(self, path: str) -> int:
        for index, unit in enumerate(self.units):
            if unit.path == path:
                return index
        raise KeyError(path)

    def breakpoints(self) -> list[int]:
        return [i for i, unit in enumerate(self.units) if unit.ttl is not None]


EMPTY = hashlib.blake2b(b"", digest_size=DIGEST_SIZE).digest()


def canonical(block: Any) -> Any:
    """The block as the prompt renders it: no ``cache_control``, no nulls, strings as text."""
    if isinstance(block, dict):
        return {
            key: canonical(value)
            for key, value in block.items()
            if key != "cache_control" and value is not None
        }
    if isinstance(block, list):
        return [canonical(item) for item in block]
    return block


def canonical_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(canonical(value), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # nested past orjson's depth, huge integers
        return repr(value).encode()


def content_blocks(content: Any) -> list[Any]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def system_blocks(system: Any) -> list[Any]:
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system) if isinstance(system, list) else []


def _ttl(block: Any) -> str | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl")
    return ttl if isinstance(ttl, str) else "5m"


class Counter:
    """Token counts of blocks by the fake's rule (see the module docstring)."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.text = (counter or TokenCounter()).text

    def json(self, value: Any) -> int:
        return self.text(canonical_bytes(value).decode("utf-8", "replace"))

    def block(self, block: Any) -> int:
        if not isinstance(block, dict):
            return self.json(block)
        kind = block.get("type")
        if kind == "text":
            return self.text(str(block.get("text", "")))
        if kind == "thinking":
            return self.text(str(block.get("thinking", "")))
        if kind == "redacted_thinking":
            return self.text(str(block.get("data", "")))
        if kind == "tool_use":
            return self.text(str(block.get("name", ""))) + self.json(block.get("input", {}))
        if kind == "tool_result":
            return sum(self.block(part) for part in content_blocks(block.get("content", "")))
        if kind == "image":
            return MEDIA_TOKENS
        if kind == "document":
            source = block.get("source")
            if isinstance(source, dict) and source.get("type") == "text":
                return self.text(str(source.get("data", "")))
            return MEDIA_TOKENS
        return self.json(block)


def _chain(previous: bytes, piece: bytes) -> bytes:
    return hashlib.blake2b(previous + piece, digest_size=DIGEST_SIZE).digest()


def iter_units(payload: dict[str, Any], counter: Counter) -> Iterable[Unit]:
    for index, tool in enumerate(payload.get("tools") or []):
        yield Unit(
            f"tools.{index}",
            "tools",
            None,
            index,
            None,
            "tool",
            counter.json(tool),
            _unit_digest("tools", False, tool),
            _ttl(tool),
            tool,
        )
    for index, block in enumerate(system_blocks(payload.get("system"))):
        yield Unit(
            f"system.{index}",
            "system",
            None,
            index,
            None,
            str(block.get("type")) if isinstance(block, dict) else "text",
            counter.block(block),
            _unit_digest("system", False, block),
            _ttl(block),
            block,
        )
    for m_index, message in enumerate(payload.get("messages") or []):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        for b_index, block in enumerate(content_blocks(content)):
            yield Unit(
                f"messages.{m_index}.content.{b_index}",
                "messages",
                m_index,
                b_index,
                role if isinstance(role, str) else None,
                str(block.get("type")) if isinstance(block, dict) else "?",
                counter.block(block),
                _unit_digest(str(role), b_index == 0, block),
                _ttl(block),
                block,
            )


def _unit_digest(role: str, first: bool, block: Any) -> bytes:
    """A unit's identity: its role and message boundary count, as its content does."""
    head = f"{role}|{int(first)}|".encode()
    return hashlib.blake2b(head + canonical_bytes(block), digest_size=DIGEST_SIZE).digest()


def response_unit_digests(blocks: Sequence[dict[str, Any]]) -> list[bytes]:
    """Digests of an assistant reply's blocks as the client will send them back."""
    return [_unit_digest("assistant", index == 0, block) for index, block in enumerate(blocks)]


def build_prompt(
    payload: dict[str, Any], counter: Counter, skip: frozenset[str] = frozenset()
) -> Prompt:
    """The request's units, without those at ``skip`` paths (thinking the API dropped)."""
    units = []
    charged: set[int] = set()
    for unit in iter_units(payload, counter):
        if unit.path in skip:
            continue
        if unit.message is not None and unit.message not in charged:
            charged.add(unit.message)  # the role, on the message's first block still sent
            unit = replace(unit, tokens=unit.tokens + ROLE_TOKENS)
        units.append(unit)
    model = payload.get("model")
    cache = hashlib.blake2b(f"model:{model}".encode(), digest_size=DIGEST_SIZE).digest()
    content = EMPTY
    totals: list[int] = []
    content_chain: list[bytes] = []
    cache_chain: list[bytes] = []
    running = 0
    salted = False
    for unit in units:
        if unit.section == "messages" and not salted:
            # Changing thinking or tool_choice invalidates the cached messages, not tools/system.
            salt = {"thinking": payload.get("thinking"), "tool_choice": payload.get("tool_choice")}
            cache = _chain(cache, canonical_bytes(salt))
            salted = True
        running += unit.tokens
        content = _chain(content, unit.digest)
        cache = _chain(cache, unit.digest)
        totals.append(running)
        content_chain.append(content)
        cache_chain.append(cache)
    return Prompt(tuple(units), tuple(totals), tuple(content_chain), tuple(cache_chain))


def extend_chain(start: bytes, digests: Iterable[bytes]) -> list[bytes]:
    """The content chain continued over ``digests`` (a reply's blocks after the request)."""
    out = []
    current = start
    for digest in digests:
        current = _chain(current, digest)
        out.append(current)
    return out
