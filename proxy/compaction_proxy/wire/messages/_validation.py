"""Shape checks on a Messages request before it is compacted.

Only what compaction reads is checked: roles, the blocks that pair (``tool_use`` ids, names and
inputs; ``tool_result`` ids) and the content it counts or edits. Everything else (block types
the proxy does not know, fields it does not read) is the upstream's to judge: the proxy must not
refuse what the upstream would take. A request that fails a check here would fail upstream too,
and gets a 400 naming the offending field instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compaction_proxy.compaction.validation import (
    MAX_CONTENT_PARTS,
    ValidationIssue,
    nesting_issue,
    tools_issue,
)

from ._blocks import ROLES, block_type

MAX_MESSAGES = 100_000


def validate_request(body: Mapping[str, Any]) -> ValidationIssue | None:
    """The first problem with ``messages``, ``system`` or ``tools``, or ``None``."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ValidationIssue("'messages' must be an array of messages", "messages")
    if len(messages) > MAX_MESSAGES:
        return ValidationIssue(
            f"'messages' has {len(messages)} messages; at most {MAX_MESSAGES} are accepted",
            "messages",
        )
    for index, message in enumerate(messages):
        issue = check_message(message, f"messages.{index}")
        if issue is not None:
            return issue
    system = body.get("system")
    if system is not None:
        issue = _check_system(system)
        if issue is not None:
            return issue
    issue = tools_issue(body.get("tools"), "tools.{}")
    if issue is not None:
        return issue
    for key in ("system", "tools"):
        issue = nesting_issue(body.get(key), key)
        if issue is not None:
            return issue
    return None


def _check_system(system: object) -> ValidationIssue | None:
    if isinstance(system, str):
        return None
    if not isinstance(system, list):
        return ValidationIssue("'system' must be a string or an array of text blocks", "system")
    for index, block in enumerate(system):
        if block_type(block) != "text" or not isinstance(block.get("text"), str):
            return ValidationIssue(
                f"system.{index} must be a text block with a string 'text'", f"system.{index}"
            )
    return None


def check_message(message: object, path: str) -> ValidationIssue | None:
    """The first problem with one message (see the module docstring)."""
    if not isinstance(message, Mapping):
        return ValidationIssue(f"{path} must be an object", path)
    role = message.get("role")
    if role not in ROLES:
        return ValidationIssue(
            f"{path}.role must be one of 'user', 'assistant' or 'system', not {role!r}",
            f"{path}.role",
        )
    content = message.get("content")
    if isinstance(content, str):
        return nesting_issue(message, path)
    if not isinstance(content, list):
        return ValidationIssue(
            f"{path}.content must be a string or an array of content blocks", f"{path}.content"
        )
    if len(content) > MAX_CONTENT_PARTS:
        return ValidationIssue(
            f"{path}.content has {len(content)} blocks; at most {MAX_CONTENT_PARTS} are accepted",
            f"{path}.content",
        )
    for index, block in enumerate(content):
        issue = _check_block(block, str(role), f"{path}.content.{index}")
        if issue is not None:
            return issue
    return nesting_issue(message, path)


def _check_block(block: object, role: str, path: str) -> ValidationIssue | None:
    kind = block_type(block)
    if kind is None:
        return ValidationIssue(f"{path} must be an object with a string 'type'", f"{path}.type")
    assert isinstance(block, Mapping)
    if kind == "text" and not isinstance(block.get("text"), str):
        return ValidationIssue(f"{path}.text must be a string", f"{path}.text")
    if kind == "tool_use":
        if role != "assistant":
            return ValidationIssue(f"{path}: tool_use blocks belong to assistant messages", path)
        for name in ("id", "name"):
            if not isinstance(block.get(name), str) or not block.get(name):
                return ValidationIssue(
                    f"{path}.{name} must be a non-empty string", f"{path}.{name}"
                )
        if not isinstance(block.get("input"), Mapping):
            return ValidationIssue(f"{path}.input must be an object", f"{path}.input")
    if kind == "tool_result":
        if role != "user":
            return ValidationIssue(f"{path}: tool_result blocks belong to user messages", path)
        if not isinstance(block.get("tool_use_id"), str) or not block.get("tool_use_id"):
            return ValidationIssue(
                f"{path}.tool_use_id must be a non-empty string", f"{path}.tool_use_id"
            )
        inner = block.get("content")
        if inner is not None and not isinstance(inner, str | list):
            return ValidationIssue(
                f"{path}.content must be a string or an array of content blocks",
                f"{path}.content",
            )
        if isinstance(inner, list):
            for number, part in enumerate(inner):
                if block_type(part) is None:
                    return ValidationIssue(
                        f"{path}.content.{number} must be an object with a string 'type'",
                        f"{path}.content.{number}.type",
                    )
    return None
