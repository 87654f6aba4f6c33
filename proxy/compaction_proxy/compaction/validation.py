"""Shape checks for the HTTP edge, returning OpenAI-style error details.

Validation belongs to the edge (the core tolerates anything and treats unknown roles as
assistant text), but the rules about what compaction can handle live here, next to the
grouping they protect.  Orphan tool results are NOT errors: clients send them and the view
leaves them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .chat_messages import KNOWN_ROLES

MAX_DEPTH = 64
"""How deeply a message's values may nest.  Real requests stay under ten levels; a hostile one
of hundreds of nested arrays would otherwise reach the canonical serializer (which refuses
depth 255) or a recursive walk, and turn into a 500 instead of a clear 400."""

MAX_CONTENT_PARTS = 10_000
"""Content parts per message: far above any real request (images and text blocks)."""


@dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One problem: a human message and the OpenAI ``param`` path it concerns."""

    message: str
    param: str


def validate_messages(messages: object, *, start: int = 0) -> ValidationIssue | None:
    """The first problem in ``messages`` (the request's ``messages`` value), or ``None``.

    ``start``: how many leading messages are known to pass (the same objects passed in the
    conversation's previous request: each message is checked on its own, so a verdict once
    given holds); only the ones after them are checked.

    Checks: a non-empty list of objects; a known ``role``; ``content`` is a string, a list of
    content parts or null; each part an object with a string ``type`` (a ``text`` part with a
    string ``text``), at most :data:`MAX_CONTENT_PARTS` of them; ``tool`` messages carry a
    string ``tool_call_id``; ``function`` messages a string ``name``; assistant ``tool_calls``
    is a list of objects with a string ``id``; nothing nests deeper than :data:`MAX_DEPTH`.
    Part types beyond ``text`` are not checked further: upstreams accept their own (audio,
    files, video), and the proxy must not refuse what the upstream would take.
    """
    if not isinstance(messages, list):
        return ValidationIssue("'messages' must be an array", "messages")
    if not messages:
        return ValidationIssue("'messages' must contain at least one message", "messages")
    for index in range(start, len(messages)):
        issue = _check_message(messages[index], f"messages[{index}]")
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
    if isinstance(content, list):
        issue = _check_parts(content, f"{path}.content")
        if issue is not None:
            return issue
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
    for key, value in message.items():
        if key != "content" and isinstance(value, list | Mapping):
            issue = nesting_issue(value, f"{path}.{key}", depth=2)
            if issue is not None:
                return issue
    return None


def _check_parts(parts: list[object], path: str) -> ValidationIssue | None:
    if len(parts) > MAX_CONTENT_PARTS:
        return ValidationIssue(
            f"{path} has {len(parts)} content parts; at most {MAX_CONTENT_PARTS} are accepted",
            path,
        )
    for index, part in enumerate(parts):
        part_path = f"{path}[{index}]"
        if not isinstance(part, Mapping):
            return ValidationIssue(
                f"{part_path} must be a content part object, not {_kind(part)}", part_path
            )
        kind = part.get("type")
        if not isinstance(kind, str):
            return ValidationIssue(f"{part_path} needs a string 'type'", f"{part_path}.type")
        if kind == "text" and not isinstance(part.get("text"), str):
            return ValidationIssue(
                f"{part_path}: a text part needs a string 'text'", f"{part_path}.text"
            )
        issue = nesting_issue(part, part_path, depth=3)
        if issue is not None:
            return issue
    return None


def tools_issue(tools: object, item_path: str) -> ValidationIssue | None:
    """The first problem with a request's ``tools`` (absent, or an array of objects), the
    offending tool's path written as the format's own (``item_path``: ``"tools.{}"``,
    ``"tools[{}]"``). What each tool holds is the upstream's to judge."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        return ValidationIssue("'tools' must be an array", "tools")
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            path = item_path.format(index)
            return ValidationIssue(f"{path} must be an object", path)
    return None


def nesting_issue(
    value: object, path: str, *, depth: int = 1, limit: int = MAX_DEPTH
) -> ValidationIssue | None:
    """An issue when ``value`` (found at ``depth``) nests past ``limit``; no recursion, so a
    hostile body cannot exhaust the stack either."""
    stack: list[tuple[object, int]] = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return ValidationIssue(f"{path} is nested more than {limit} levels deep", path)
        if isinstance(item, Mapping):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return None


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """How much one compacted request may hold (``server.max_messages`` and
    ``server.max_content_parts``): the work and memory of compacting it grow with these, not
    with its bytes, so a body of a million tiny messages well under the byte limit is refused
    rather than held in memory many times over."""

    max_messages: int
    max_content_parts: int


@dataclass(frozen=True, slots=True)
class LimitIssue:
    """A request over a :class:`SizeLimits` bound: answered 413, naming the config key."""

    message: str
    param: str
    code: str


def size_issue(
    items: object, limits: SizeLimits, *, param: str, start: int = 0, parts: int = 0
) -> LimitIssue | None:
    """Whether ``items`` (chat ``messages`` or Responses ``input`` items, named ``param``)
    passes ``limits``: its length, then the content parts of all its entries (a ``content``
    list, or a Responses call output's ``output`` list).

    ``start`` / ``parts``: the leading entries already counted and their parts (the
    conversation's previous request, compaction_proxy/engine/_known.py)."""
    if not isinstance(items, list):
        return None
    if len(items) > limits.max_messages:
        return LimitIssue(
            f"'{param}' has {len(items):,} entries; this proxy accepts at most "
            f"{limits.max_messages:,} per request (server.max_messages)",
            param,
            "too_many_messages",
        )
    for index in range(start, len(items)):
        parts += item_parts(items[index])
    if parts > limits.max_content_parts:
        return LimitIssue(
            f"'{param}' has {parts:,} content parts in all; this proxy accepts at most "
            f"{limits.max_content_parts:,} per request (server.max_content_parts)",
            param,
            "too_many_content_parts",
        )
    return None


def item_parts(item: object) -> int:
    """The content parts :func:`size_issue` counts for one entry: its ``content`` list, and a
    Responses call output's ``output`` list."""
    if not isinstance(item, Mapping):
        return 0
    parts = 0
    content = item.get("content")
    if isinstance(content, list):
        parts += len(content)
    output = item.get("output")
    if isinstance(output, list):
        parts += len(output)
    return parts
