"""config.example.yaml documents every key the settings models accept, in use.

The file is where users learn the vocabulary, so "every key" is checked against the models
themselves rather than a list kept by hand: the pydantic models are walked from `Settings` down
(nested blocks, lists, per-model blocks, and for a pipeline entry the parameter model of every
strategy the registry holds), and each (model, key) pair
must be written somewhere in the file where that model applies, either in the live document or
in a `# --- example:` block, which must load too. The same holds for the trigger vocabulary and
the strategy names, and the floors the file states are the ones the strategies get.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from compaction_proxy.compaction.factory import build_pipeline
from compaction_proxy.compaction.settings import CompactionSettings, SummarizationSettings
from compaction_proxy.compaction.strategies import StrategyParams, default_registry
from compaction_proxy.compaction.triggers import CONDITION_NAMES, Condition
from compaction_proxy.config import Settings, load_settings, preflight
from tests.deploy.files import CONFIG_EXAMPLE

Key = tuple[type[BaseModel], str]
BUILT_IN = default_registry()
"""The strategies the file documents (a plug-in's are documented by its author)."""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment overrides would change what the file loads to."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_PROXY_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name)


# ----------------------------------------------------------------------------- annotations


def _parts(annotation: Any) -> Iterator[Any]:
    """The types an annotation is made of, through Annotated, Optional and unions."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _parts(typing.get_args(annotation)[0])
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _parts(arg)
    elif annotation is not type(None):
        yield annotation


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a value of `annotation` may be (list items and mapping values included)."""
    found: list[type[BaseModel]] = []
    for part in _parts(annotation):
        origin = typing.get_origin(part)
        if origin in (list, tuple):
            found += _models(typing.get_args(part)[0])
        elif origin is dict:
            found += _models(typing.get_args(part)[1])
        elif part is StrategyParams:  # a pipeline entry: any registered strategy's model
            found += [BUILT_IN.spec(name).params for name in BUILT_IN.names]
        elif isinstance(part, type) and issubclass(part, BaseModel):
            found.append(part)
    return found


def _is_condition(annotation: Any) -> bool:
    return any(isinstance(p, type) and issubclass(p, Condition) for p in _parts(annotation))


def _is_mapping(annotation: Any) -> bool:
    return any(typing.get_origin(p) is dict for p in _parts(annotation))


def _owner(model: type[BaseModel], name: str) -> Key:
    """A field as the class that declares it: `trigger` belongs to every pipeline entry's base,
    so writing it once documents it for all of them."""
    for cls in model.__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return cls, name
    return model, name


def _accepted(model: type[BaseModel] = Settings) -> set[Key]:
    """Every (declaring model, field) reachable from `model`."""
    keys: set[Key] = set()
    seen: set[type[BaseModel]] = set()
    pending = [model]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, field in current.model_fields.items():
            keys.add(_owner(current, name))
            pending += _models(field.annotation)
    return keys


def _field(model: type[BaseModel], key: str) -> str | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return name
    return None


def _pick(candidates: list[type[BaseModel]], data: dict[str, Any]) -> type[BaseModel] | None:
    """The model a mapping is: the one candidate, or the pipeline entry its `strategy` names."""
    if len(candidates) == 1:
        return candidates[0]
    name = data.get("strategy")
    if name in BUILT_IN.names and BUILT_IN.spec(name).params in candidates:
        return BUILT_IN.spec(name).params
    return None


# ----------------------------------------------------------------------------- the file


def _condition_names(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _condition_names(item)
    elif isinstance(value, dict):
        if "type" in value:
            yield str(value["type"])
            if value["type"] in ("all", "any"):
                yield from _condition_names(value.get("value"))
            return
        for name, nested in value.items():
            yield str(name)
            if name in ("all", "any"):
                yield from _condition_names(nested)


def _visit(
    data: Any, annotation: Any, keys: set[Key], conditions: set[str], strategies: set[str]
) -> None:
    """Note every (model, field) and condition name written in `data`, read as `annotation`."""
    if isinstance(data, list):
        for item in data:
            _visit(item, annotation, keys, conditions, strategies)
        return
    if not isinstance(data, dict):
        return
    candidates = _models(annotation)
    if _is_mapping(annotation) and not any(_field(m, k) for m in candidates for k in data):
        for value in data.values():  # `models: {pattern: {...}}`
            _visit(value, annotation, keys, conditions, strategies)
        return
    model = _pick(candidates, data)
    if model is None:
        return
    if "strategy" in model.model_fields:
        strategies.add(str(data.get("strategy")))
    for key, value in data.items():
        name = _field(model, key)
        if name is None:
            continue
        keys.add(_owner(model, name))
        field = model.model_fields[name].annotation
        if _is_condition(field):
            conditions.update(_condition_names(value))
        else:
            _visit(value, field, keys, conditions, strategies)


def _example_blocks(text: str) -> dict[str, dict[str, Any]]:
    """`# --- example: NAME` ... `# --- end` blocks (compaction blocks), uncommented."""
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        start = re.match(r"# --- example: (\S+)", stripped)
        if start:
            current = start.group(1)
            blocks[current] = []
        elif stripped == "# --- end":
            current = None
        elif current is not None:
            blocks[current].append(stripped[2:] if stripped.startswith("# ") else stripped[1:])
    return {name: yaml.safe_load("\n".join(body)) for name, body in blocks.items()}


@pytest.fixture(scope="module")
def text() -> str:
    return CONFIG_EXAMPLE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def written(text: str) -> tuple[set[Key], set[str], set[str]]:
    keys: set[Key] = set()
    conditions: set[str] = set()
    strategies: set[str] = set()
    _visit(yaml.safe_load(text), Settings, keys, conditions, strategies)
    for block in _example_blocks(text).values():
        _visit(block, CompactionSettings, keys, conditions, strategies)
    return keys, conditions, strategies


def _name(key: Key) -> str:
    model, name = key
    field = model.model_fields[name]
    return f"{model.__name__}.{field.alias or name}"


# ----------------------------------------------------------------------------- tests


def test_the_walk_sees_the_vocabulary() -> None:
    # Guards the walk itself: a bug that found nothing would make the next test pass vacuously.
    names = {_name(key) for key in _accepted()}
    assert {
        "TruncationParams.preserve_first_user_group",
        "PipelineParams.token_budget",
        "SummarizationParams.target_count",
        "SlidingWindowParams.keep_last_groups",
        "ClearToolUsesParams.clear_at_least",
        "StrategyParams.minimum_preserved",
        "CompactionSettings.plugins",
        "SummarizationSettings.retainRecent",
        "UpstreamSettings.keyless",
    } <= names
    assert len(names) > 120


def test_every_accepted_key_is_written_in_the_file(
    written: tuple[set[Key], set[str], set[str]],
) -> None:
    keys, _, _ = written
    missing = sorted(_name(key) for key in _accepted() - keys)
    assert not missing, f"keys the settings accept but config.example.yaml never writes: {missing}"


def test_every_condition_and_strategy_is_used(
    written: tuple[set[Key], set[str], set[str]],
) -> None:
    _, conditions, strategies = written
    assert not set(CONDITION_NAMES) - conditions, sorted(set(CONDITION_NAMES) - conditions)
    assert not set(BUILT_IN.names) - strategies, sorted(set(BUILT_IN.names) - strategies)
    assert conditions <= {*CONDITION_NAMES, "over_budget"}, conditions  # nothing made up


def test_the_file_loads_and_passes_the_start_up_checks(text: str) -> None:
    settings = load_settings(CONFIG_EXAMPLE, environ={})
    assert preflight.problems(settings) == []
    blocks = _example_blocks(text)
    assert {"agent-framework-vocabulary", "librechat-vocabulary"} <= set(blocks)
    for name, block in blocks.items():
        compaction = CompactionSettings(**block)
        assert compaction.pipeline, name
        build_pipeline(compaction, SummarizationSettings())


def test_the_floors_the_file_states_are_the_strategies_defaults(text: str) -> None:
    match = re.search(r"# floors \(minimum_preserved defaults\): (.+)", text)
    assert match, "config.example.yaml no longer states the default floors"
    stated = dict(re.findall(r"(\w+) (\d+)(?:,|$)", match.group(1)))
    other = int(stated.pop("strategy"))  # "every other strategy N"
    required = {"sliding_window": {"keep_last_groups": 3}}  # the one without a default shape
    # (a pipeline holds entries; the ledger entry turns the ledger on and is no strategy run)
    minimal = {
        name: required.get(name, {})
        for name in BUILT_IN.names
        if name not in ("pipeline", "ledger")
    }
    entries = [{"strategy": name, **extra} for name, extra in minimal.items()]
    pipeline = build_pipeline(CompactionSettings(pipeline=entries), SummarizationSettings())
    actual = {s.name: s.minimum_preserved for s in pipeline.strategies}
    assert set(actual) == set(minimal)
    for name, floor in actual.items():
        assert floor == int(stated.get(name, other)), (name, floor, stated)
