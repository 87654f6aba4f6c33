"""Responses input items in the core's terms: one chat-shaped message per group of items.

The compaction core works on chat messages (see "Groups and invariants" in
compaction_proxy/compaction/README.md). Rather than teach it a second wire format, the adapter
shows it each
Responses conversation as chat messages and maps the result back (:mod:`.lower`), so the
strategies, budget, triggers, checkpoints and reports are the very ones chat completions use.

Items that must live or die together become one *unit*, and each unit one message:

- ``instructions``, and every ``system``/``developer`` message: a system message (never
  touched by any strategy);
- a ``user`` message: a user message (it starts a turn);
- an assistant message: an assistant message; consecutive calls (``function_call``,
  ``custom_tool_call``, hosted and other tool calls): one assistant message with ``tool_calls``
  by ``call_id`` (parallel calls are one step, as in chat). The model's text and its calls
  stay separate groups, so a strategy that collapses or drops old calls keeps what the model
  said, and a message the proxy wrote (a summary, a collapsed step) never merges with the calls
  after it when the result is read again;
- each output (``function_call_output``, ``custom_tool_call_output``, ``computer_call_output``,
  ...): a ``tool`` message answering its ``call_id``, which the core pairs with its call
  wherever it sits;
- ``reasoning`` items join the item they precede (the unit before, when a system message or
  nothing follows) and are never edited, only dropped with it;
- an item of a type the proxy does not know joins the unit before it (the next one when it
  comes first or after a system message) and is never edited.

The chat messages carry what the model reads, in fields the core's tokenizer counts the way it
counts chat: text, call names and arguments, tool outputs, images by their tiles. What the
model does not read (item ids, statuses) is left out; what the core has no field for (reasoning,
hosted tool results, unknown items) rides in extra fields counted as their JSON. The messages
are a pure function of the items, so a checkpoint's hash chain over them is stable from one
request to the next. They are never sent anywhere: :mod:`.lower` maps every message the
pipeline kept back to the client's own items (the same objects), so an item nothing changed
goes upstream exactly as it came.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction_proxy.compaction.canonical import json_text

from ._items import TEXT_OUTPUTS, Kind, classify, item_type

Item = dict[str, Any]
"""One input item as the client sent it (never mutated)."""

REASONING_FIELD = "reasoning"
"""Where a unit's reasoning items ride; the summarizer's transcript drops the field whole."""
ITEMS_FIELD = "items"
"""Where hosted calls, non-text outputs and unknown items ride, counted as their JSON."""


@dataclass(slots=True)
class Entry:
    """One item of a unit: what it is and the id that pairs it (a call's or an output's)."""

    kind: Kind
    item: Item
    key: str | None = None


@dataclass(slots=True)
class Unit:
    """Items that live or die together, shown to the core as one message.

    ``kind`` is SYSTEM, USER, TEXT (the model's side: an assistant message, or with ``calls``
    a run of calls), OUTPUT, or OTHER (only reasoning or unknown items, with no neighbour to
    join). Reasoning and unknown items ride in any unit but a system one.
    """

    kind: Kind
    entries: list[Entry] = field(default_factory=list)
    calls: bool = False

    @property
    def items(self) -> list[Item]:
        return [entry.item for entry in self.entries]

    def first(self, kind: Kind) -> Entry:
        return next(entry for entry in self.entries if entry.kind is kind)


@dataclass(frozen=True, slots=True)
class Lifted:
    """A Responses request as the core sees it, and what is needed to map it back.

    ``messages[i]`` stands for ``units[i]`` (``None``: the ``instructions`` message, which is
    never part of the input sent back). ``outputs`` and ``calls`` find a unit by call id, for
    messages a strategy edited; ``others`` are the items of unknown types.
    """

    messages: list[dict[str, Any]]
    units: list[Unit | None]
    tools: list[Any] | None
    outputs: dict[str, list[int]]
    calls: dict[str, int]
    others: tuple[Item, ...]

    def chat_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What the compaction flow takes: model, messages, tools, the output limit and the
        per-user fields that key its checkpoints (``user``, ``safety_identifier``)."""
        chat: dict[str, Any] = {"model": body.get("model"), "messages": self.messages}
        if self.tools:
            chat["tools"] = self.tools
        for name in ("user", "safety_identifier"):
            if name in body:
                chat[name] = body[name]
        limit = body.get("max_output_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            chat["max_completion_tokens"] = limit
        return chat


def input_items(body: Mapping[str, Any]) -> list[Any]:
    """The request's ``input`` as a list (a string is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return value if isinstance(value, list) else []


def lift(body: Mapping[str, Any]) -> Lifted:
    """The chat-shaped view of a validated Responses body (see the module docstring)."""
    units, others = build_units(input_items(body))
    messages: list[dict[str, Any]] = []
    owners: list[Unit | None] = []
    instructions = body.get("instructions")
    if instructions is not None and instructions != "":
        text = instructions if isinstance(instructions, str) else json_text(instructions)
        messages.append({"role": "system", "content": text})
        owners.append(None)
    outputs: dict[str, list[int]] = {}
    calls: dict[str, int] = {}
    for unit in units:
        index = len(messages)
        messages.append(render(unit))
        owners.append(unit)
        for entry in unit.entries:
            if entry.key is None:
                continue
            if unit.kind is Kind.OUTPUT and entry.kind is Kind.OUTPUT:
                outputs.setdefault(entry.key, []).append(index)
            elif entry.kind in (Kind.CALL, Kind.BUILTIN):
                calls.setdefault(entry.key, index)
    return Lifted(messages, owners, chat_tools(body.get("tools")), outputs, calls, others)


def build_units(items: Sequence[Any]) -> tuple[list[Unit], tuple[Item, ...]]:
    """Group ``items`` into units, in order; also the items of unknown types.

    Every unit is a contiguous run of items, so mapping units back keeps the items' order.
    """
    declared: set[str] = set()
    units: list[Unit] = []
    pending: list[Entry] = []  # reasoning (and what came with it) waiting for its item
    others: list[Item] = []
    for position, item in enumerate(items):
        kind, key = classify(item, declared)
        if kind is Kind.BUILTIN and key is None:
            key = f"{item_type(item)}-{position}"  # stable: the items before it do not change
        elif kind is Kind.OUTPUT and key is None:
            kind = Kind.OTHER  # answers nothing it names: kept as sent, like an unknown item
        entry = Entry(kind, item, key)
        last = units[-1] if units else None
        if kind is Kind.OTHER:
            others.append(item)
            if not pending and last is not None and last.kind is not Kind.SYSTEM:
                last.entries.append(entry)
            else:
                pending.append(entry)
        elif kind is Kind.REASONING:
            pending.append(entry)
        elif kind in _CALL_KINDS and last is not None and last.calls:
            # Parallel calls: one step, as one assistant message with several tool calls.
            last.entries.extend(pending)
            last.entries.append(entry)
            pending = []
        elif kind in (Kind.TEXT, Kind.CALL, Kind.BUILTIN):
            units.append(Unit(Kind.TEXT, [*pending, entry], calls=kind is not Kind.TEXT))
            pending = []
        else:  # SYSTEM, USER, OUTPUT: a unit each
            pending = _settle(pending, units, forward=kind is not Kind.SYSTEM)
            units.append(Unit(kind, [*pending, entry]))
            pending = []
    if pending:
        _settle(pending, units, forward=False)
    return units, tuple(others)


def _settle(pending: list[Entry], units: list[Unit], *, forward: bool) -> list[Entry]:
    """Where what waits goes: into the next unit when ``forward`` (it precedes that item),
    else onto the unit before it, or a unit of its own when that is a system message (which
    takes nothing). Returns what the next unit takes.

    Reasoning precedes the model's own items; before anything else it is left over from a
    cut-off response, and it still goes with the item it precedes, so that dropping any
    other group never changes what it is attached to.
    """
    if not pending or forward:
        return pending
    last = units[-1] if units else None
    if last is not None and last.kind is not Kind.SYSTEM:
        last.entries.extend(pending)
    else:
        units.append(Unit(Kind.OTHER, list(pending)))
    return []


# ------------------------------------------------------------------ rendering


def render(unit: Unit) -> dict[str, Any]:
    """The chat message standing for ``unit`` (see the module docstring)."""
    message: dict[str, Any]
    if unit.kind in (Kind.SYSTEM, Kind.USER):
        item = unit.first(unit.kind).item
        message = {"role": item.get("role"), "content": lift_content(item.get("content"))}
    elif unit.kind is Kind.OUTPUT:
        entry = unit.first(Kind.OUTPUT)
        message = {"role": "tool", "tool_call_id": entry.key, **_output_fields(entry.item)}
    else:
        message = {"role": "assistant", "content": _assistant_content(unit)}
        calls = [_tool_call(entry) for entry in unit.entries if entry.kind in _CALL_KINDS]
        if calls:
            message["tool_calls"] = calls
    reasoning = [e.item for e in unit.entries if e.kind is Kind.REASONING]
    riding = [e.item for e in unit.entries if _rides(e)]
    if reasoning:
        message[REASONING_FIELD] = reasoning
    if riding:
        message[ITEMS_FIELD] = [*message.get(ITEMS_FIELD, ()), *riding]
    return message


_CALL_KINDS = (Kind.CALL, Kind.BUILTIN)
_NAMED_CALLS = frozenset({"function_call", "custom_tool_call"})


def _rides(entry: Entry) -> bool:
    """Items counted as their JSON: unknown items, hosted calls, calls without a name and
    arguments the core could read."""
    if entry.kind is Kind.OTHER or entry.kind is Kind.BUILTIN:
        return True
    return entry.kind is Kind.CALL and item_type(entry.item) not in _NAMED_CALLS


def _tool_call(entry: Entry) -> dict[str, Any]:
    """A ``tool_calls`` entry: function and custom calls as chat has them; any other call as a
    custom call named after its type (its item rides along, see :func:`_rides`)."""
    item = entry.item
    kind = item_type(item)
    if kind == "function_call":
        function = {"name": item.get("name"), "arguments": item.get("arguments")}
        return {"id": entry.key, "type": "function", "function": function}
    if kind == "custom_tool_call":
        custom = {"name": item.get("name"), "input": item.get("input")}
        return {"id": entry.key, "type": "custom", "custom": custom}
    return {"id": entry.key, "type": "custom", "custom": {"name": kind, "input": ""}}


def _assistant_content(unit: Unit) -> Any:
    texts = [e.item.get("content") for e in unit.entries if e.kind is Kind.TEXT]
    if not texts:
        return None
    if len(texts) == 1:
        return lift_content(texts[0])
    parts: list[Any] = []
    for content in texts:
        if isinstance(content, list):
            parts.extend(lift_content(content))
        else:
            parts.append({"type": "output_text", "text": content})
    return parts


def _output_fields(item: Item) -> dict[str, Any]:
    """``content`` (and what rides along) for an output item.

    Text outputs become the tool message's content, which strategies may trim or clear. Other
    outputs keep an empty content (nothing to trim, and a placeholder would only make it
    longer) and ride along whole; a computer screenshot is shown as an image part so it is
    counted by its tiles.
    """
    kind = item_type(item)
    if kind in TEXT_OUTPUTS:
        output = item.get("output")
        return {"content": "" if output is None else lift_output(output)}
    if kind == "computer_call_output":
        screenshot = item.get("output")
        if isinstance(screenshot, Mapping):
            return {"content": [image_part(screenshot)]}
    return {"content": "", ITEMS_FIELD: [item]}


# ------------------------------------------------------------------ content


def lift_content(content: Any) -> Any:
    """A message's content with ``input_image`` parts as chat ``image_url`` parts (counted by
    their tiles); text parts keep their Responses types, which the core reads as text."""
    if not isinstance(content, list):
        return content
    return [
        image_part(p) if isinstance(p, Mapping) and p.get("type") == "input_image" else p
        for p in content
    ]


def lift_output(output: Any) -> Any:
    """A tool output's content: text parts as chat ``text`` parts (so strategies can trim or
    clear them), images as ``image_url`` parts; anything else as it is."""
    if not isinstance(output, list):
        return output
    parts: list[Any] = []
    for part in output:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text"):
            assert isinstance(part, Mapping)
            parts.append({**part, "type": "text"})
        elif kind == "input_image":
            assert isinstance(part, Mapping)
            parts.append(image_part(part))
        else:
            parts.append(part)
    return parts


def image_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A chat ``image_url`` part for an ``input_image`` part or a screenshot."""
    url = part.get("image_url")
    detail = part.get("detail")
    image: dict[str, Any] = {"url": url if isinstance(url, str) else None}
    if isinstance(detail, str):
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def chat_tools(tools: Any) -> list[Any] | None:
    """The request's tools for counting: function tools in chat's nested shape (the core
    renders those as the model sees them); hosted tools as they are (counted as JSON)."""
    if not isinstance(tools, list) or not tools:
        return None
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" not in tool:
            function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
            out.append({"type": "function", "function": function})
        else:
            out.append(tool)
    return out
