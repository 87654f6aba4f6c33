"""The pieces the configuration models are made of: strict bases and the condition fields.

The settings blocks (:mod:`.settings`) and every strategy's parameter model (beside its
strategy, see :mod:`.strategies.params`) are built from these, so a key means the same thing
wherever it is written: unknown keys are errors, values are frozen, and a trigger or target is
accepted in either config form and parsed into a :class:`~.triggers.Condition`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, get_args

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from .triggers import Condition, parse_condition, parse_target


class StrictModel(BaseModel):
    """snake_case keys, unknown keys refused, frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class CamelModel(BaseModel):
    """LibreChat-shaped blocks: camelCase keys (snake_case accepted too)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        arbitrary_types_allowed=True,
    )


def _trigger(value: object) -> Condition:
    return parse_condition(value, path="trigger")


def _target(value: object) -> Condition:
    return parse_target(value, path="target")


def _dump(condition: Condition) -> object:
    return condition.to_config()


TriggerField = Annotated[Condition, PlainValidator(_trigger), PlainSerializer(_dump)]
"""A trigger in either config form, parsed into a :class:`~.triggers.Condition`."""

TargetField = Annotated[Condition, PlainValidator(_target), PlainSerializer(_dump)]
"""A target (continue while it fires) in either form; ``tokens_below`` is rejected."""


_KNOWN_ERRORS = frozenset(get_args(ErrorType))


def error_at(loc: Sequence[str | int], kind: str, message: str, value: object) -> ValidationError:
    """One error at ``loc`` below the value being validated (a validator raises it, and
    pydantic puts the field's own path in front)."""
    detail: InitErrorDetails = {
        "type": PydanticCustomError(kind, message),
        "loc": tuple(loc),
        "input": value,
    }
    return ValidationError.from_exception_data("compaction settings", [detail])


def errors_under(prefix: str, exc: ValidationError) -> ValidationError:
    """``exc`` with ``prefix`` in front of every error's path, types and messages kept (how
    pydantic reports a tagged union member: ``pipeline.0.truncation.max_n``)."""
    details: list[InitErrorDetails] = []
    for error in exc.errors(include_url=False):
        kind = error["type"]
        detail: InitErrorDetails = {
            "type": kind if kind in _KNOWN_ERRORS else PydanticCustomError(kind, error["msg"]),
            "loc": (prefix, *error["loc"]),
            "input": error["input"],
        }
        if kind in _KNOWN_ERRORS and "ctx" in error:
            detail["ctx"] = error["ctx"]
        details.append(detail)
    return ValidationError.from_exception_data(exc.title, details)


_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str | int) -> int:
    """'7d', '12h', '30m', '45s' or a number of seconds (the configuration's TTLs; here so the
    core's blocks and the edge's read a duration the same way)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration must not be negative")
        return value
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration; use e.g. 45s, 30m, 12h, 7d or seconds")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]
