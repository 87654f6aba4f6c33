"""The recall tool on Anthropic's Messages API: the Messages side of the recall loop
(:class:`~compaction_proxy.wire.recall.RecallWire`, docs/messages.md "Recall").

- **Declared.** A request declares tools when its ``tools`` holds any: client tools
  (``{name, description, input_schema}``) and server tools (``{type: web_search_20250305,
  name, ...}``) alike. The recall tool goes last, as a client tool without ``cache_control``:
  a breakpoint the client put on its last tool (Claude Code puts them in ``tools`` and
  ``system``) still covers the same tools, so that cache entry is still read, and the client's
  tools are the very objects it sent.
- **Preserved thinking.** ``tools`` is part of every signed thinking block's prefix, so on
  Anthropic's API a request offered the tool needs ``thinking.block_binding: drop_block`` for
  the blocks made before it was offered (:func:`~._binding.offer_binding`); a client that set
  ``block_binding`` to anything else is not offered the tool (its request is not counted as
  declaring tools), since the proxy never overrides that choice.
- **Read.** A reply's recall calls are its ``tool_use`` blocks of the tool's name (a
  ``server_tool_use`` is the API's own, never a call the proxy answers); its other
  ``tool_use`` blocks are the client's. The model's turn goes back as one assistant message
  holding every block of the reply as the API gave it, thinking with its signature and tool
  inputs parsed, in order: the API checks that a turn's signed thinking comes back
  unchanged, and that every ``tool_use`` is answered in the next message. A stream is put
  together block by block first (:mod:`._stream`). A text block left empty is not sent back
  (the API refuses empty text blocks).
- **Stripped.** A mixed turn goes to the client without the recall ``tool_use`` blocks: in
  JSON every other byte is the upstream's; in a stream the dropped blocks' start, delta and
  stop events go and later blocks' ``index`` is renumbered (the SDKs find a block by it),
  every other event byte for byte. ``stop_reason`` stays ``tool_use`` while a client call
  remains, and is ``end_turn`` when none does.
- **Continued.** The forwarded messages, the model's turn, then one user message with a
  ``tool_result`` per answer: the API wants every result of a turn in the message right after
  it. The turn's thinking was made under the request's ``system``, ``tools`` (the recall tool
  included) and messages, which the continuation repeats, so preserved thinking's binding
  holds (docs/messages.md, "Preserved thinking").
- **Closed.** ``tool_choice: {"type": "none"}``, which the API allows with thinking on (only
  ``auto`` and ``none`` are).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .._forwarded import ClientBody
from ..format import Amendment, UpstreamTraits
from ..recall import RecallAnswer, RecallCall, RecallTool, RecallTurn
from ..sse import Event, events
from ._binding import offer_binding
from ._blocks import block_type
from ._stream import accumulate, index_of

__all__ = ["MESSAGES_RECALL", "MessagesRecall"]

TOOL_USE = "tool_use"
CONTENT = "content"


class MessagesRecall:
    """:class:`~compaction_proxy.wire.recall.RecallWire` for ``POST /v1/messages``."""

    def declared(self, body: Mapping[str, Any]) -> bool:
        return bool(_tools(body)) and not _bound_by_client(body)

    def clashes(self, body: Mapping[str, Any], name: str) -> bool:
        return any(tool.get("name") == name for tool in _tools(body))

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        # The tool joins every signed block's prefix: the binding that covers them all.
        return offer_binding(body, items, upstream)

    def offer(self, body: Mapping[str, Any], tool: RecallTool) -> dict[str, Any]:
        tools = body.get("tools")
        own = list(tools) if isinstance(tools, list) else []
        recall = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": _plain(tool.parameters),
        }
        return {"tools": [*own, recall]}

    def read(self, reply: bytes, *, stream: bool, name: str) -> RecallTurn | None:
        found = _stream_blocks(reply) if stream else _json_blocks(reply)
        if found is None:
            return None
        calls: list[RecallCall] = []
        others = 0
        for block, arguments in found:
            if _calls(block, name):
                call_id = block.get("id")
                if not isinstance(call_id, str):
                    return None  # a call no result could answer: not a reply the API sends
                calls.append(RecallCall(call_id, arguments))
            elif block_type(block) == TOOL_USE:
                others += 1
        if not calls:
            return None
        content = [block for block, _ in found if not _empty_text(block)]
        return RecallTurn(tuple(calls), others, ({"role": "assistant", "content": content},))

    def strip(self, reply: bytes, *, stream: bool, name: str) -> bytes:
        return _strip_stream(reply, name) if stream else _strip_json(reply, name)

    def continuation(
        self,
        body: Mapping[str, Any],
        turn: RecallTurn,
        answers: Sequence[RecallAnswer],
    ) -> dict[str, Any]:
        messages = body.get("messages")
        results = [
            {
                "type": "tool_result",
                "tool_use_id": answer.call_id,
                "content": answer.text,
                "is_error": answer.is_error,
            }
            for answer in answers
        ]
        return {
            "messages": [
                *(messages if isinstance(messages, list) else ()),
                *turn.assistant,
                {"role": "user", "content": results},
            ]
        }

    def closing(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"tool_choice": {"type": "none"}}


MESSAGES_RECALL = MessagesRecall()


def _tools(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [tool for tool in tools if isinstance(tool, Mapping)]


def _bound_by_client(body: Mapping[str, Any]) -> bool:
    """Whether the client chose how the API treats a signed block whose prefix changed, other
    than dropping it: the tool is then never offered, since adding it to ``tools`` changes
    every block's prefix (docs/messages.md, "Preserved thinking")."""
    thinking = body.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, Mapping) else None
    if binding is None:
        return False
    return not isinstance(binding, Mapping) or binding.get("prefix_mismatch_behavior") != (
        "drop_block"
    )


def _plain(value: Any) -> Any:
    """A schema as JSON values (a ``Mapping`` as a dict, a tuple as a list), for orjson."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _calls(block: Any, name: str) -> bool:
    """Whether ``block`` is a call of the tool ``name``."""
    return block_type(block) == TOOL_USE and block.get("name") == name


def _empty_text(block: Any) -> bool:
    return block_type(block) == "text" and not block.get("text")


def _json_reply(reply: bytes) -> dict[str, Any] | None:
    """A JSON reply that is a message (an ``error`` body is not)."""
    try:
        data = orjson.loads(reply)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("type", "message") != "message":
        return None
    return data if isinstance(data.get(CONTENT), list) else None


def _json_blocks(reply: bytes) -> list[tuple[Any, str]] | None:
    """A JSON reply's blocks, each with its input's JSON text."""
    data = _json_reply(reply)
    if data is None:
        return None
    return [(block, _input_text(block)) for block in data[CONTENT]]


def _input_text(block: Any) -> str:
    if not isinstance(block, Mapping):
        return ""
    return orjson.dumps(block.get("input", {})).decode()


def _stream_blocks(reply: bytes) -> list[tuple[Any, str]] | None:
    """A whole stream's blocks, each with its input's JSON text as streamed; None for a
    stream that is not a message that ended (an ``error`` event, cut short)."""
    whole = accumulate(events(reply))
    if not whole.complete:
        return None
    return [(block, arguments) for _, block, arguments in whole.blocks]


def _strip_json(reply: bytes, name: str) -> bytes:
    data = _json_reply(reply)
    if data is None:
        return reply
    content = data[CONTENT]
    kept = [block for block in content if not _calls(block, name)]
    if len(kept) == len(content):
        return reply
    return ClientBody(reply, data, CONTENT).with_elements(kept, members=_stop(data, kept))


def _stop(message: Mapping[str, Any], kept: Sequence[Any]) -> dict[str, Any]:
    """``stop_reason: end_turn`` for a ``tool_use`` stop that no client call is left for."""
    if message.get("stop_reason") != TOOL_USE:
        return {}
    if any(block_type(block) == TOOL_USE for block in kept):
        return {}
    return {"stop_reason": "end_turn"}


def _strip_stream(reply: bytes, name: str) -> bytes:
    body = events(reply)
    starts = [
        (index, event.data.get("content_block"))
        for event in body
        if event.kind == "content_block_start"
        and isinstance(event.data, dict)
        and (index := index_of(event)) is not None
    ]
    dropped = sorted({index for index, block in starts if _calls(block, name)})
    if not dropped:
        return reply
    kept = [block for index, block in starts if index not in dropped]
    out: list[bytes] = []
    for event in body:
        index = index_of(event)
        if index is not None:
            if index in dropped:
                continue
            shift = sum(1 for gone in dropped if gone < index)
            out.append(_renumbered(event, index - shift) if shift else event.raw)
        elif event.kind == "message_delta":
            out.append(_delta_stop(event, kept))
        else:
            out.append(event.raw)
    return b"".join(out)


def _renumbered(event: Event, index: int) -> bytes:
    assert isinstance(event.data, dict)  # it has an index
    return event.with_data({**event.data, "index": index})


def _delta_stop(event: Event, kept: Sequence[Any]) -> bytes:
    """``message_delta`` with the stop reason :func:`_stop` gives the stripped message."""
    delta = event.data.get("delta") if isinstance(event.data, dict) else None
    if not isinstance(delta, dict):
        return event.raw
    stop = _stop(delta, kept)
    if not stop:
        return event.raw
    return event.with_data({**event.data, "delta": {**delta, **stop}})
