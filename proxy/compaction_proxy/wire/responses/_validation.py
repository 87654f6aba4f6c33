"""Shape checks on a Responses request before it is compacted, as OpenAI-style issues.

Only what compaction reads is checked: the fields that group and pair items (roles, call ids)
and the content it counts or edits. Everything else (unknown item types, fields the proxy
does not know, part types beyond text) is the upstream's to judge: the proxy must not refuse
what the upstream would take. A request that fails a check here would fail upstream too, and
gets a 400 that names the offending field instead.
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

from ._items import CALL_KEYS, MESSAGE_ROLES, OUTPUT_KEYS, PART_OUTPUTS, item_type

MAX_ITEMS = 100_000
"""Input items per request: far above any real conversation."""

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_NAMED = {"function_call": "arguments", "custom_tool_call": "input"}
_STRING_OUTPUTS = frozenset({"local_shell_call_output", "apply_patch_call_output"})


def validate_request(body: Mapping[str, Any]) -> ValidationIssue | None:
    """The first problem with ``input``, ``instructions`` or ``tools``, or ``None``."""
    value = body.get("input")
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            return ValidationIssue(
                f"'input' has {len(value)} items; at most {MAX_ITEMS} are accepted", "input"
            )
        for index, item in enumerate(value):
            issue = check_item(item, f"input[{index}]")
            if issue is not None:
                return issue
    elif value is not None and not isinstance(value, str):
        return ValidationIssue("'input' must be a string or an array of input items", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str | list):
        return ValidationIssue("'instructions' must be a string", "instructions")
    issue = tools_issue(body.get("tools"), "tools[{}]")
    if issue is not None:
        return issue
    for key in ("instructions", "tools"):
        issue = nesting_issue(body.get(key), key)
        if issue is not None:
            return issue
    return None


def check_item(item: object, path: str) -> ValidationIssue | None:
    """The first problem with one input item (see the module docstring)."""
    if not isinstance(item, Mapping):
        return ValidationIssue(f"{path} must be an object", path)
    for key in ("type", "role"):
        if key in item and not isinstance(item[key], str):
            return ValidationIssue(f"{path}.{key} must be a string", f"{path}.{key}")
    kind = item_type(item)
    issue: ValidationIssue | None = None
    if kind == "message":
        issue = _check_message(item, path)
    elif kind in CALL_KEYS:
        names = [CALL_KEYS[kind]]
        if kind in _NAMED:
            names += ["name", _NAMED[kind]]
        issue = _strings(item, path, names)
    elif kind in OUTPUT_KEYS:
        issue = _check_output(item, kind, path)
    if issue is not None:
        return issue
    # Level 3: where the item sits once it rides in a chat message's extra field, which the
    # checkpoint store checks like any message (compaction_proxy/compaction/validation.py).
    return nesting_issue(item, path, depth=3)


def _strings(item: Mapping[str, Any], path: str, names: list[str]) -> ValidationIssue | None:
    for name in names:
        if not isinstance(item.get(name), str):
            return ValidationIssue(
                f"{path}: a {item_type(item)} item needs a string '{name}'", f"{path}.{name}"
            )
    return None


def _check_message(item: Mapping[str, Any], path: str) -> ValidationIssue | None:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        return ValidationIssue(
            f"{path}.role {role!r} is not supported; expected one of "
            f"{', '.join(sorted(MESSAGE_ROLES))}",
            f"{path}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return ValidationIssue(
            f"{path}.content must be a string or an array of content parts", f"{path}.content"
        )
    return _check_parts(content, f"{path}.content")


def _check_output(item: Mapping[str, Any], kind: str, path: str) -> ValidationIssue | None:
    fields = OUTPUT_KEYS[kind]
    if not any(isinstance(item.get(name), str) for name in fields):
        return ValidationIssue(
            f"{path}: a {kind} item needs a string '{fields[0]}'", f"{path}.{fields[0]}"
        )
    output = item.get("output")
    if kind in PART_OUTPUTS:
        if isinstance(output, list):
            return _check_parts(output, f"{path}.output")
        if not isinstance(output, str):
            return ValidationIssue(
                f"{path}.output must be a string or an array of content parts", f"{path}.output"
            )
        return None
    # A shell's output is a string; a patch's is optional.
    required = kind == "local_shell_call_output"
    if kind in _STRING_OUTPUTS and not isinstance(output, str) and (required or output is not None):
        return ValidationIssue(f"{path}.output must be a string", f"{path}.output")
    return None


def _check_parts(parts: list[Any], path: str) -> ValidationIssue | None:
    if len(parts) > MAX_CONTENT_PARTS:
        return ValidationIssue(
            f"{path} has {len(parts)} content parts; at most {MAX_CONTENT_PARTS} are accepted",
            path,
        )
    for index, part in enumerate(parts):
        where = f"{path}[{index}]"
        if not isinstance(part, Mapping):
            return ValidationIssue(f"{where} must be a content part object", where)
        kind = part.get("type")
        if not isinstance(kind, str):
            return ValidationIssue(f"{where} needs a string 'type'", f"{where}.type")
        if kind in _TEXT_PARTS and not isinstance(part.get("text"), str):
            return ValidationIssue(f"{where}: a {kind} part needs a string 'text'", f"{where}.text")
    return None
