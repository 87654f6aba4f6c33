"""A compaction report as text for people: what `compaction-proxy compact` prints."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compaction_proxy.compaction import CompactionReport, ConversationView, StrategyReport
from compaction_proxy.compaction.archive import Archived
from compaction_proxy.compaction.chat_messages import role_of, tool_call_names

SPAN_MEMBERS_SHOWN = 6
"""A span line names at most this many of its members (then how many more)."""


def render(report: CompactionReport, view: ConversationView | None = None) -> str:
    lines = [
        f"model            {report.model}  (tokenizer {report.tokenizer}, mode {report.mode})",
        f"context window   {report.context_window:>9,}{_source(report, 'window_source')}",
        f"output reserve   {report.output_reserve:>9,}{_source(report, 'output_source')}",
        f"safety reserve   {report.safety_reserve:>9,}{_ratio(report)}",
        f"budget           {report.budget:>9,}",
        *_output_limit(report),
        f"tokens           {report.tokens_before:>9,} -> {report.tokens_after:,}"
        f"  ({_saved(report.tokens_before, report.tokens_after)})",
        f"messages         {report.messages_before:>9,} -> {report.messages_after:,}",
    ]
    if view is not None:
        lines += ["", "groups (before):", *_groups(view)]
    lines += ["", "strategies:"]
    steps: list[StrategyReport] = list(report.strategies)
    if report.fallback is not None:
        steps.append(report.fallback)
    if report.last_resort is not None:
        steps.append(report.last_resort)
    lines += _strategies(steps, indent="  ")
    kept = report.summary_kept
    if kept is not None:  # the exact strings and rules the summaries kept on their own
        lines += ["", f"summaries kept   {kept.figure()}"]
    if report.warnings:
        lines += ["", "warnings:", *(f"  - {w}" for w in report.warnings)]
    return "\n".join(lines)


_SOURCES = {
    "config": "declared in models:",
    "learned": "learned from a refusal",
    "discovered": "published by the upstream",
    "builtin": "built-in table",
    "default": "default_context_window",
    "given": "given",
    "request": "the request's max_tokens",
    "share": "the request's max_tokens, at most output_reserve_share of the window",
    "model": "the model's max_output_tokens",
}


def _source(report: CompactionReport, key: str) -> str:
    source = report.budget_sources.get(key)
    if key == "output_source" and source == "default":
        return "  (default: a quarter of the window, at most 4,096)"
    return f"  ({_SOURCES.get(str(source), str(source))})" if source else ""


def _output_limit(report: CompactionReport) -> list[str]:
    """The output limit forwarded, when the request asked one."""
    limit = report.output_limit
    if limit is None:
        return []
    if limit.lowered:
        return [
            f"output limit     {limit.asked:>9,} -> {limit.forwarded:,}"
            "  (lowered: the prompt and the limit asked would not fit the window)"
        ]
    return [f"output limit     {limit.asked:>9,}  (as asked)"]


def _ratio(report: CompactionReport) -> str:
    ratio = report.budget_sources.get("reserve_ratio")
    return f"  (reserveRatio {ratio:g} of the window)" if isinstance(ratio, float | int) else ""


def _saved(before: int, after: int) -> str:
    if before <= 0 or after >= before:
        return "unchanged"
    return f"-{before - after:,} tokens, {100 * (before - after) / before:.1f}% saved"


def _groups(view: ConversationView) -> list[str]:
    out = []
    for group in view.groups:
        turn = "-" if group.turn is None else str(group.turn)
        out.append(
            f"  #{group.index:<4} {group.kind!s:<15} turn {turn:>4}  "
            f"{group.message_count:>3} msg  {group.token_count:>8,} tokens"
        )
    return out


def _strategies(steps: Sequence[StrategyReport], indent: str) -> list[str]:
    out = []
    for step in steps:
        if not step.fired:
            status = f"skipped ({step.skipped or 'trigger'})"
        elif step.changed:
            status = (
                f"{step.tokens_before:,} -> {step.tokens_after:,} tokens, "
                f"{step.groups_affected} group(s), {step.messages_affected} message(s)"
            )
        else:
            status = "fired, nothing to change"
        out.append(f"{indent}{step.name:<24} {status}")
        for note in step.notes:
            out.append(f"{indent}    {note}")
        out += _strategies(step.children, indent + "  ")
    return out


def render_archived(
    archived: Archived | None,
    tokens: Callable[[Mapping[str, Any]], int],
    names: Mapping[str, str],
) -> str:
    """What a compaction archived (``compaction.recall``): one line per recall id, oldest
    first: an original's role, its tool's name and its tokens (``tokens``: the model's count of
    one message); a span's members.  ``names``: tool call id -> tool name (a result names no
    tool itself).  Never content: ids, roles and names only."""
    if archived is None:
        return "archived (recall): nothing"
    lines = [
        f"archived (recall): {len(archived.originals)} original(s), {len(archived.spans)} span(s)"
    ]
    for recall_id in archived.order:
        original = archived.originals.get(recall_id)
        members = archived.spans.get(recall_id)
        if original is not None:
            role = role_of(original) or "?"
            lines.append(
                f"  {recall_id}  {role:<10} {_tool_of(original, names):<24} "
                f"{tokens(original):>8,} tokens"
            )
        elif members is not None:
            shown = ", ".join(members[:SPAN_MEMBERS_SHOWN])
            more = len(members) - SPAN_MEMBERS_SHOWN
            rest = f" and {more} more" if more > 0 else ""
            lines.append(f"  {recall_id}  {'span':<10} of {len(members)}: {shown}{rest}")
        else:  # a stub dropped again: its original was archived by an earlier compaction
            lines.append(f"  {recall_id}  {'stub':<10} (archived earlier)")
    return "\n".join(lines)


def _tool_of(message: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """The tool a message concerns: a result's tool, an assistant's called ones; or ``-``."""
    role = role_of(message)
    if role == "tool":
        call_id = message.get("tool_call_id")
        return names.get(call_id, "?") if isinstance(call_id, str) else "?"
    if role == "function":
        name = message.get("name")
        return name if isinstance(name, str) else "?"
    called = list(dict.fromkeys(tool_call_names(message).values()))
    function = message.get("function_call")
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        called.append(function["name"])
    return "calls " + ", ".join(called) if called else "-"
