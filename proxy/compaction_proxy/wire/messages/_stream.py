"""What a whole Messages SSE body adds up to: the message its events stream.

The recall loop holds a reply to a request that offered its tool until the reply has ended
(compaction_proxy/wire/messages/_recall.py), then reads it whole: which blocks it streamed,
and each block as the API would have sent it in a JSON reply, so that the model's turn can be
sent back to it. A stream is ``message_start`` (the message, ``content`` empty), per block
``content_block_start`` (the block with empty text, thinking or ``input: {}``), its
``content_block_delta`` events (``text_delta``, ``input_json_delta`` pieces of the input's JSON
text, ``thinking_delta``, one ``signature_delta``, ``citations_delta``) and
``content_block_stop``, then ``message_delta`` and ``message_stop``; ``ping`` and ``error``
may come between them.

The body is read as events by :mod:`compaction_proxy.wire.sse`: each keeps its own bytes, so a
reply given back without some blocks is the upstream's bytes but for the events that change.
What does not parse (a comment, data that is not a JSON object, an event of a type the API
added later) is an event like any other: it is skipped by :func:`accumulate` and kept, byte
for byte, by whoever rewrites the stream.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..sse import Event

__all__ = ["Accumulated", "accumulate", "index_of"]


def index_of(event: Event) -> int | None:
    """The content block an event is about (its top-level ``index``), or None."""
    index = event.data.get("index") if isinstance(event.data, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


@dataclass(slots=True)
class _Block:
    """One streamed block as its start event gave it, and what its deltas added."""

    start: dict[str, Any]
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    json: list[str] = field(default_factory=list)
    citations: list[Any] = field(default_factory=list)
    signature: str | None = None

    def add(self, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        block = self.start.get("type")
        if kind == "text_delta" and block == "text":
            self.text.append(_text(delta.get("text")))
        elif kind == "input_json_delta" and "input" in self.start:
            self.json.append(_text(delta.get("partial_json")))
        elif kind == "thinking_delta" and block == "thinking":
            self.thinking.append(_text(delta.get("thinking")))
        elif kind == "signature_delta" and block == "thinking":
            self.signature = _text(delta.get("signature"))
        elif kind == "citations_delta" and block == "text" and "citation" in delta:
            self.citations.append(delta["citation"])

    @property
    def input_text(self) -> str:
        """The input's JSON text as the model wrote it (the start's ``input`` when no delta
        came: a call without arguments)."""
        written = "".join(self.json)
        return written if written else orjson.dumps(self.start.get("input", {})).decode()

    def whole(self) -> dict[str, Any]:
        """The block as a JSON reply holds it. An input whose JSON text does not parse (a
        reply cut at its output limit) keeps the start's ``input``; :attr:`input_text` still
        says what the model wrote."""
        block = dict(self.start)
        if self.text:
            block["text"] = _text(block.get("text")) + "".join(self.text)
        if self.thinking:
            block["thinking"] = _text(block.get("thinking")) + "".join(self.thinking)
        if self.signature is not None:
            block["signature"] = self.signature
        if self.citations:
            before = block.get("citations")
            block["citations"] = [*(before if isinstance(before, list) else ()), *self.citations]
        if self.json:
            with contextlib.suppress(orjson.JSONDecodeError):
                block["input"] = orjson.loads("".join(self.json))
        return block


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class Accumulated:
    """What a whole stream adds up to: its blocks by index (in the order they started), with
    the JSON text of each block's input, and whether the stream was a message that ended
    (``message_start`` ... ``message_stop``, no ``error``)."""

    blocks: tuple[tuple[int, dict[str, Any], str], ...]
    complete: bool


def accumulate(body: list[Event]) -> Accumulated:
    """The blocks of a stream, each put together as the SDKs put it together. An event that
    is not one of the API's (no JSON, an unknown type, a delta for a block that never
    started, a second start of one index) is passed over."""
    started = ended = failed = False
    blocks: dict[int, _Block] = {}
    for event in body:
        kind = event.kind
        data = event.data if isinstance(event.data, dict) else {}
        if kind == "message_start":
            message = data.get("message")
            # A message that opens with content is not a stream this reads.
            failed = failed or not isinstance(message, dict) or bool(message.get("content"))
            started = True
        elif kind == "message_stop":
            ended = True
        elif kind == "error":
            failed = True
        elif kind == "content_block_start":
            index, block = index_of(event), data.get("content_block")
            if index is not None and index not in blocks and isinstance(block, dict):
                blocks[index] = _Block(block)
        elif kind == "content_block_delta":
            index, delta = index_of(event), data.get("delta")
            target = blocks.get(index) if index is not None else None
            if target is not None and isinstance(delta, dict):
                target.add(delta)
    whole = tuple((index, block.whole(), block.input_text) for index, block in blocks.items())
    return Accumulated(whole, started and ended and not failed)
