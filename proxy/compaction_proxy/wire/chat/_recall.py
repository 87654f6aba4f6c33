"""Chat completions' side of the recall loop (:class:`~compaction_proxy.wire.recall.RecallWire`;
docs/recall.md).

- **Declared tools.** ``tools`` (function tools ``{"type": "function", "function": {...}}``,
  custom tools ``{"type": "custom", "custom": {...}}``, any other entry) or the legacy
  ``functions``. The recall tool goes last into ``tools``; into ``functions`` (as ``{name,
  description, parameters}``) for a request that declares only those, since the API refuses a
  request with both and answers ``functions`` with the legacy ``message.function_call``. A
  ``tool_choice`` of the client's (``allowed_tools``, a named function) is left as it is: a
  client that narrows the model's choice narrows it for the recall tool too.
- **Reading a reply.** Choice 0 only (``n > 1``: the other choices are never read; the loop
  continues one conversation, and a continuation asks for ``n`` choices again). JSON: its
  ``message.tool_calls`` (or ``function_call``). A stream: choice 0's deltas accumulated as
  the SDK's stream helpers accumulate them: content concatenated, each tool call by its
  ``index``, its ``id``, name and ``arguments`` concatenated over its deltas (OpenAI sends the
  id and name in the first one), up to ``data: [DONE]``: the call found is the call the
  client's SDK would show. An entry without an ``index`` (some OpenAI-compatible servers; the
  SDK refuses those) is placed by its ``id``, else continues the last call. An error
  (``{"error": ...}``) or anything that does not parse reads as no call. A reply without
  ``"tool_calls"`` or ``"function_call"`` in its bytes calls nothing: it is not parsed.
- **The assistant turn** the continuation appends: ``{"role": "assistant", "content": text or
  None, "tool_calls": [every call, in order]}`` (a legacy reply: ``"function_call": {name,
  arguments}``), plus ``reasoning_content``, ``reasoning`` and ``reasoning_details`` when the
  reply carried them (servers that stream reasoning want it back within a tool loop; OpenAI
  never sends them). A call without an ``id`` gets one (``call_recall_<n>``) so its tool
  message can answer it. Answers: ``{"role": "tool", "tool_call_id", "content": text}``
  (legacy: ``{"role": "function", "name", "content"}``).
- **Stripping** (every choice, so no choice shows the client a tool it never declared): JSON:
  the recall calls leave ``message.tool_calls``; when none is left the key goes too (as in a
  reply that called nothing) and ``finish_reason`` ``"tool_calls"`` becomes ``"stop"``
  (agents loop on either; a ``"tool_calls"`` reply without calls would make them answer
  nothing); ``content`` stays what it was. A stream: the recall calls' delta entries go, the
  remaining calls' ``index`` is renumbered 0, 1, ... (the SDK's accumulator inserts by index,
  so a gap would corrupt the client's calls), a chunk left with nothing in it goes whole, and
  the last ``finish_reason`` follows the JSON rule. ``usage`` is left as the upstream counted
  it (the recall call's tokens were generated and billed). Every event nothing changed keeps
  its bytes; a changed one is written again as compact JSON with its key order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._openai_recall import integer, loads, named_list
from ..format import Amendment, UpstreamTraits
from ..recall import RecallAnswer, RecallCall, RecallTool, RecallTurn
from ..sse import Event, events

__all__ = ["CHAT_RECALL", "ChatRecall"]

_EXTRAS = ("reasoning_content", "reasoning", "reasoning_details")
"""Assistant-message fields of OpenAI-compatible reasoning servers, given back as they came."""
_STREAMED_EXTRAS = ("reasoning_content", "reasoning")
"""Those a stream sends as text deltas."""


class ChatRecall:
    """See the module docstring."""

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        return None  # an OpenAI upstream binds nothing to the tools

    def declared(self, body: Mapping[str, Any]) -> bool:
        return bool(named_list(body, "tools") or named_list(body, "functions"))

    def clashes(self, body: Mapping[str, Any], name: str) -> bool:
        tools = named_list(body, "tools")
        functions = named_list(body, "functions")
        return any(_tool_name(t) == name for t in tools) or any(
            isinstance(f, Mapping) and f.get("name") == name for f in functions
        )

    def offer(self, body: Mapping[str, Any], tool: RecallTool) -> dict[str, Any]:
        function = {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.parameters),
        }
        tools = named_list(body, "tools")
        functions = named_list(body, "functions")
        if functions and not tools:
            return {"functions": [*functions, function]}
        return {"tools": [*tools, {"type": "function", "function": function}]}

    def read(self, reply: bytes, *, stream: bool, name: str) -> RecallTurn | None:
        if b'"tool_calls"' not in reply and b'"function_call"' not in reply:
            return None  # calls no tool: nothing to parse (most replies, an agent's answer)
        message = _streamed_message(reply) if stream else _json_message(reply)
        return None if message is None else _turn(message, name)

    def strip(self, reply: bytes, *, stream: bool, name: str) -> bytes:
        return _strip_stream(reply, name) if stream else _strip_json(reply, name)

    def continuation(
        self,
        body: Mapping[str, Any],
        turn: RecallTurn,
        answers: Sequence[RecallAnswer],
    ) -> dict[str, Any]:
        legacy = next(
            (
                m["function_call"]
                for m in turn.assistant
                if isinstance(m.get("function_call"), dict)
            ),
            None,
        )
        if legacy is not None:
            results = [
                {"role": "function", "name": legacy.get("name"), "content": a.text} for a in answers
            ]
        else:
            results = [
                {"role": "tool", "tool_call_id": a.call_id, "content": a.text} for a in answers
            ]
        return {"messages": [*named_list(body, "messages"), *turn.assistant, *results]}

    def closing(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if named_list(body, "functions") and not named_list(body, "tools"):
            return {"function_call": "none"}
        return {"tool_choice": "none"}


CHAT_RECALL = ChatRecall()


# --------------------------------------------------------------------------- reading


def _tool_name(tool: object) -> object:
    """A declared tool's name: a function's or a custom tool's (a flat ``name`` too, the
    Responses spelling some clients send here)."""
    if not isinstance(tool, Mapping):
        return None
    for kind in ("function", "custom"):
        inner = tool.get(kind)
        if isinstance(inner, Mapping) and "name" in inner:
            return inner.get("name")
    return tool.get("name")


def _is_recall(call: object, name: str) -> bool:
    if not isinstance(call, Mapping) or call.get("type", "function") not in ("function", None):
        return False
    function = call.get("function")
    return isinstance(function, Mapping) and function.get("name") == name


def _arguments(value: object) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else orjson.dumps(value).decode()


def _json_message(reply: bytes) -> dict[str, Any] | None:
    payload = loads(reply)
    if not isinstance(payload, dict) or payload.get("error") is not None:
        return None
    choice = _first_choice(payload.get("choices"))
    message = choice.get("message") if choice is not None else None
    return message if isinstance(message, dict) else None


def _first_choice(choices: object) -> dict[str, Any] | None:
    """Choice 0 (by its ``index``, else the first)."""
    if not isinstance(choices, list):
        return None
    listed = [c for c in choices if isinstance(c, dict)]
    return next((c for c in listed if c.get("index") == 0), listed[0] if listed else None)


def _turn(message: Mapping[str, Any], name: str) -> RecallTurn | None:
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, Mapping)]
    if any(_is_recall(c, name) for c in calls):
        named = [_with_id(c, n) for n, c in enumerate(calls)]
        recall = tuple(
            RecallCall(str(c["id"]), _arguments(c["function"].get("arguments")))
            for c in named
            if _is_recall(c, name)
        )
        assistant = _assistant(message, {"tool_calls": named})
        return RecallTurn(recall, others=len(calls) - len(recall), assistant=(assistant,))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping) and legacy.get("name") == name:
        arguments = _arguments(legacy.get("arguments"))
        call = {"name": name, "arguments": arguments}
        return RecallTurn(
            (RecallCall(name, arguments),),
            others=0,
            assistant=(_assistant(message, {"function_call": call}),),
        )
    return None


def _with_id(call: Mapping[str, Any], number: int) -> dict[str, Any]:
    out = dict(call)
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = f"call_recall_{number}"
    out.setdefault("type", "function")
    return out


def _assistant(message: Mapping[str, Any], calls: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    out: dict[str, Any] = {
        "role": "assistant",
        "content": content if content != "" and content is not None else None,
        **calls,
    }
    for key in _EXTRAS:
        value = message.get(key)
        if value is not None and value != "" and value != []:
            out[key] = value
    return out


@dataclass(slots=True)
class _Choice:
    """One choice of a stream, accumulated delta by delta."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    last: int | None = None
    function_call: dict[str, Any] | None = None
    extras: dict[str, list[str]] = field(default_factory=dict)

    def feed(self, delta: object) -> list[int]:
        """Accumulates ``delta``; the slot of each of its ``tool_calls`` entries, in order."""
        if not isinstance(delta, Mapping):
            return []
        content = delta.get("content")
        if isinstance(content, str):
            self.content.append(content)
        for key in _STREAMED_EXTRAS:
            piece = delta.get(key)
            if isinstance(piece, str):
                self.extras.setdefault(key, []).append(piece)
        legacy = delta.get("function_call")
        if isinstance(legacy, Mapping):
            self.function_call = self.function_call or {}
            _merge_function(self.function_call, legacy, "arguments")
        slots: list[int] = []
        entries = delta.get("tool_calls")
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping):
                slots.append(-1)
                continue
            slot = self._slot(entry)
            slots.append(slot)
            self.last = slot
            call = self.calls.setdefault(slot, {})
            call_id = entry.get("id")
            if isinstance(call_id, str):
                # Concatenated, as the SDK does; an entry without an index (which the SDK
                # cannot read) names its call by the id instead.
                placed = integer(entry.get("index")) is None and call.get("id")
                call["id"] = call_id if placed else call.get("id", "") + call_id
            kind = entry.get("type")
            if isinstance(kind, str) and kind:
                call["type"] = kind
            for kind, text in (("function", "arguments"), ("custom", "input")):
                inner = entry.get(kind)
                if isinstance(inner, Mapping):
                    _merge_function(call.setdefault(kind, {}), inner, text)
        return slots

    def _slot(self, entry: Mapping[str, Any]) -> int:
        index = integer(entry.get("index"))
        if index is not None:
            return index
        call_id = entry.get("id")
        if isinstance(call_id, str) and call_id:
            known = next((k for k, c in self.calls.items() if c.get("id") == call_id), None)
            return known if known is not None else max(self.calls, default=-1) + 1
        return self.last if self.last is not None else 0

    def message(self) -> dict[str, Any]:
        text = "".join(self.content)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self.calls:
            message["tool_calls"] = [self._call(self.calls[k]) for k in sorted(self.calls)]
        if self.function_call is not None:
            message["function_call"] = self.function_call
        for key, pieces in self.extras.items():
            message[key] = "".join(pieces)
        return message

    @staticmethod
    def _call(call: Mapping[str, Any]) -> dict[str, Any]:
        kind = call.get("type") or (
            "custom" if "custom" in call and "function" not in call else "function"
        )
        out: dict[str, Any] = {"id": call.get("id"), "type": kind}
        inner = dict(call.get(kind) or {})
        inner.setdefault("name", None)
        inner.setdefault("arguments" if kind == "function" else "input", "")
        out[kind] = inner
        return out


def _merge_function(target: dict[str, Any], delta: Mapping[str, Any], text: str) -> None:
    """Strings concatenated, as the SDK's ``accumulate_delta`` does: the name it reads is the
    name looked for."""
    for key in ("name", text):
        piece = delta.get(key)
        if isinstance(piece, str):
            target[key] = target.get(key, "") + piece


def stream_done(event: Event) -> bool:
    """Chat completions' last event: ``data: [DONE]``."""
    return event.text is not None and event.text.strip() == b"[DONE]"


def _chunks(stream: Iterable[Event]) -> Iterable[tuple[int, Event]]:
    """The events the SDK reads, by position: everything before ``data: [DONE]``."""
    for position, event in enumerate(stream):
        if stream_done(event):
            return
        if event.complete:
            yield position, event


def _choices(data: object) -> list[tuple[int, dict[str, Any]]]:
    """A chunk's choices with their ``index`` (their position when it has none)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return []
    out: list[tuple[int, dict[str, Any]]] = []
    for position, choice in enumerate(choices):
        if isinstance(choice, dict):
            index = integer(choice.get("index"))
            out.append((position if index is None else index, choice))
    return out


def _streamed_message(reply: bytes) -> dict[str, Any] | None:
    choice = _Choice()
    seen = False
    for _, event in _chunks(events(reply)):
        if isinstance(event.data, dict) and event.data.get("error") is not None:
            return None
        for index, entry in _choices(event.data):
            if index == 0:
                seen = True
                choice.feed(entry.get("delta"))
    return choice.message() if seen else None


# --------------------------------------------------------------------------- stripping


def _strip_json(reply: bytes, name: str) -> bytes:
    payload = loads(reply)
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return reply
    changed = False
    for choice in payload["choices"]:
        if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
            changed |= _strip_message(choice, choice["message"], name)
    return orjson.dumps(payload) if changed else reply


def _strip_message(choice: dict[str, Any], message: dict[str, Any], name: str) -> bool:
    changed = False
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        kept = [c for c in calls if not _is_recall(c, name)]
        if len(kept) != len(calls):
            changed = True
            if kept:
                message["tool_calls"] = kept
            else:
                del message["tool_calls"]
                if choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "stop"
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping) and legacy.get("name") == name:
        changed = True
        del message["function_call"]
        if choice.get("finish_reason") == "function_call":
            choice["finish_reason"] = "stop"
    return changed


@dataclass(slots=True)
class _Plan:
    """What stripping a stream removes of one choice: its recall calls' slots, the new index
    of every other call, and whether its legacy ``function_call`` is the recall tool's."""

    recall: set[int] = field(default_factory=set)
    renumber: dict[int, int] = field(default_factory=dict)
    legacy: bool = False

    @property
    def emptied(self) -> bool:
        """No call of the client's is left: the choice finishes as a reply that called none."""
        return (bool(self.recall) and not self.renumber) or self.legacy


def _strip_stream(reply: bytes, name: str) -> bytes:
    stream = events(reply)
    accumulated: dict[int, _Choice] = {}
    slots: dict[tuple[int, int], list[int]] = {}
    for position, event in _chunks(stream):
        for index, choice in _choices(event.data):
            state = accumulated.setdefault(index, _Choice())
            slots[(position, index)] = state.feed(choice.get("delta"))
    plans: dict[int, _Plan] = {}
    for index, state in accumulated.items():
        plan = _Plan()
        for slot, call in state.calls.items():
            if _is_recall(_Choice._call(call), name):
                plan.recall.add(slot)
        kept = sorted(s for s in state.calls if s not in plan.recall)
        plan.renumber = {slot: new for new, slot in enumerate(kept)}
        legacy = state.function_call
        plan.legacy = legacy is not None and legacy.get("name") == name
        if plan.recall or plan.legacy:
            plans[index] = plan
    if not plans:
        return reply
    out: list[bytes] = []
    for position, event in enumerate(stream):
        data = event.data
        touched = [
            (index, choice, plans[index])
            for index, choice in _choices(data)
            if index in plans and (position, index) in slots
        ]
        if not touched:
            out.append(event.raw)
            continue
        changed = False
        for index, choice, plan in touched:
            changed |= _strip_choice(choice, plan, slots[(position, index)])
        if not changed:
            out.append(event.raw)
        elif not _empty_chunk(data):
            out.append(event.with_data(data))
    return b"".join(out)


def _strip_choice(choice: dict[str, Any], plan: _Plan, slots: list[int]) -> bool:
    changed = False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        entries = delta.get("tool_calls")
        if isinstance(entries, list) and plan.recall:
            kept = []
            for entry, slot in zip(entries, slots, strict=False):
                if slot in plan.recall:
                    changed = True
                    continue
                new = plan.renumber.get(slot)
                if (
                    isinstance(entry, dict)
                    and new is not None
                    and entry.get("index") not in (None, new)
                ):
                    entry = {**entry, "index": new}
                    changed = True
                kept.append(entry)
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
        if plan.legacy and "function_call" in delta:
            del delta["function_call"]
            changed = True
    finish = choice.get("finish_reason")
    if plan.emptied and finish in ("tool_calls", "function_call"):
        choice["finish_reason"] = "stop"
        changed = True
    return changed


def _empty_chunk(data: Mapping[str, Any]) -> bool:
    """A chunk stripping left with nothing the client reads: every choice an empty delta with
    no finish reason or logprobs, and no usage."""
    if data.get("usage") is not None:
        return False
    for _, choice in _choices(data):
        if set(choice) - {"index", "delta", "finish_reason", "logprobs"}:
            return False
        if choice.get("delta") or choice.get("finish_reason") is not None:
            return False
        if choice.get("logprobs") is not None:
            return False
    return True
