"""Helpers the tool-output strategies share: which messages of a group are answered results,
the tool name behind a result, the newest-N selections, and the text of a result's content.

Everything reads the draft's *current* messages (``draft.message(i)``) and never mutates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from ...chat_messages import legacy_function_name, role_of, tool_call_ids, tool_call_names
from ...draft import Draft
from ...view import Group, GroupKind


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One result message answering a call of the same group.

    ``call_index`` is the assistant message that declared the call; ``call_id`` is ``None`` for
    a legacy ``function`` result; ``name`` is the function name ("" when unknown).
    """

    index: int
    call_index: int
    call_id: str | None
    name: str


def answered_results(draft: Draft, group: Group) -> list[ToolResult]:
    """The results of ``group`` that answer one of its calls, in message order.

    Orphans the view attached to the group (a result whose id no call of the group declared,
    or a second answer to an already answered id) are not listed: they stay exactly as the
    client sent them (see "Groups and invariants" in compaction_proxy/compaction/README.md).
    """
    if group.kind is not GroupKind.TOOL_CALL:
        return []
    pending: dict[str, tuple[int, str]] = {}
    pending_functions: dict[str, list[int]] = {}
    out: list[ToolResult] = []
    for index in group.members:
        message = draft.message(index)
        role = role_of(message)
        if role == "assistant":
            for call_id, name in tool_call_names(message).items():
                pending[call_id] = (index, name)
            for call_id in tool_call_ids(message):
                pending.setdefault(call_id, (index, ""))
            function = legacy_function_name(message)
            if function is not None:
                pending_functions.setdefault(function, []).append(index)
        elif role == "tool":
            result_id = message.get("tool_call_id")
            if isinstance(result_id, str) and result_id in pending:
                call_index, call_name = pending.pop(result_id)
                out.append(ToolResult(index, call_index, result_id, call_name))
        elif role == "function":
            function_name = message.get("name")
            if isinstance(function_name, str) and pending_functions.get(function_name):
                call_index = pending_functions[function_name].pop()
                out.append(ToolResult(index, call_index, None, function_name))
    return out


def kept_tool_call_groups(draft: Draft) -> list[Group]:
    """Kept ``tool_call`` groups, oldest first (protected ones included)."""
    return [g for g in draft.groups if g.kind is GroupKind.TOOL_CALL and draft.is_kept(g)]


def newest(groups: list[Group], count: int) -> frozenset[int]:
    """Indices of the newest ``count`` groups of ``groups``."""
    if count <= 0:
        return frozenset()
    return frozenset(g.index for g in groups[-count:])


def newest_non_system(draft: Draft, count: int) -> frozenset[int]:
    """Indices of the newest ``count`` kept non-system groups (a ``minimum_preserved`` floor)."""
    if count <= 0:
        return frozenset()
    return newest(
        [g for g in draft.groups if g.kind is not GroupKind.SYSTEM and draft.is_kept(g)], count
    )


def is_text_part(part: object) -> TypeGuard[Mapping[str, Any]]:
    """True for a ``{"type": "text", "text": "..."}`` content part."""
    return (
        isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def joined_text(parts: Sequence[object]) -> str:
    """The text of the text parts of ``parts``, joined by newlines (other parts skipped)."""
    return "\n".join(part["text"] for part in parts if is_text_part(part))


def all_text(content: object) -> str | None:
    """The text of a content that is all text: a string, or text parts only (joined by
    newlines); ``None`` for anything else (images, an empty list, no content)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(is_text_part(p) for p in content):
        return joined_text(content)
    return None


def text_part_like(parts: Sequence[object], text: str) -> dict[str, Any]:
    """A text part holding ``text`` with the extra keys of the last text part of ``parts``."""
    last = next((p for p in reversed(parts) if is_text_part(p)), None)
    extra = (
        {k: v for k, v in last.items() if k not in ("type", "text")}
        if isinstance(last, Mapping)
        else {}
    )
    return {"type": "text", "text": text, **extra}
