"""Exact-match scoring: which must-keep strings of a transcript are still in what the proxy
forwarded. No judge model: a string counts only if it is there character for character.

The folded part of a variant is the set of items whose source message is not forwarded
unchanged (summarized, collapsed, trimmed or dropped); the share kept is over that set, per item
type. The same items are also scored against the summary text alone, to see what the model
kept on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.quality.transcripts import ITEM_TYPES, Item, Message

SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _strings(inner)


def message_text(message: Message) -> str:
    """Everything a model reads of one message: its text (string or text parts) and its tool
    calls' names and arguments (decoded, so a quoted string matches as written)."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        parts.append(str(function.get("name", "")))
        arguments = function.get("arguments", "")
        try:
            parts += list(_strings(json.loads(arguments)))
        except (TypeError, ValueError):
            parts.append(str(arguments))
    return "\n".join(parts)


def request_text(messages: Sequence[Message]) -> str:
    return "\n".join(message_text(m) for m in messages)


def summary_text(messages: Sequence[Message]) -> str:
    """The text of every ``<summary>`` block the forwarded messages carry (empty if none)."""
    return "\n".join(m for text in map(message_text, messages) for m in SUMMARY.findall(text))


def folded_items(
    items: Sequence[Item], original: Sequence[Message], forwarded: Sequence[Message]
) -> list[Item]:
    """Items whose source message was not forwarded unchanged."""
    kept = [json.dumps(m, sort_keys=True) for m in forwarded]
    unchanged = {i for i, m in enumerate(original) if json.dumps(m, sort_keys=True) in kept}
    return [item for item in items if item.message not in unchanged]


@dataclass
class Tally:
    """Kept / total per item type."""

    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ITEM_TYPES, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ITEM_TYPES, 0))
    missing: list[Item] = field(default_factory=list)

    def add(self, items: Iterable[Item], text: str) -> Tally:
        for item in items:
            self.total[item.kind] += 1
            if item.text in text:
                self.kept[item.kind] += 1
            else:
                self.missing.append(item)
        return self

    def merge(self, other: Tally) -> Tally:
        for kind in ITEM_TYPES:
            self.kept[kind] += other.kept[kind]
            self.total[kind] += other.total[kind]
        self.missing += other.missing
        return self

    @property
    def all_kept(self) -> int:
        return sum(self.kept.values())

    @property
    def all_total(self) -> int:
        return sum(self.total.values())

    def share(self, kind: str | None = None) -> float | None:
        kept = self.all_kept if kind is None else self.kept[kind]
        total = self.all_total if kind is None else self.total[kind]
        return kept / total if total else None


def check_unique(items: Sequence[Item], messages: Sequence[Message]) -> list[str]:
    """Problems with a transcript's items: an item absent from its own message, or present in
    another message (then an exact match would not prove where it came from)."""
    texts = [message_text(m) for m in messages]
    problems = []
    for item in items:
        where = [i for i, text in enumerate(texts) if item.text in text]
        if where != [item.message]:
            problems.append(f"{item.kind} {item.text!r}: in messages {where}, not [{item.message}]")
    return problems
