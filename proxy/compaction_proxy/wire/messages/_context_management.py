"""Anthropic's ``context_management`` applied by the proxy, for an upstream that does not apply it.

Claude Code sends ``context_management: {"edits": [{"type": "clear_thinking_20251015", "keep":
"all"}]}`` with every request; the Anthropic SDKs send what their users configure. Anthropic's
API applies the edits to the prompt before the model reads it; a local server (llama.cpp,
vLLM, Ollama, LM Studio) ignores the field or refuses it as an unknown one. For such an
upstream (``upstreams[].context_management: emulate``, docs/context-management.md) the edits
are translated here into strategies of the compaction core, which run before the configured
pipeline, and the field is stripped from the forwarded body:

* ``clear_tool_uses_20250919`` -> the core's ``clear_tool_uses`` (named after the edit in the
  report): ``trigger`` ``{type: input_tokens, value}`` (default 100,000) fires above that many
  prompt tokens, ``{type: tool_uses, value}`` above that many tool uses; ``keep`` ``{type:
  tool_uses, value}`` (default 3) newest results stay; ``clear_at_least`` ``{type:
  input_tokens, value}`` (default none) or nothing is cleared; ``exclude_tools``;
  ``clear_tool_inputs`` (``true``, or the tools whose inputs go too);
* ``clear_thinking_20251015`` -> :class:`ClearThinking`: ``keep`` ``{type: thinking_turns,
  value}`` (default 1) newest assistant turns with thinking keep it, or ``"all"`` (also
  ``{type: all}``): every one does;
* ``compact_20260112`` -> the core's summarization (named ``compact_20260112`` in the report,
  its summary step inside), at ``trigger`` ``{type: input_tokens, value}`` (default 150,000,
  at least 50,000), when a summarizer is configured. ``instructions`` and
  ``pause_after_compaction`` have no counterpart here: the note says they were not applied.

An edit type this module does not know, or a parameter it does not, is stripped with the rest
and named in a note as not applied (never dropped silently); a known parameter with a value
Anthropic would refuse is a 400 naming it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_proxy.compaction import CompactionReport, StrategyReport
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.strategies.base import Strategy
from compaction_proxy.compaction.triggers import TokensExceed
from compaction_proxy.http import ProxyError, bad_request

from ._edit_strategies import (
    CLEAR_THINKING,
    CLEAR_TOOL_USES,
    COMPACT,
    TOOL_USES_KEEP,
    ClearThinking,
    ClearToolUses,
    ClearToolUsesByCount,
    Compact,
)

FIELD = "context_management"
TOOL_USES_TRIGGER = 100_000
"""``clear_tool_uses_20250919``'s default trigger: input tokens."""
THINKING_KEEP = 1
"""``clear_thinking_20251015``'s default ``keep``: thinking turns."""
COMPACT_TRIGGER = 150_000
COMPACT_MIN_TRIGGER = 50_000
"""The smallest ``compact_20260112`` trigger Anthropic's API accepts."""

_KNOWN = {
    CLEAR_TOOL_USES: frozenset(
        {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}
    ),
    CLEAR_THINKING: frozenset({"type", "keep"}),
    COMPACT: frozenset({"type", "trigger", "instructions", "pause_after_compaction"}),
}


@dataclass(frozen=True, slots=True)
class _Edit:
    """One edit as translated: its type, what it asks in short, and its strategy (None: the
    edit is not applied; ``unapplied`` says why)."""

    kind: str
    label: str
    strategy: Strategy | None
    unapplied: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MessagesEdits:
    """A request's ``context_management``, as the proxy applies it (a
    :class:`~compaction_proxy.wire.format.ContextEdits`)."""

    edits: tuple[_Edit, ...]
    key: str
    strip: tuple[str, ...] = (FIELD,)

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        return tuple(edit.strategy for edit in self.edits if edit.strategy is not None)

    def notes(self, report: CompactionReport | None) -> tuple[str, ...]:
        unapplied = [note for edit in self.edits for note in edit.unapplied]
        if report is None:
            head = (
                f"{FIELD} stripped for an upstream that does not apply it, and not applied: "
                "the request went uncompacted (a dry run, or the compaction failed)"
            )
            return (head, *unapplied)
        steps: dict[str, list[StrategyReport]] = {}
        for step in report.strategies:
            steps.setdefault(step.name, []).append(step)
        parts = []
        for edit in self.edits:
            if edit.strategy is None:
                continue
            found = steps.get(edit.kind)
            parts.append(_outcome(edit, found.pop(0) if found else None))
        if not parts:
            return (f"{FIELD} stripped: none of its edits could be applied", *unapplied)
        return (f"{FIELD} applied by the proxy ({'; '.join(parts)})", *unapplied)


def _outcome(edit: _Edit, step: StrategyReport | None) -> str:
    """What one edit did, for the note (``clear_tool_uses_20250919 cleared 3 tool result(s),
    ...``)."""
    if step is None:
        return f"{edit.kind} did not run"
    if isinstance(edit.strategy, ClearThinking) and edit.strategy.keep is None:
        return f"{edit.kind} keep all"
    if step.skipped:
        return f"{edit.kind} {edit.label}: not reached"
    for inner in step.walk():
        if inner.failed:
            return f"{edit.kind} {edit.label}: failed ({inner.failed})"
    notes = [note for inner in step.walk() for note in inner.notes]
    if step.changed:
        return f"{edit.kind} {notes[0] if notes else 'applied'}"
    return f"{edit.kind} {edit.label}: {notes[0] if notes else 'nothing to clear'}"


def translate(body: Mapping[str, Any], *, summarizer: bool) -> MessagesEdits | None:
    """The request's ``context_management`` for the proxy to apply, or None when it has none;
    ``summarizer``: whether one is configured (``compact_20260112`` needs it). Raises a 400
    naming a malformed edit."""
    if FIELD not in body:
        return None
    value = body[FIELD]
    if value is None:
        return MessagesEdits((), _key(value, summarizer))
    if not isinstance(value, Mapping):
        raise _invalid(FIELD, "must be an object")
    unknown = sorted(k for k in value if k != "edits")
    edits_value = value.get("edits")
    if edits_value is None:
        edits_value = []
    if not isinstance(edits_value, list):
        raise _invalid(f"{FIELD}.edits", "must be an array of edits")
    edits: list[_Edit] = []
    for position, raw in enumerate(edits_value):
        edits.append(_edit(raw, f"{FIELD}.edits.{position}", summarizer))
    if unknown:
        note = f"{FIELD}: {', '.join(unknown)} not applied (unknown to the proxy)"
        edits.append(_Edit("", "", None, (note,)))
    return MessagesEdits(tuple(edits), _key(value, summarizer))


def _key(value: Any, summarizer: bool) -> str:
    data = canonical_bytes({"context_management": value, "summarizer": summarizer})
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _edit(raw: Any, path: str, summarizer: bool) -> _Edit:
    if not isinstance(raw, Mapping):
        raise _invalid(path, "must be an object")
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise _invalid(f"{path}.type", "must be a string")
    known = _KNOWN.get(kind)
    if known is None:
        return _Edit(kind, "", None, (f"{kind} not applied (an edit type unknown to the proxy)",))
    extra = sorted(k for k in raw if k not in known)
    ignored = (f"{kind}: {', '.join(extra)} not applied (unknown to the proxy)",) if extra else ()
    if kind == CLEAR_TOOL_USES:
        return _clear_tool_uses(raw, path, ignored)
    if kind == CLEAR_THINKING:
        return _clear_thinking(raw, path, ignored)
    return _compact(raw, path, summarizer, ignored)


def _clear_tool_uses(raw: Mapping[str, Any], path: str, ignored: tuple[str, ...]) -> _Edit:
    trigger_kind, trigger_value = _measure(
        raw.get("trigger"), f"{path}.trigger", ("input_tokens", "tool_uses"), minimum=1
    ) or ("input_tokens", TOOL_USES_TRIGGER)
    keep = _measure(raw.get("keep"), f"{path}.keep", ("tool_uses",), minimum=0)
    at_least = _measure(raw.get("clear_at_least"), f"{path}.clear_at_least", ("input_tokens",))
    exclude = _names(raw.get("exclude_tools"), f"{path}.exclude_tools") or ()
    inputs = raw.get("clear_tool_inputs")
    inputs_of: frozenset[str] | None = None
    clear_inputs = False
    if isinstance(inputs, bool):
        clear_inputs = inputs
    elif inputs is not None:
        names = _names(inputs, f"{path}.clear_tool_inputs", what="a boolean or an array")
        inputs_of = frozenset(names or ())
    arguments: dict[str, Any] = {
        "inputs_of": inputs_of,
        "keep": keep[1] if keep else TOOL_USES_KEEP,
        "exclude_tools": exclude,
        "clear_at_least": at_least[1] if at_least else 0,
        "clear_tool_inputs": clear_inputs,
    }
    strategy: ClearToolUses
    if trigger_kind == "tool_uses":
        strategy = ClearToolUsesByCount(trigger_value, **arguments)
        label = f"above {trigger_value} tool uses"
    else:
        strategy = ClearToolUses(trigger=TokensExceed(trigger_value), **arguments)
        label = f"above {trigger_value} input tokens"
    return _Edit(CLEAR_TOOL_USES, label, strategy, ignored)


def _clear_thinking(raw: Mapping[str, Any], path: str, ignored: tuple[str, ...]) -> _Edit:
    keep = raw.get("keep")
    count: int | None
    if keep is None:
        count = THINKING_KEEP
    elif keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        if isinstance(keep, Mapping) and len(keep) > 1:
            raise _invalid(f"{path}.keep", "{type: all} takes no other field")
        count = None
    else:
        measured = _measure(keep, f"{path}.keep", ("thinking_turns",), minimum=0, word="all")
        assert measured is not None
        count = measured[1]
    label = "keep all" if count is None else f"keep {count} thinking turn(s)"
    return _Edit(CLEAR_THINKING, label, ClearThinking(count), ignored)


def _compact(
    raw: Mapping[str, Any], path: str, summarizer: bool, ignored: tuple[str, ...]
) -> _Edit:
    trigger = _measure(
        raw.get("trigger"), f"{path}.trigger", ("input_tokens",), minimum=COMPACT_MIN_TRIGGER
    )
    tokens = trigger[1] if trigger else COMPACT_TRIGGER
    instructions = raw.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _invalid(f"{path}.instructions", "must be a string")
    pause = raw.get("pause_after_compaction")
    if pause is not None and not isinstance(pause, bool):
        raise _invalid(f"{path}.pause_after_compaction", "must be a boolean")
    notes = list(ignored)
    if instructions:
        notes.append(f"{COMPACT}: instructions not applied (the proxy's summary prompt is used)")
    if pause:
        notes.append(
            f"{COMPACT}: pause_after_compaction not applied (the proxy returns no compaction block)"
        )
    label = f"above {tokens} input tokens"
    if not summarizer:
        notes.append(f"{COMPACT} not applied: no summarizer is configured (summarization)")
        return _Edit(COMPACT, label, None, tuple(notes))
    return _Edit(COMPACT, label, Compact(tokens), tuple(notes))


def _measure(
    value: Any,
    path: str,
    kinds: Sequence[str],
    *,
    minimum: int = 0,
    word: str | None = None,
) -> tuple[str, int] | None:
    """``{type: <one of kinds>, value: <integer >= minimum>}``, or None when absent."""
    if value is None:
        return None
    spelled = " or ".join(kinds)
    shape = f"must be {{type: {spelled}, value: <integer>}}" + (f" or {word!r}" if word else "")
    if not isinstance(value, Mapping):
        raise _invalid(path, shape)
    kind = value.get("type")
    if kind not in kinds:
        raise _invalid(f"{path}.type", f"must be {spelled}, not {kind!r}")
    number = value.get("value")
    if not isinstance(number, int) or isinstance(number, bool):
        raise _invalid(f"{path}.value", "must be an integer")
    if number < minimum:
        raise _invalid(f"{path}.value", f"must be at least {minimum}, not {number}")
    extra = sorted(k for k in value if k not in ("type", "value"))
    if extra:
        raise _invalid(path, f"unexpected field {extra[0]!r}; {shape}")
    return str(kind), number


def _names(value: Any, path: str, *, what: str = "an array") -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise _invalid(path, f"must be {what} of tool names")
    return tuple(value)


def _invalid(path: str, problem: str) -> ProxyError:
    return bad_request(f"{path}: {problem}", param=path, code="invalid_context_management")
