"""What each Responses input item is to compaction: its role in a group and its pairing key.

The Responses API sends a conversation as a flat list of typed items where chat completions
sends role-tagged messages. Compaction needs only a few facts per item: is it part of the
system block, a user turn, something the model produced (text, reasoning, a tool call), or a
tool's answer; and for calls and answers, the id that pairs them. Everything else about an
item stays the client's business and goes upstream as it came.

Item types the proxy does not know are classified by shape, so a type added to the API later
still keeps its pairs together: an item with a ``call_id`` nobody declared yet opens a call,
one whose ``call_id`` an earlier item declared answers it; any other unknown item rides along
with its neighbour (see :mod:`.lift`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
SYSTEM_ROLES = frozenset({"system", "developer"})

CALL_KEYS: dict[str, str] = {
    "function_call": "call_id",
    "custom_tool_call": "call_id",
    "computer_call": "call_id",
    "local_shell_call": "call_id",
    "shell_call": "call_id",
    "apply_patch_call": "call_id",
    "mcp_approval_request": "id",
}
"""Calls answered by a separate output item, and the field that names the call."""

OUTPUT_KEYS: dict[str, tuple[str, ...]] = {
    "function_call_output": ("call_id",),
    "custom_tool_call_output": ("call_id",),
    "computer_call_output": ("call_id",),
    # The API names the call in `id` here; later versions also send `call_id`.
    "local_shell_call_output": ("call_id", "id"),
    "shell_call_output": ("call_id",),
    "apply_patch_call_output": ("call_id",),
    "mcp_approval_response": ("approval_request_id",),
}
"""Outputs and the fields (first present wins) that name the call they answer."""

TEXT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)
"""Outputs whose ``output`` may be replaced by text (a cleared or trimmed tool result)."""

PART_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
"""Outputs whose ``output`` may also be a list of content parts."""

BUILTIN_CALLS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "mcp_call",
        "mcp_list_tools",
        "code_interpreter_call",
        "image_generation_call",
    }
)
"""Hosted tool calls that carry their own result: one item is the whole exchange."""


class Kind(Enum):
    """The part an item plays in a conversation, as far as grouping goes."""

    SYSTEM = "system"  # a system or developer message
    USER = "user"  # a user message: starts a turn
    TEXT = "text"  # an assistant message
    CALL = "call"  # a call answered by a later output item
    BUILTIN = "builtin"  # a hosted call with its result inside
    OUTPUT = "output"  # a tool's answer to a call
    REASONING = "reasoning"  # the model's reasoning, attached to the item it precedes
    OTHER = "other"  # anything else: kept as sent, attached to a neighbour


def item_type(item: Mapping[str, Any]) -> str:
    """The item's type; an item without one is a message when it has a role (the API's
    "easy" input message), else an item reference."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else "item_reference"


def classify(item: Mapping[str, Any], declared: set[str]) -> tuple[Kind, str | None]:
    """``(kind, pairing id)`` of ``item``; ``declared`` holds the call ids seen so far.

    ``declared`` is updated: a call adds its id.
    """
    kind = item_type(item)
    if kind == "message":
        role = item.get("role")
        if role in SYSTEM_ROLES:
            return Kind.SYSTEM, None
        return (Kind.USER if role == "user" else Kind.TEXT), None
    if kind == "reasoning":
        return Kind.REASONING, None
    key = CALL_KEYS.get(kind)
    if key is not None:
        call_id = _string(item.get(key))
        if call_id is not None:
            declared.add(call_id)
        return Kind.CALL, call_id
    fields = OUTPUT_KEYS.get(kind)
    if fields is not None:
        return Kind.OUTPUT, next((v for v in map(_string, map(item.get, fields)) if v), None)
    if kind in BUILTIN_CALLS:
        return Kind.BUILTIN, _string(item.get("id"))
    call_id = _string(item.get("call_id"))
    if call_id is None:
        return Kind.OTHER, None
    if call_id in declared:
        return Kind.OUTPUT, call_id
    declared.add(call_id)
    return Kind.CALL, call_id


def _string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
