"""The Responses API's side of the recall loop (:class:`~compaction_proxy.wire.recall.RecallWire`;
docs/recall.md). Pure: bytes and parsed JSON in and out.

- **Declared tools.** Any entry of ``tools``: function and custom tools, and hosted ones
  (``web_search``, ``file_search``, ``mcp``, ...), since a request that uses any tool is an
  agent's. A clash is any tool whose ``name`` is the recall tool's. A ``tool_choice`` of the
  client's (``allowed_tools``, a named tool) is left as it is. The recall tool goes last:
  ``{"type": "function", "name", "description", "parameters", "strict": false}``.
- **Reading a reply.** JSON: the response's ``output``. A stream: ``response.completed`` (or
  ``response.incomplete``) carries the whole output, which is preferred; without one the
  output is rebuilt from ``response.output_item.added``/``.done`` by ``output_index``, a
  call's arguments from ``response.function_call_arguments.done`` or its deltas. An ``error``
  event, ``response.failed``, a response with an ``error`` or anything that does not parse
  reads as no call; a reply without ``"function_call"`` in its bytes is not parsed. A recall
  call is a ``function_call`` item of the tool's name outside any ``namespace``; the
  client's calls (``others``) are the items the client answers
  (:data:`~compaction_proxy.wire.responses._items.CALL_KEYS`: function, custom, computer,
  shell and patch calls, MCP approval requests, and unknown items with a ``call_id``);
  hosted calls carry their own results and count as none.
- **The assistant turn** is every output item as it came (reasoning with its encrypted
  content, messages, hosted calls, function calls), which the API takes back as input items;
  the continuation is ``{"input": [...the request's input (a string input as its user
  message), ...the output items, {"type": "function_call_output", "call_id", "output":
  text}...]}``. With ``store: false`` a reasoning item without ``encrypted_content`` is left
  out: the API keeps nothing it could find it by.
- **Stripping** drops the recall calls' items, and a reasoning item whose turn held nothing
  else (the reasoning items before a run of items, when every item of that run was a recall
  call), so an item the client sends back is never a reasoning item without what followed
  it. JSON: from ``output``. A stream: every event of those items (by ``output_index``, or
  ``item_id`` for one without), the remaining ``output_index`` values shifted down so they
  run 0, 1, ... as the SDK's accumulator expects, ``sequence_number`` shifted down by the
  events dropped before it (so it stays contiguous for a client that resumes or checks it),
  and the items dropped from each lifecycle event's ``response.output``. Both also drop the
  recall tool from the response's echo of the request's ``tools``, so nothing of the hidden
  step shows. Every event nothing changed keeps its bytes; a changed one is written again as
  compact JSON with its key order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .._openai_recall import integer, loads, named_list
from ..format import Amendment, UpstreamTraits
from ..recall import RecallAnswer, RecallCall, RecallTool, RecallTurn
from ..sse import events
from ._items import CALL_KEYS, OUTPUT_KEYS, item_type
from ._lift import input_items

__all__ = ["RESPONSES_RECALL", "ResponsesRecall"]

_FINAL = ("response.completed", "response.incomplete")
_LIFECYCLE_WITH_OUTPUT = (
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
)


class ResponsesRecall:
    """See the module docstring."""

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        return None  # an OpenAI upstream binds nothing to the tools

    def declared(self, body: Mapping[str, Any]) -> bool:
        return bool(named_list(body, "tools"))

    def clashes(self, body: Mapping[str, Any], name: str) -> bool:
        return any(_is_tool(t, name) for t in named_list(body, "tools"))

    def offer(self, body: Mapping[str, Any], tool: RecallTool) -> dict[str, Any]:
        recall = {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.parameters),
            "strict": False,
        }
        return {"tools": [*named_list(body, "tools"), recall]}

    def read(self, reply: bytes, *, stream: bool, name: str) -> RecallTurn | None:
        if b'"function_call"' not in reply:
            return None  # calls no function: nothing to parse (most replies, an agent's answer)
        output = _streamed_output(reply) if stream else _json_output(reply)
        if output is None or not any(_is_recall(item, name) for item in output):
            return None
        items = [
            _with_call_id(item, n) if _is_recall(item, name) else item
            for n, item in enumerate(output)
        ]
        calls = tuple(
            RecallCall(item["call_id"], _arguments(item.get("arguments")))
            for item in items
            if _is_recall(item, name)
        )
        others = sum(1 for item in items if _client_call(item) and not _is_recall(item, name))
        return RecallTurn(calls, others=others, assistant=tuple(items))

    def strip(self, reply: bytes, *, stream: bool, name: str) -> bytes:
        return _strip_stream(reply, name) if stream else _strip_json(reply, name)

    def continuation(
        self,
        body: Mapping[str, Any],
        turn: RecallTurn,
        answers: Sequence[RecallAnswer],
    ) -> dict[str, Any]:
        unstored = body.get("store") is False
        turn_items = [
            item
            for item in turn.assistant
            if not (
                unstored and item.get("type") == "reasoning" and not item.get("encrypted_content")
            )
        ]
        outputs = [
            {"type": "function_call_output", "call_id": a.call_id, "output": a.text}
            for a in answers
        ]
        return {"input": [*input_items(body), *turn_items, *outputs]}

    def closing(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"tool_choice": "none"}


RESPONSES_RECALL = ResponsesRecall()


# --------------------------------------------------------------------------- reading


def _is_tool(tool: object, name: str) -> bool:
    return isinstance(tool, Mapping) and tool.get("name") == name


def _is_recall(item: object, name: str) -> bool:
    return (
        isinstance(item, Mapping)
        and item.get("type") == "function_call"
        and item.get("name") == name
        and not item.get("namespace")
    )


def _client_call(item: Mapping[str, Any]) -> bool:
    """An item the client answers with an output item of its own."""
    kind = item_type(item)
    if kind in CALL_KEYS:
        return True
    known = kind in OUTPUT_KEYS or kind in ("message", "reasoning", "item_reference")
    return not known and isinstance(item.get("call_id"), str) and not kind.endswith("_output")


def _arguments(value: object) -> str:
    return value if isinstance(value, str) else ""


def _with_call_id(item: Mapping[str, Any], number: int) -> dict[str, Any]:
    out = dict(item)
    if not isinstance(out.get("call_id"), str) or not out["call_id"]:
        out["call_id"] = f"call_recall_{number}"
    return out


def _json_output(reply: bytes) -> list[dict[str, Any]] | None:
    payload = loads(reply)
    if not isinstance(payload, dict) or payload.get("error") is not None:
        return None
    if payload.get("status") == "failed":
        return None
    output = payload.get("output")
    return [i for i in output if isinstance(i, dict)] if isinstance(output, list) else None


def _streamed_output(reply: bytes) -> list[dict[str, Any]] | None:
    final: list[dict[str, Any]] | None = None
    items: dict[int, dict[str, Any]] = {}
    finished: set[int] = set()
    deltas: dict[int, list[str]] = {}
    arguments: dict[int, str] = {}
    for event in events(reply):
        data = event.data
        if not event.complete or not isinstance(data, dict):
            continue
        kind = data.get("type")
        if kind in ("error", "response.failed"):
            return None
        response = data.get("response")
        if kind in _FINAL and isinstance(response, dict):
            if response.get("error") is not None:
                return None
            output = response.get("output")
            if isinstance(output, list):
                final = [i for i in output if isinstance(i, dict)]
        index = integer(data.get("output_index"))
        if index is None:
            continue
        item = data.get("item")
        if kind == "response.output_item.added" and isinstance(item, dict):
            items.setdefault(index, dict(item))
        elif kind == "response.output_item.done" and isinstance(item, dict):
            items[index] = dict(item)
            finished.add(index)
        elif kind == "response.function_call_arguments.delta":
            delta = data.get("delta")
            if isinstance(delta, str):
                deltas.setdefault(index, []).append(delta)
        elif kind == "response.function_call_arguments.done":
            done = data.get("arguments")
            if isinstance(done, str):
                arguments[index] = done
    if final is not None and (final or not items):
        return final
    if not items:
        return None
    rebuilt = []
    for index in sorted(items):
        item = items[index]
        if index not in finished and item.get("type") == "function_call":
            item["arguments"] = arguments.get(index, "".join(deltas.get(index, ())))
        rebuilt.append(item)
    return rebuilt


# --------------------------------------------------------------------------- stripping


def _dropped(items: Mapping[int, Mapping[str, Any]], name: str) -> set[int]:
    """The positions stripping drops: the recall calls, and the reasoning items that lead a
    run of items that were all recall calls."""
    dropped = {i for i, item in items.items() if _is_recall(item, name)}
    if not dropped:
        return dropped
    leading: list[int] = []
    run: list[int] = []

    def close() -> None:
        if leading and run and all(i in dropped for i in run):
            dropped.update(leading)

    for position in sorted(items):
        if items[position].get("type") == "reasoning":
            if run:
                close()
                leading, run = [], []
            leading.append(position)
        else:
            run.append(position)
    close()
    return dropped


def _strip_response(response: dict[str, Any], name: str) -> bool:
    """Drops the recall calls (and the reasoning that led only to them) from a response
    object's ``output`` and the recall tool from its ``tools``; whether anything went."""
    changed = False
    output = response.get("output")
    if isinstance(output, list):
        listed = {i: item for i, item in enumerate(output) if isinstance(item, Mapping)}
        gone = _dropped(listed, name)
        if gone:
            response["output"] = [item for i, item in enumerate(output) if i not in gone]
            changed = True
    tools = response.get("tools")
    if isinstance(tools, list) and any(_is_tool(t, name) for t in tools):
        response["tools"] = [t for t in tools if not _is_tool(t, name)]
        changed = True
    return changed


def _strip_json(reply: bytes, name: str) -> bytes:
    payload = loads(reply)
    if not isinstance(payload, dict) or not _strip_response(payload, name):
        return reply
    return orjson.dumps(payload)


def _strip_stream(reply: bytes, name: str) -> bytes:
    stream = events(reply)
    known: dict[int, Mapping[str, Any]] = {}
    final: list[Any] = []
    echoed = False
    for event in stream:
        data = event.data
        if not event.complete or not isinstance(data, dict):
            continue
        kind = data.get("type")
        index = integer(data.get("output_index"))
        item = data.get("item")
        added = kind in ("response.output_item.added", "response.output_item.done")
        if added and index is not None and isinstance(item, Mapping):
            known[index] = item
        response = data.get("response")
        if kind in _LIFECYCLE_WITH_OUTPUT and isinstance(response, dict):
            tools = response.get("tools")
            echoed = echoed or (isinstance(tools, list) and any(_is_tool(t, name) for t in tools))
            output = response.get("output")
            if kind in _FINAL and isinstance(output, list):
                final = output
    for position, item in enumerate(final):
        if isinstance(item, Mapping):
            known.setdefault(position, item)
    gone = _dropped(known, name)
    if not gone and not echoed:
        return reply
    order = sorted(gone)
    ids = {i for i in (known[g].get("id") for g in gone) if isinstance(i, str)}
    out: list[bytes] = []
    skipped = 0  # dropped events that had a sequence number
    for event in stream:
        data = event.data
        if not event.complete or not isinstance(data, dict):
            out.append(event.raw)
            continue
        index = integer(data.get("output_index"))
        sequence = integer(data.get("sequence_number"))
        if index in gone or (
            index is None and "output_index" not in data and data.get("item_id") in ids
        ):
            skipped += sequence is not None
            continue
        changed = False
        if index is not None:
            shift = bisect_left(order, index)
            if shift:
                data["output_index"] = index - shift
                changed = True
        if sequence is not None and skipped:
            data["sequence_number"] = sequence - skipped
            changed = True
        response = data.get("response")
        if data.get("type") in _LIFECYCLE_WITH_OUTPUT and isinstance(response, dict):
            changed |= _strip_response(response, name)
        out.append(event.with_data(data) if changed else event.raw)
    return b"".join(out)
