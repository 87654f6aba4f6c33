"""The core's compacted messages back as Responses input items.

Every message the pipeline returns is one of three things, and each maps back differently:

- a message the adapter made (:mod:`.lift`), kept as it was: its unit's items, the client's own
  objects, so they go upstream exactly as they came. It is found by identity, or (for a
  message read back from a checkpoint) by its canonical bytes, which equal those of the same
  unit lifted from this request: the client re-sends every item the checkpoint stands for;
- a message a strategy edited: a tool result cleared or trimmed (its output item, found by
  ``call_id``, with ``output`` replaced) or a call whose arguments were cleared (the call
  items with ``arguments`` replaced); reasoning and anything riding with them are kept;
- a message a strategy made up, a summary or a collapsed ``[Tool results: ...]``: a new
  ``message`` item with the text.

Anything else means the adapter and the core disagree, and :class:`LowerError` makes the edge
forward the client's original request instead of a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compaction_proxy.compaction.canonical import canonical_bytes

from ..format import Lowered, LowerError
from ._items import MESSAGE_ROLES, PART_OUTPUTS, TEXT_OUTPUTS, Kind, item_type
from ._lift import Item, Lifted, Unit


def lower(lifted: Lifted, messages: Sequence[Mapping[str, Any]]) -> Lowered:
    """The input items for ``messages`` (the pipeline's output for ``lifted.messages``)."""
    index_of = {id(message): index for index, message in enumerate(lifted.messages)}
    by_bytes: dict[bytes, list[int]] | None = None
    used: set[int] = set()
    items: list[Any] = []
    notes: list[str] = []
    for message in messages:
        index = index_of.get(id(message))
        if index is None:
            if by_bytes is None:
                by_bytes = {}
                for position, own in enumerate(lifted.messages):
                    by_bytes.setdefault(canonical_bytes(own), []).append(position)
            index = _unused(by_bytes.get(canonical_bytes(message), ()), used)
        if index is not None:
            used.add(index)
            unit = lifted.units[index]
            if unit is not None:
                items.extend(unit.items)
            continue
        items.extend(_changed(lifted, message, used, notes))
    dropped = _dropped(lifted.others, items)
    if dropped:
        notes.append(dropped)
    return Lowered(items, tuple(notes))


def _unused(candidates: Iterable[int], used: set[int]) -> int | None:
    return next((index for index in candidates if index not in used), None)


def _changed(
    lifted: Lifted, message: Mapping[str, Any], used: set[int], notes: list[str]
) -> list[Any]:
    role = message.get("role")
    call_id = message.get("tool_call_id")
    if role == "tool" and isinstance(call_id, str):
        index = _unused(lifted.outputs.get(call_id, ()), used)
        if index is not None:
            used.add(index)
            return _edited_output(lifted, index, message, notes)
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
        index = next(
            (lifted.calls[i] for i in ids if isinstance(i, str) and i in lifted.calls), None
        )
        if index is not None and index not in used:
            used.add(index)
            return _edited_calls(_unit(lifted, index), calls)
    content = message.get("content")
    if role in MESSAGE_ROLES and isinstance(content, str) and not calls and call_id is None:
        return [{"type": "message", "role": role, "content": content}]
    raise LowerError(f"a compacted {role!r} message maps back to no input item")


def _unit(lifted: Lifted, index: int) -> Unit:
    unit = lifted.units[index]
    if unit is None:
        raise LowerError("the instructions message was edited")
    return unit


def _edited_output(
    lifted: Lifted, index: int, message: Mapping[str, Any], notes: list[str]
) -> list[Item]:
    """The output unit with its output item's ``output`` replaced by the edited content."""
    unit = _unit(lifted, index)
    content = message.get("content")
    if content == lifted.messages[index].get("content"):
        return unit.items
    item = unit.first(Kind.OUTPUT).item
    kind = item_type(item)
    if kind not in TEXT_OUTPUTS:
        # A screenshot cannot become a text placeholder in the Responses API.
        notes.append(f"a {kind} was kept as sent: its output cannot be replaced by text")
        return unit.items
    output = output_from(content, item.get("output"), parts=kind in PART_OUTPUTS)
    edited = {**item, "output": output}
    return [edited if each is item else each for each in unit.items]


def _edited_calls(unit: Unit, calls: Sequence[Any]) -> list[Item]:
    """The call unit with the arguments (or custom input) the edited message now carries."""
    by_id: dict[str, Mapping[str, Any]] = {
        call["id"]: call
        for call in calls
        if isinstance(call, Mapping) and isinstance(call.get("id"), str)
    }
    out: list[Item] = []
    for item in unit.items:
        call = by_id.get(item.get("call_id", ""))
        kind = item_type(item)
        if call is not None and kind == "function_call":
            function = call.get("function")
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            if isinstance(arguments, str) and arguments != item.get("arguments"):
                item = {**item, "arguments": arguments}
        elif call is not None and kind == "custom_tool_call":
            custom = call.get("custom")
            value = custom.get("input") if isinstance(custom, Mapping) else None
            if isinstance(value, str) and value != item.get("input"):
                item = {**item, "input": value}
        out.append(item)
    return out


def output_from(content: Any, original: Any, *, parts: bool) -> Any:
    """An output item's ``output`` for a tool message's edited ``content``.

    A string stays a string. Content parts become Responses parts (text as ``input_text``,
    images back to the client's own ``input_image`` parts, in order) where the output type
    takes parts, else their text joined by newlines.
    """
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    if not parts:
        return "\n".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    images = iter(
        [p for p in original if isinstance(p, Mapping) and p.get("type") == "input_image"]
        if isinstance(original, list)
        else []
    )
    out: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            assert isinstance(part, Mapping)
            out.append({**part, "type": "input_text"})
        elif kind == "image_url":
            assert isinstance(part, Mapping)
            out.append(next(images, None) or _input_image(part))
        else:
            out.append(part)
    return out


def _input_image(part: Mapping[str, Any]) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else None
    detail = image.get("detail") if isinstance(image, Mapping) else None
    rebuilt: dict[str, Any] = {"type": "input_image"}
    if isinstance(url, str):
        rebuilt["image_url"] = url
    rebuilt["detail"] = detail if isinstance(detail, str) else "auto"
    return rebuilt


def _dropped(others: Sequence[Item], items: Sequence[Any]) -> str | None:
    """A note naming the unknown items that went with the group they were attached to."""
    if not others:
        return None
    kept = {id(item) for item in items}
    gone = [item_type(item) for item in others if id(item) not in kept]
    if not gone:
        return None
    types = ", ".join(sorted(set(gone)))
    return (
        f"dropped {len(gone)} input item(s) of a type the proxy does not know ({types}) "
        "with the group they were attached to"
    )
