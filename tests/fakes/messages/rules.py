"""What the real Messages API refuses in a request's structure, in its words.

Only the rules a compacting proxy can break are checked, each with the API's message:

- required fields: ``model``, ``messages`` (a list), ``max_tokens`` (an integer >= 1) on
  ``/v1/messages`` (not on ``count_tokens``);
- roles: ``user``, ``assistant``, and ``system`` (Claude Code's mid-conversation system notes,
  accepted under a beta it sends; the fake accepts them always), and ``system`` only as text;
- non-empty content: every message but an optional final assistant one, and no empty text
  block;
- alternation: none beyond that, as today's API (consecutive turns of one role are combined);
- tool pairing: every ``tool_use`` of an assistant message is answered by a ``tool_result`` in
  the next message, every ``tool_result`` answers a ``tool_use`` of the previous message, and
  ``tool_use`` ids are unique;
- at most 4 blocks with ``cache_control``.

Thinking blocks (signatures, binding, the final-turn rule) are checked in
:mod:`tests.fakes.messages.signing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.fakes.messages.cache import MAX_BREAKPOINTS
from tests.fakes.messages.prompt import Prompt, content_blocks, system_blocks

ROLES = ("user", "assistant", "system")


def structure_problem(payload: Any, *, needs_max_tokens: bool) -> str | None:
    """The first structural error in ``payload``, worded as the API words it; None if valid."""
    if not isinstance(payload, dict):
        return "Input should be a valid dictionary"
    if not isinstance(payload.get("model"), str) or not payload["model"]:
        return "model: Field required"
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return (
            "messages: Field required"
            if messages is None
            else "messages: Input should be a valid list"
        )
    if needs_max_tokens:
        limit = payload.get("max_tokens")
        if limit is None:
            return "max_tokens: Field required"
        if not isinstance(limit, int) or isinstance(limit, bool):
            return "max_tokens: Input should be a valid integer"
        if limit < 1:
            return "max_tokens: Input should be greater than or equal to 1"
    for index, block in enumerate(system_blocks(payload.get("system"))):
        if not isinstance(block, dict) or block.get("type") != "text":
            return f"system.{index}.type: Input should be 'text'"
    return _message_problem(messages) or _pairing_problem(messages)  # pairing needs valid roles


def _message_problem(messages: Sequence[Any]) -> str | None:
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{index}: Input should be a valid dictionary"
        role = message.get("role")
        if role not in ROLES:
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if not isinstance(content, str | list):
            return f"messages.{index}.content: Field required"
        final_assistant = role == "assistant" and index == len(messages) - 1
        if not content and not final_assistant:
            return (
                f"messages.{index}: all messages must have non-empty content except for "
                "the optional final assistant message"
            )
        for b_index, block in enumerate(content_blocks(content) if content else []):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                return f"messages.{index}.content.{b_index}.type: Field required"
            if block["type"] == "text" and not block.get("text") and isinstance(content, list):
                return "messages: text content blocks must be non-empty"
            if role == "system" and block["type"] != "text":
                return f"messages.{index}.content.{b_index}.type: Input should be 'text'"
    return None


def _tool_uses(message: Any) -> list[str]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    return [
        str(block.get("id"))
        for block in content_blocks(message.get("content"))
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


def _pairing_problem(messages: Sequence[Any]) -> str | None:
    seen: set[str] = set()
    for index, message in enumerate(messages):
        for b_index, block in enumerate(content_blocks(message.get("content"))):
            if block.get("type") == "tool_use" and message.get("role") == "assistant":
                if block.get("id") in seen:
                    return f"messages.{index}.content.{b_index}: `tool_use` ids must be unique"
                seen.add(str(block.get("id")))
        previous = _tool_uses(messages[index - 1]) if index else []
        if message.get("role") == "user":
            for b_index, block in enumerate(content_blocks(message.get("content"))):
                if block.get("type") != "tool_result":
                    continue
                if block.get("tool_use_id") not in previous:
                    return (
                        f"messages.{index}.content.{b_index}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous "
                        "message."
                    )
        uses = _tool_uses(message)
        if not uses or index == len(messages) - 1:
            continue
        following = messages[index + 1]
        answered = {
            block.get("tool_use_id")
            for block in content_blocks(following.get("content"))
            if following.get("role") == "user" and block.get("type") == "tool_result"
        }
        missing = [use for use in uses if use not in answered]
        if missing:
            return (
                f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
    return None


def breakpoint_problem(prompt: Prompt) -> str | None:
    found = len(prompt.breakpoints())
    if found > MAX_BREAKPOINTS:
        return (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    return None


def unsupported_field_problem(payload: dict[str, Any], unsupported: Sequence[str]) -> str | None:
    """A server that does not know a field (``context_management`` on a local server, say)."""
    for name in unsupported:
        if name in payload:
            return f"{name}: Extra inputs are not permitted"
    return None
