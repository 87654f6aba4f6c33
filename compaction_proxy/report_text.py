"""A compaction report as text for people: what `compaction-proxy compact` prints."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_proxy.compaction import CompactionReport, ConversationView, StrategyReport


def render(report: CompactionReport, view: ConversationView | None = None) -> str:
    lines = [
        f"model            {report.model}  (tokenizer {report.tokenizer}, mode {report.mode})",
        f"context window   {report.context_window:>9,}",
        f"output reserve   {report.output_reserve:>9,}",
        f"safety reserve   {report.safety_reserve:>9,}",
        f"budget           {report.budget:>9,}",
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
    if report.warnings:
        lines += ["", "warnings:", *(f"  - {w}" for w in report.warnings)]
    return "\n".join(lines)


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
