"""Triggers and targets: conditions over a metrics snapshot of the current state.

A *trigger* decides whether a strategy starts.  A *target* decides when it stops: strategies
remove or collapse one unit at a time, oldest first, and continue **while the target still
fires**.  A target is therefore written as the pressure to relieve, in the trigger vocabulary:
``trigger: {token_ratio: 0.8}, target: {token_ratio: 0.5}`` reads "fire at 80 % of the budget,
compact until below 50 %".  No target means the trigger is the target ("until the trigger no
longer fires").  ``tokens_below`` would read backwards in a target and is rejected there.

Vocabulary (see "Triggers and targets" in compaction_proxy/compaction/README.md; both config forms
are accepted,
``{tokens_exceed: 2000}`` and LibreChat's ``{type: token_ratio, value: 0.8}``):

================== =================================================================
``always``         always
``never``          never
``tokens_exceed``  tokens > N
``tokens_below``   tokens < N
``messages_exceed`` messages > N (system messages included, as in the Agent Framework)
``turns_exceed``   user turns with anything kept > N
``groups_exceed``  groups > N (system groups included, as in the Agent Framework)
``has_tool_calls`` a tool-call group is kept (``false``: none is)
``token_ratio``    tokens >= ratio x budget (0..1)
``remaining_tokens`` budget - tokens <= N
``messages_to_refine`` LibreChat's count of messages that no longer fit: here, the number of
                   messages the oldest-first fallback would have to drop to fit the budget
                   is >= N (so it never fires while the request fits)
``over_budget``    tokens > budget (our addition; the pipeline's default stop condition)
``all`` / ``any``  every / some nested condition fires (empty: true / false)
================== =================================================================

``tokens`` is the calibrated prompt count (messages + tools + reply priming).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .errors import CompactionProxyError


def _no_overflow() -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Metrics:
    """A snapshot of the current (possibly partially compacted) state."""

    tokens: int
    messages: int
    groups: int
    turns: int
    tool_call_groups: int
    budget: int
    overflow_messages: Callable[[], int] = field(default=_no_overflow, compare=False)


class ConditionError(CompactionProxyError, ValueError):
    """A trigger/target could not be parsed; the message starts with the key path."""


class Condition(ABC):
    """A predicate over :class:`Metrics`."""

    @abstractmethod
    def fires(self, metrics: Metrics) -> bool:
        """True when the condition holds for ``metrics``."""

    @abstractmethod
    def to_config(self) -> object:
        """The condition in our config form (round-trips through :func:`parse_condition`)."""


@dataclass(frozen=True, slots=True)
class Always(Condition):
    """Fires unconditionally."""

    def fires(self, metrics: Metrics) -> bool:
        return True

    def to_config(self) -> object:
        return "always"


@dataclass(frozen=True, slots=True)
class Never(Condition):
    """Never fires (disables a strategy)."""

    def fires(self, metrics: Metrics) -> bool:
        return False

    def to_config(self) -> object:
        return "never"


@dataclass(frozen=True, slots=True)
class OverBudget(Condition):
    """Fires while the prompt does not fit the budget."""

    def fires(self, metrics: Metrics) -> bool:
        return metrics.tokens > metrics.budget

    def to_config(self) -> object:
        return "over_budget"


@dataclass(frozen=True, slots=True)
class TokensExceed(Condition):
    """tokens > limit."""

    limit: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.tokens > self.limit

    def to_config(self) -> object:
        return {"tokens_exceed": self.limit}


@dataclass(frozen=True, slots=True)
class TokensBelow(Condition):
    """tokens < limit."""

    limit: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.tokens < self.limit

    def to_config(self) -> object:
        return {"tokens_below": self.limit}


@dataclass(frozen=True, slots=True)
class MessagesExceed(Condition):
    """messages > limit."""

    limit: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.messages > self.limit

    def to_config(self) -> object:
        return {"messages_exceed": self.limit}


@dataclass(frozen=True, slots=True)
class TurnsExceed(Condition):
    """turns > limit."""

    limit: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.turns > self.limit

    def to_config(self) -> object:
        return {"turns_exceed": self.limit}


@dataclass(frozen=True, slots=True)
class GroupsExceed(Condition):
    """groups > limit."""

    limit: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.groups > self.limit

    def to_config(self) -> object:
        return {"groups_exceed": self.limit}


@dataclass(frozen=True, slots=True)
class HasToolCalls(Condition):
    """A tool-call group is kept (or, with ``expected=False``, none is)."""

    expected: bool = True

    def fires(self, metrics: Metrics) -> bool:
        return (metrics.tool_call_groups > 0) is self.expected

    def to_config(self) -> object:
        return {"has_tool_calls": self.expected}


@dataclass(frozen=True, slots=True)
class TokenRatio(Condition):
    """tokens >= ratio x budget."""

    ratio: float

    def fires(self, metrics: Metrics) -> bool:
        return metrics.tokens >= self.ratio * metrics.budget

    def to_config(self) -> object:
        return {"token_ratio": self.ratio}


@dataclass(frozen=True, slots=True)
class RemainingTokens(Condition):
    """budget - tokens <= remaining."""

    remaining: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.budget - metrics.tokens <= self.remaining

    def to_config(self) -> object:
        return {"remaining_tokens": self.remaining}


@dataclass(frozen=True, slots=True)
class MessagesToRefine(Condition):
    """At least ``count`` messages would have to go for the request to fit (LibreChat)."""

    count: int

    def fires(self, metrics: Metrics) -> bool:
        return metrics.tokens > metrics.budget and metrics.overflow_messages() >= self.count

    def to_config(self) -> object:
        return {"messages_to_refine": self.count}


@dataclass(frozen=True, slots=True)
class AllOf(Condition):
    """Every nested condition fires (vacuously true when empty)."""

    conditions: tuple[Condition, ...]

    def fires(self, metrics: Metrics) -> bool:
        return all(c.fires(metrics) for c in self.conditions)

    def to_config(self) -> object:
        return {"all": [c.to_config() for c in self.conditions]}


@dataclass(frozen=True, slots=True)
class AnyOf(Condition):
    """Some nested condition fires (false when empty)."""

    conditions: tuple[Condition, ...]

    def fires(self, metrics: Metrics) -> bool:
        return any(c.fires(metrics) for c in self.conditions)

    def to_config(self) -> object:
        return {"any": [c.to_config() for c in self.conditions]}


def count_demands(condition: Condition, metrics: Metrics) -> bool:
    """True when ``condition`` fires on ``metrics`` because of a structural count
    (``turns_exceed``, ``messages_exceed``, ``groups_exceed``): for an ``any``, one part fires
    by a count; for an ``all``, the whole fires and one part fires by a count.

    A run a count demanded must take effect whatever it saves in tokens (the minimum saving,
    compaction_proxy/compaction/strategies/_support/churn.py): "keep the last 4 turns" is about
    turns.
    """
    if isinstance(condition, TurnsExceed | MessagesExceed | GroupsExceed):
        return condition.fires(metrics)
    if isinstance(condition, AnyOf):
        return any(count_demands(c, metrics) for c in condition.conditions)
    if isinstance(condition, AllOf):
        return condition.fires(metrics) and any(
            count_demands(c, metrics) for c in condition.conditions
        )
    return False


def firing_tokens(condition: Condition, metrics: Metrics, ceiling: int) -> int | None:
    """The smallest token count above ``metrics.tokens`` (up to ``ceiling``) at which
    ``condition`` starts to fire, every other metric as it is; ``None`` when it already fires
    or does not fire by ``ceiling``.

    Used to prepare a summary ahead of time: how far a growing conversation is from its
    trigger.  Token conditions only grow into firing (``tokens_below`` fires now or never), so
    a bisection over the count is exact for them and for their ``all``/``any`` combinations.
    """
    if condition.fires(metrics) or ceiling <= metrics.tokens:
        return None
    if not condition.fires(replace(metrics, tokens=ceiling)):
        return None
    low, high = metrics.tokens, ceiling  # fires at high, not at low
    while high - low > 1:
        middle = (low + high) // 2
        if condition.fires(replace(metrics, tokens=middle)):
            high = middle
        else:
            low = middle
    return high


# ---------------------------------------------------------------------------- parsing


def _count(value: object, path: str, *, positive: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConditionError(f"{path}: expected an integer, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise ConditionError(f"{path}: expected an integer, got {value!r}")
    number = int(value)
    if number < 0 or (positive and number == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ConditionError(f"{path}: expected {kind} integer, got {value!r}")
    return number


def _ratio(value: object, path: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise ConditionError(f"{path}: expected a number between 0 and 1, got {value!r}")
    return float(value)


def _flag(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConditionError(f"{path}: expected true or false, got {value!r}")
    return value


def _when_true(factory: Callable[[], Condition]) -> Callable[[object, str], Condition]:
    """Builder for the flag conditions, which only accept ``true`` as their value."""

    def build(value: object, path: str) -> Condition:
        if value is not True:
            raise ConditionError(f"{path}: expected true, got {value!r}")
        return factory()

    return build


def _nested(value: object, path: str) -> tuple[Condition, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ConditionError(f"{path}: expected a list of conditions, got {value!r}")
    return tuple(parse_condition(item, path=f"{path}[{i}]") for i, item in enumerate(value))


_FLAGS: Mapping[str, Callable[[], Condition]] = {
    "always": Always,
    "never": Never,
    "over_budget": OverBudget,
    "has_tool_calls": HasToolCalls,
}

_BUILDERS: Mapping[str, Callable[[object, str], Condition]] = {
    "always": _when_true(Always),
    "never": _when_true(Never),
    "over_budget": _when_true(OverBudget),
    "tokens_exceed": lambda v, p: TokensExceed(_count(v, p)),
    "tokens_below": lambda v, p: TokensBelow(_count(v, p)),
    "messages_exceed": lambda v, p: MessagesExceed(_count(v, p)),
    "turns_exceed": lambda v, p: TurnsExceed(_count(v, p)),
    "groups_exceed": lambda v, p: GroupsExceed(_count(v, p)),
    "has_tool_calls": lambda v, p: HasToolCalls(_flag(v, p)),
    "token_ratio": lambda v, p: TokenRatio(_ratio(v, p)),
    "remaining_tokens": lambda v, p: RemainingTokens(_count(v, p, positive=True)),
    "messages_to_refine": lambda v, p: MessagesToRefine(_count(v, p, positive=True)),
    "all": lambda v, p: AllOf(_nested(v, p)),
    "any": lambda v, p: AnyOf(_nested(v, p)),
}

CONDITION_NAMES = tuple(_BUILDERS)


def _unknown(name: str, path: str) -> ConditionError:
    if name == "token_count":
        return ConditionError(
            f"{path}: trigger type 'token_count' is no longer supported; use token_ratio "
            "(0-1), remaining_tokens (positive integer) or messages_to_refine (positive integer)"
        )
    return ConditionError(
        f"{path}: unknown condition {name!r}; expected one of {', '.join(CONDITION_NAMES)}"
    )


def parse_condition(raw: object, *, path: str = "trigger") -> Condition:
    """Parse either config form into a :class:`Condition`.

    Accepted: a :class:`Condition`; a bare name (``"always"``, ``"over_budget"``,
    ``"has_tool_calls"``); a one-key mapping ``{name: value}``; LibreChat's
    ``{type: name, value: v}`` (``value`` may be omitted for the flag conditions).
    """
    if isinstance(raw, Condition):
        return raw
    if isinstance(raw, str):
        flag = _FLAGS.get(raw)
        if flag is None:
            raise _unknown(raw, path)
        return flag()
    if not isinstance(raw, Mapping):
        raise ConditionError(
            f"{path}: expected a mapping such as {{tokens_exceed: 2000}} or "
            f"{{type: token_ratio, value: 0.8}}, got {raw!r}"
        )
    if "type" in raw:
        extra = set(raw) - {"type", "value"}
        if extra:
            raise ConditionError(f"{path}: unexpected key(s) {sorted(extra)} next to 'type'")
        name = raw["type"]
        if not isinstance(name, str):
            raise ConditionError(f"{path}.type: expected a string, got {name!r}")
        if name not in _BUILDERS:
            raise _unknown(name, f"{path}.type")
        if "value" not in raw:
            if name in _FLAGS:
                return _FLAGS[name]()
            raise ConditionError(f"{path}.value: required for trigger type {name!r}")
        return _BUILDERS[name](raw["value"], f"{path}.value")
    if len(raw) != 1:
        raise ConditionError(
            f"{path}: one condition per mapping (got keys {sorted(raw)}); "
            "combine several with all: [...] or any: [...]"
        )
    ((name, value),) = raw.items()
    if not isinstance(name, str) or name not in _BUILDERS:
        raise _unknown(str(name), path)
    return _BUILDERS[name](value, f"{path}.{name}")


def _contains(condition: Condition, kind: type[Condition]) -> bool:
    if isinstance(condition, kind):
        return True
    if isinstance(condition, AllOf | AnyOf):
        return any(_contains(c, kind) for c in condition.conditions)
    return False


def parse_target(raw: object, *, path: str = "target") -> Condition:
    """Parse a target: like a trigger, but ``tokens_below`` is rejected (see module doc)."""
    condition = parse_condition(raw, path=path)
    validate_target(condition, path=path)
    return condition


def validate_target(condition: Condition, *, path: str = "target") -> None:
    """Raise if ``condition`` cannot serve as a target."""
    if _contains(condition, TokensBelow):
        raise ConditionError(
            f"{path}: tokens_below cannot be a target (compaction continues while the target "
            "fires); write the pressure to relieve instead, e.g. {tokens_exceed: N}"
        )
