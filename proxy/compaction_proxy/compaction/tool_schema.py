"""Approximate token cost of the request's ``tools`` (or legacy ``functions``) schema.

OpenAI does not publish how it bills function definitions.  Public measurements agree that the
model sees them rendered as a TypeScript-like namespace inside the system prompt::

    # Tools

    ## functions

    namespace functions {

    // Get the weather.
    type get_weather = (_: {
    // City name
    city: string,
    unit?: "c" | "f",
    }) => any;

    } // namespace functions

We render that text ourselves and count it with the request's encoding, plus a small constant for
the surrounding envelope.  It tracks the real cost within a few percent for flat schemas; deeply
nested schemas are rendered recursively and may drift, which the calibration ratio (see "Budget and
tokens" in compaction_proxy/compaction/README.md) absorbs.  Non-function tools (e.g. ``custom``)
are counted as their
JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .canonical import canonical_bytes

TOOLS_ENVELOPE_TOKENS = 9
"""Tokens for the wrapper around the rendered namespace (system section framing)."""


def count_tools_tokens(
    tools: Sequence[Mapping[str, Any]] | None, count_text: Callable[[str], int]
) -> int:
    """Token estimate of ``tools``; 0 when there are none."""
    if not tools:
        return 0
    functions: list[Mapping[str, Any]] = []
    extra = 0
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping):
            functions.append(function)
        elif "name" in tool and "type" not in tool:  # legacy `functions` entry
            functions.append(tool)
        else:
            extra += count_text(canonical_bytes(tool).decode("utf-8"))
    if not functions:
        return extra
    return count_text(render_functions(functions)) + TOOLS_ENVELOPE_TOKENS + extra


def render_functions(functions: Sequence[Mapping[str, Any]]) -> str:
    """Render function definitions as the TypeScript namespace the model sees."""
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for function in functions:
        name = str(function.get("name", ""))
        description = function.get("description")
        if isinstance(description, str) and description:
            lines.extend(f"// {line}" for line in description.splitlines())
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping) and properties:
            assert isinstance(parameters, Mapping)
            lines.append(f"type {name} = (_: {{")
            lines.extend(_render_properties(parameters, indent=""))
            lines.append("}) => any;")
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_properties(schema: Mapping[str, Any], indent: str) -> list[str]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    required = schema.get("required")
    required_set = set(required) if isinstance(required, list) else set()
    lines: list[str] = []
    for key, prop in properties.items():
        prop_schema: Mapping[str, Any] = prop if isinstance(prop, Mapping) else {}
        description = prop_schema.get("description")
        if isinstance(description, str) and description:
            lines.extend(f"{indent}// {line}" for line in description.splitlines())
        optional = "" if key in required_set else "?"
        type_text = _render_type(prop_schema, indent)
        lines.append(f"{indent}{key}{optional}: {type_text},")
    return lines


def _render_type(schema: Mapping[str, Any], indent: str) -> str:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(canonical_bytes(item).decode("utf-8") for item in enum)
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_render_type({**schema, "type": item}, indent) for item in kind)
    if kind == "array":
        items = schema.get("items")
        inner = _render_type(items, indent) if isinstance(items, Mapping) else "any"
        return f"{inner}[]"
    if kind == "object" or "properties" in schema:
        inner_lines = _render_properties(schema, indent + "  ")
        if not inner_lines:
            return "object"
        return "{\n" + "\n".join(inner_lines) + f"\n{indent}}}"
    if kind == "integer":
        return "number"
    if isinstance(kind, str):
        return kind
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            return " | ".join(
                _render_type(option, indent) for option in options if isinstance(option, Mapping)
            )
    return "any"
