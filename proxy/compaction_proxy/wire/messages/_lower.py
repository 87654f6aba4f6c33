"""The core's compacted messages back as Messages ``messages``.

Every message the pipeline returns is one of three things, and each maps back differently:

- a message the adapter made (:mod:`._lift`), kept as it was: a piece of one client message.
  It is found by identity, or (for a message read back from a checkpoint) by its canonical
  bytes, which equal those of the same piece lifted from this request. When every piece of a
  client message is kept unchanged, the client's own message object goes upstream, so its bytes
  (``cache_control`` included) are the client's;
- a message a strategy edited: a tool result cleared or trimmed (its ``tool_result`` block with
  ``content`` replaced) or a step whose call inputs were cleared (its ``tool_use`` blocks with
  ``input`` replaced; thinking and every other block kept as they are);
- a message a strategy made up, a summary or a collapsed ``[Tool results: ...]``: a new
  message with one text block.

The pieces of one client message that are kept are put back together in the client's block
order, so the results of parallel calls stay in the one user message the API wants right after
the calls. Anything else means the adapter and the core disagree, and :class:`LowerError` makes
the edge forward the client's original request instead of a guess.

Prompt caching: the client's breakpoints stay on the blocks it put them on (a dropped block
takes its breakpoint with it, so there are never more than the client sent). When the proxy
wrote a checkpoint and the request holds fewer than the API's four breakpoints, one is put on the
checkpoint, so that the compacted prefix (tools, system, checkpoint) is cached from one
request to the next the way the client's own prefix was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from compaction_proxy.compaction.canonical import canonical_bytes

from ..format import Lowered, LowerError
from ._blocks import (
    CACHE_CONTROL,
    MAX_BREAKPOINTS,
    THINKING_TYPES,
    block_type,
    blocks_of,
    nested_blocks,
)
from ._blocks import breakpoints as count_breakpoints
from ._lift import Lifted, Owner

NEW_ROLES = frozenset({"user", "assistant", "system"})
OMITTED_NOTE = "[Earlier messages were removed to fit the context window.]"
"""The first message when compaction would otherwise open the conversation with the model's
turn (the API wants the user's first)."""


@dataclass(slots=True)
class _Run:
    """Consecutive kept pieces of one client message (``source``), or one made-up message."""

    source: int | None
    indices: list[int] = field(default_factory=list)
    replaced: dict[int, Any] = field(default_factory=dict)  # block position -> edited block
    made: dict[str, Any] | None = None


def lower(
    lifted: Lifted, messages: Sequence[Mapping[str, Any]], body: Mapping[str, Any]
) -> Lowered:
    """The ``messages`` for ``messages`` (the pipeline's output for ``lifted.messages``)."""
    runs = _runs(lifted, messages)
    items = [_emit(lifted, run) for run in runs]
    notes: list[str] = []
    _keep_thinking_first(items, runs)
    _cache_checkpoint(items, runs, body)  # before the opening note: it is no checkpoint
    first = _first_turn(items)
    if first is not None and items[first].get("role") == "assistant" and _opens_with_user(lifted):
        note = {"role": "user", "content": [{"type": "text", "text": OMITTED_NOTE}]}
        items.insert(first, note)
        notes.append("a user message was put first: the API wants the conversation to open so")
    return Lowered(items, tuple(notes))


def _first_turn(items: Sequence[Any]) -> int | None:
    """The position of the first message that is not a ``role: "system"`` note: the one the
    API wants to be the user's (the notes keep their place before it)."""
    return next(
        (
            p
            for p, item in enumerate(items)
            if isinstance(item, Mapping) and item.get("role") != "system"
        ),
        None,
    )


def _opens_with_user(lifted: Lifted) -> bool:
    first = _first_turn(lifted.sources)
    return first is not None and lifted.sources[first].get("role") == "user"


def _runs(lifted: Lifted, messages: Sequence[Mapping[str, Any]]) -> list[_Run]:
    index_of = {id(message): index for index, message in enumerate(lifted.messages)}
    by_bytes: dict[bytes, list[int]] | None = None
    used: set[int] = set()
    runs: list[_Run] = []

    def add(index: int, replaced: Mapping[int, Any] | None = None) -> None:
        owner = lifted.owners[index]
        if owner is None:  # the top-level system: never part of `messages`
            return
        used.add(index)
        if not runs or runs[-1].source != owner.source or runs[-1].made is not None:
            runs.append(_Run(owner.source))
        runs[-1].indices.append(index)
        if replaced:
            runs[-1].replaced.update(replaced)

    for message in messages:
        index = index_of.get(id(message))
        if index is None or index in used:
            if by_bytes is None:
                by_bytes = {}
                for position, own in enumerate(lifted.messages):
                    by_bytes.setdefault(canonical_bytes(own), []).append(position)
            index = _unused(by_bytes.get(canonical_bytes(message), ()), used)
        if index is not None:
            add(index)
            continue
        edited = _edited(lifted, message, used)
        if edited is not None:
            add(*edited)
            continue
        runs.append(_Run(None, made=_made(message)))
    return runs


def _unused(candidates: Iterable[int], used: set[int]) -> int | None:
    return next((index for index in candidates if index not in used), None)


def _edited(
    lifted: Lifted, message: Mapping[str, Any], used: set[int]
) -> tuple[int, dict[int, Any]] | None:
    """The piece a strategy edited, and its edited blocks by position."""
    role = message.get("role")
    call_id = message.get("tool_call_id")
    if role == "tool" and isinstance(call_id, str):
        index = _unused(lifted.results.get(call_id, ()), used)
        if index is None:
            return None
        owner = _owner(lifted, index)
        assert owner.blocks is not None
        position = owner.blocks[0]
        block = lifted.sources[owner.source]["content"][position]
        content = message.get("content")
        if content == lifted.messages[index].get("content"):
            return index, {}
        return index, {position: {**block, "content": result_content(content, block)}}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
        index = next(
            (lifted.calls[i] for i in ids if isinstance(i, str) and i in lifted.calls), None
        )
        if index is None or index in used:
            return None
        owner = _owner(lifted, index)
        return index, _edited_inputs(lifted.sources[owner.source], calls)
    return None


def _owner(lifted: Lifted, index: int) -> Owner:
    owner = lifted.owners[index]
    if owner is None:
        raise LowerError("the system block was edited")
    return owner


def _edited_inputs(source: Mapping[str, Any], calls: Sequence[Any]) -> dict[int, Any]:
    """The ``tool_use`` blocks whose input the edited message changed, by position."""
    arguments: dict[str, Any] = {}
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and isinstance(call.get("id"), str):
            arguments[call["id"]] = function.get("arguments")
    edited: dict[int, Any] = {}
    for position, block in enumerate(blocks_of(source.get("content"))):
        if block_type(block) != "tool_use" or block.get("id") not in arguments:
            continue
        value = _input(arguments[block["id"]])
        if value is not None and value != block.get("input"):
            edited[position] = {**block, "input": value}
    return edited


def _input(arguments: Any) -> dict[str, Any] | None:
    """A ``tool_use`` input for edited chat arguments (the API wants an object)."""
    if not isinstance(arguments, str):
        return None
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"note": arguments}
    return value if isinstance(value, dict) else {"value": value}


def result_content(content: Any, block: Mapping[str, Any]) -> Any:
    """A ``tool_result``'s ``content`` for a tool message's edited content: a string stays a
    string; text parts become text blocks; image parts become the client's own image blocks
    again, in order."""
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    original = block.get("content")
    images = iter(
        [b for b in original if block_type(b) == "image"] if isinstance(original, list) else []
    )
    out: list[Any] = []
    for part in content:
        kind = block_type(part)
        if kind == "text":
            out.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = next(images, None)
            if image is not None:
                out.append(image)
        else:
            out.append(part)
    return out


def _made(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message a strategy made up, as a Messages message with one text block."""
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if block_type(p) in ("text", "input_text")]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            content = "\n".join(str(t) for t in texts)
    if role not in NEW_ROLES or not isinstance(content, str) or message.get("tool_calls"):
        raise LowerError(f"a compacted {role!r} message maps back to no client message")
    # A system note inside `messages` is a beta some upstreams refuse; the top-level system
    # block is the client's and is never rewritten, so a made-up system note goes as user text.
    return {
        "role": "assistant" if role == "assistant" else "user",
        "content": [{"type": "text", "text": content}],
    }


def _emit(lifted: Lifted, run: _Run) -> Any:
    if run.made is not None:
        return run.made
    assert run.source is not None
    source = lifted.sources[run.source]
    if not run.replaced and sorted(run.indices) == sorted(lifted.pieces[run.source]):
        return source  # the client's own object: its own bytes go upstream
    content = source.get("content")
    if isinstance(content, str):
        return source  # one piece, never edited
    keep: set[int] | None = set()
    for index in run.indices:
        owner = _owner(lifted, index)
        if owner.blocks is None:
            keep = None
            break
        assert keep is not None
        keep.update(owner.blocks)
    blocks = [
        run.replaced.get(position, block)
        for position, block in enumerate(content)
        if keep is None or position in keep
    ]
    return {**source, "content": blocks}


def _keep_thinking_first(items: list[Any], runs: list[_Run]) -> None:
    """A made-up assistant message right before a turn of the model's that opens with thinking
    would merge into it (the API joins consecutive turns of one role), and the API wants such
    a turn to open with its thinking block: the made-up one goes as user text instead."""
    for position, run in enumerate(runs[:-1]):
        if run.made is None or run.made["role"] != "assistant":
            continue
        following = items[position + 1]
        if not isinstance(following, Mapping) or following.get("role") != "assistant":
            continue
        content = following.get("content")
        if isinstance(content, list) and content and block_type(content[0]) in THINKING_TYPES:
            run.made["role"] = "user"


def _cache_checkpoint(items: list[Any], runs: list[_Run], body: Mapping[str, Any]) -> None:
    """Put a breakpoint on the first made-up message (the checkpoint) when the request holds
    fewer than the API's four, with a TTL the API accepts there (a longer TTL may not follow a
    shorter one)."""
    made = next((p for p, run in enumerate(runs) if run.made is not None), None)
    if made is None:
        return
    system, tools = body.get("system"), body.get("tools")
    held = count_breakpoints(system) + count_breakpoints(tools) + count_breakpoints(items)
    if held >= MAX_BREAKPOINTS:
        return
    before = _ttls(tools) + _ttls(system) + _ttls(items[:made])
    after = _ttls(items[made + 1 :])
    ttl = max(after, default=None) if after else min(before, default=None)
    if ttl is not None and any(earlier < ttl for earlier in before):
        return
    control: dict[str, Any] = {"type": "ephemeral"}
    if ttl is not None and ttl != _FIVE_MINUTES:
        control["ttl"] = _TTL_NAMES[ttl]
    block = runs[made].made
    assert block is not None
    block["content"][-1][CACHE_CONTROL] = control


_FIVE_MINUTES = 300
_TTL_NAMES = {300: "5m", 3600: "1h"}


def _ttls(value: object) -> list[int]:
    """The TTLs (seconds) of the breakpoints in ``value``, in order."""
    out: list[int] = []
    if not isinstance(value, list):
        return out
    for element in value:
        if not isinstance(element, Mapping):
            continue
        control = element.get(CACHE_CONTROL)
        if isinstance(control, Mapping):
            out.append(3600 if control.get("ttl") == "1h" else _FIVE_MINUTES)
        inner = nested_blocks(element)
        if inner is not None:
            out.extend(_ttls(inner))
    return out
