"""Shape checks for the HTTP edge, returning OpenAI-style error details.

Validation belongs to the edge (the core tolerates anything and treats unknown roles as
assistant text), but the rules about what compaction can handle live here, next to the
grouping they protect.  Orphan tool results are NOT errors: clients send them and the view
leaves them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .messages import KNOWN_ROLES


@dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One problem: a human message and the OpenAI ``param`` path it concerns."""

    message: str
    param: str


def validate_messages(messages: object) -> ValidationIssue | None:
    """The first problem in ``messages`` (the request's ``messages`` value), or ``None``.

    Checks: a non-empty list of objects; a known ``role``; ``content`` is a string, a list or
    null; ``tool`` messages carry a string ``tool_call_id``; ``function`` messages a string
    ``name``; assistant ``tool_calls`` is a list of objects with a string ``id``.
    """
    if not isinstance(messages, list):
        return ValidationIssue("'messages' must be an array", "messages")
    if not messages:
        return ValidationIssue("'messages' must contain at least one message", "messages")
    for index, message in enumerate(messages):
        issue = _check_message(message, f"messages[{index}]")
        if issue is not None:
            return issue
    return None


def _check_message(message: object, path: str) -> ValidationIssue | None:
    if not isinstance(message, Mapping):
        return ValidationIssue(f"{path} must be an object", path)
    role = message.get("role")
    if not isinstance(role, str):
        return ValidationIssue(f"{path}.role is required and must be a string", f"{path}.role")
    if role not in KNOWN_ROLES:
        return ValidationIssue(
            f"{path}.role {role!r} is not supported; expected one of "
            f"{', '.join(sorted(KNOWN_ROLES))}",
            f"{path}.role",
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        return ValidationIssue(
            f"{path}.content must be a string, an array of content parts or null", f"{path}.content"
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        return ValidationIssue(
            f"{path}: a tool message needs a string 'tool_call_id'", f"{path}.tool_call_id"
        )
    if role == "function" and not isinstance(message.get("name"), str):
        return ValidationIssue(f"{path}: a function message needs a string 'name'", f"{path}.name")
    calls = message.get("tool_calls")
    if role == "assistant" and calls is not None:
        if not isinstance(calls, list):
            return ValidationIssue(f"{path}.tool_calls must be an array", f"{path}.tool_calls")
        for i, call in enumerate(calls):
            call_path = f"{path}.tool_calls[{i}]"
            if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
                return ValidationIssue(
                    f"{call_path} must be an object with a string 'id'", f"{call_path}.id"
                )
    return None
