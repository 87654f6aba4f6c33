"""The strategy registry: one list of strategies that validates, builds and names them.

A strategy registered at start-up (tests/support/plugin_strategy.py, the way a user writes one)
validates from a pipeline entry, nested or not, with errors naming the entry's path; unknown
names list the known ones; ``compaction.plugins`` loads it.  Each test here works on a registry
of its own (the validation context's ``strategies``), so the process's registry stays as it is.

The conformance tests at the end are derived from the registry: every registered strategy is
built from its config defaults exactly as its constructor's defaults build it, and refuses an
unknown key under its own name.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from compaction_proxy.compaction import CompactionSettings, build_pipeline
from compaction_proxy.compaction.settings import entry_to_config
from compaction_proxy.compaction.strategies import (
    PipelineStrategy,
    StrategyRegistry,
    TruncationStrategy,
    default_registry,
)
from compaction_proxy.compaction.strategies.registry import CONTEXT_KEY, STRATEGIES
from compaction_proxy.compaction.strategies.truncation import TruncationParams
from compaction_proxy.compaction.triggers import Always, TokensExceed
from compaction_proxy.config import Settings
from tests.support import plugin_strategy
from tests.support.plugin_strategy import NAME, REFERENCE, StampOldResults, StampParams

from .helpers import call, s, tool, u
from .strategy_helpers import run

BUILT_IN = default_registry().names


def with_plugin() -> StrategyRegistry:
    registry = default_registry()
    plugin_strategy.register(registry)
    return registry


def validate(data: dict[str, Any], registry: StrategyRegistry) -> CompactionSettings:
    return CompactionSettings.model_validate(data, context={CONTEXT_KEY: registry})


def first_error(data: dict[str, Any], registry: StrategyRegistry) -> dict[str, Any]:
    with pytest.raises(ValidationError) as info:
        validate(data, registry)
    return dict(info.value.errors()[0])


def tool_loop() -> list[dict[str, Any]]:
    return [
        s(),
        u("task"),
        call("c1"),
        tool("c1", "first result"),
        call("c2"),
        tool("c2", "second result"),
        call("c3"),
        tool("c3", "third result"),
    ]


# ------------------------------------------------------------------ a registered strategy


def test_a_registered_strategy_validates_builds_and_runs_from_its_entry() -> None:
    registry = with_plugin()
    entry = {"strategy": NAME, "stamp": "[x]", "keep": 0, "trigger": {"tokens_exceed": 10}}
    settings = validate({"pipeline": [entry]}, registry)
    assert settings.pipeline is not None
    (params,) = settings.pipeline
    assert isinstance(params, StampParams) and params.keep == 0
    assert entry_to_config(params) == entry  # written back as written, keys of its own model
    (strategy,) = build_pipeline(settings, registry=registry).strategies
    assert isinstance(strategy, StampOldResults)
    assert (strategy.stamp, strategy.keep, strategy.trigger) == ("[x]", 0, TokensExceed(10))
    result = run(StampOldResults(keep=1), tool_loop())
    # the newest step (c3) is protected by the draft, keep=1 spares c2: only c1 is stamped
    assert [m.get("content") for m in result.messages if m["role"] == "tool"] == [
        plugin_strategy.DEFAULT_STAMP,
        "second result",
        "third result",
    ]


def test_its_entries_nest_in_a_pipeline_entry() -> None:
    registry = with_plugin()
    nested = {"strategy": "pipeline", "strategies": [{"strategy": NAME, "keep": 2}]}
    settings = validate({"pipeline": [nested]}, registry)
    (outer,) = build_pipeline(settings, registry=registry).strategies
    assert isinstance(outer, PipelineStrategy)
    (child,) = outer.strategies
    assert isinstance(child, StampOldResults) and child.keep == 2


@pytest.mark.parametrize(
    ("entry", "loc", "kind"),
    [
        ({"strategy": NAME, "keep": -1}, ("pipeline", 0, NAME, "keep"), "greater_than_equal"),
        ({"strategy": NAME, "stamp": ""}, ("pipeline", 0, NAME, "stamp"), "string_too_short"),
        ({"strategy": NAME, "bogus": 1}, ("pipeline", 0, NAME, "bogus"), "extra_forbidden"),
        (
            {"strategy": NAME, "trigger": {"tokens_exceed": "x"}},
            ("pipeline", 0, NAME, "trigger"),
            "value_error",
        ),
        (
            {"strategy": "pipeline", "strategies": [{"strategy": NAME, "keep": -1}]},
            ("pipeline", 0, "pipeline", "strategies", 0, NAME, "keep"),
            "greater_than_equal",
        ),
    ],
)
def test_its_parameters_are_validated_with_the_key_path(
    entry: dict[str, Any], loc: tuple[Any, ...], kind: str
) -> None:
    error = first_error({"pipeline": [entry]}, with_plugin())
    assert (error["loc"], error["type"]) == (loc, kind)


def test_an_unknown_name_lists_the_known_ones() -> None:
    error = first_error({"pipeline": [{"strategy": NAME}]}, default_registry())
    assert error["loc"] == ("pipeline", 0, "strategy")
    assert error["msg"].startswith(f"unknown strategy {NAME!r}; known: {', '.join(BUILT_IN)} (")
    assert "compaction.plugins" in error["msg"]
    error = first_error({"pipeline": [{"strategy": "stamp"}]}, with_plugin())
    assert f"known: {', '.join(BUILT_IN)}, {NAME} (" in error["msg"]
    nested = {"strategy": "pipeline", "strategies": [{"strategy": "nope"}]}
    error = first_error({"pipeline": [nested]}, default_registry())
    assert error["loc"] == ("pipeline", 0, "pipeline", "strategies", 0, "strategy")


@pytest.mark.parametrize(
    ("entry", "loc", "words"),
    [
        ({"keep": 1}, ("pipeline", 0, "strategy"), "Field required"),
        ("truncation", ("pipeline", 0), "a mapping with a strategy key"),
        ({"strategy": 3}, ("pipeline", 0, "strategy"), "unknown strategy 3"),
    ],
)
def test_an_entry_without_a_name_says_so(entry: object, loc: tuple[Any, ...], words: str) -> None:
    error = first_error({"pipeline": [entry]}, default_registry())
    assert error["loc"] == loc and words in error["msg"]


def test_tests_with_a_registry_of_their_own_leave_the_process_registry_alone() -> None:
    validate({"plugins": [REFERENCE], "pipeline": [{"strategy": NAME}]}, default_registry())
    assert NAME not in STRATEGIES.names
    assert STRATEGIES.names == BUILT_IN


# ------------------------------------------------------------------ registering


def test_registration_rules() -> None:
    registry = with_plugin()
    with pytest.raises(ValueError, match=f"strategy {NAME!r} is already registered"):
        plugin_strategy.register(registry)
    registry.register(NAME, TruncationParams, TruncationStrategy, replace=True)
    settings = validate({"pipeline": [{"strategy": NAME, "max_n": 9}]}, registry)
    (strategy,) = build_pipeline(settings, registry=registry).strategies
    assert isinstance(strategy, TruncationStrategy) and strategy.max_n == 9
    with pytest.raises(TypeError, match="must subclass StrategyParams"):
        registry.register("plain", dict, TruncationStrategy)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register("", StampParams, StampOldResults)
    with pytest.raises(TypeError, match="takes TruncationParams, not StampParams"):
        registry.build(StampParams(strategy=NAME))
    assert StrategyRegistry().names == ()


def test_a_replaced_built_in_serves_the_default_pipeline_too() -> None:
    registry = default_registry()
    registry.register("truncation", StampParams, StampOldResults, replace=True)
    names = [
        type(s).__name__ for s in build_pipeline(CompactionSettings(), registry=registry).strategies
    ]
    assert names[-1] == "StampOldResults"


# ------------------------------------------------------------------ compaction.plugins


def test_plugins_are_loaded_before_the_pipeline_and_only_once() -> None:
    registry = default_registry()
    data = {"plugins": [REFERENCE], "pipeline": [{"strategy": NAME, "keep": 0}]}
    first = validate(data, registry)
    again = validate(data, registry)  # a second load would say "already registered"
    assert first == again and registry.names == (*BUILT_IN, NAME)
    assert first.plugins == (REFERENCE,)


def test_the_app_config_loads_them_before_the_per_model_blocks() -> None:
    """`models` is validated before `compaction`: its blocks may still name the strategy."""
    registry = default_registry()
    data = {
        "models": {"m-*": {"compaction": {"pipeline": [{"strategy": NAME, "keep": 3}]}}},
        "compaction": {"plugins": [REFERENCE]},
    }
    settings = Settings.model_validate(data, context={CONTEXT_KEY: registry})
    override = settings.models["m-*"].compaction
    assert override is not None and override.pipeline is not None
    assert isinstance(override.pipeline[0], StampParams)


@pytest.mark.parametrize(
    ("reference", "words"),
    [
        ("tests.support.plugin_strategy", "a plug-in is written 'module:function'"),
        ("tests.support.no_such_plugin:register", "cannot import 'tests.support.no_such_plugin'"),
        ("tests.support.plugin_strategy:nothing", "has no function 'nothing'"),
        (
            plugin_strategy.BROKEN,
            f"{plugin_strategy.BROKEN} failed: RuntimeError: the plug-in could not reach its",
        ),
    ],
)
def test_a_plugin_that_cannot_load_names_its_place_and_why(reference: str, words: str) -> None:
    error = first_error({"plugins": [REFERENCE, reference]}, default_registry())
    assert error["loc"] == ("plugins", 1)
    assert words in error["msg"]


# ------------------------------------------------------------------ conformance, per strategy

REQUIRED: dict[str, dict[str, Any]] = {
    "sliding_window": {"keep_last_groups": 3},  # it has no default shape
    "pipeline": {"strategies": []},
}


@pytest.mark.parametrize("name", BUILT_IN)
def test_config_defaults_build_the_constructor_defaults(name: str) -> None:
    """The parameter model and the constructor agree on every default (the model's keys are
    the constructor's keywords, or its ``arguments`` maps them)."""
    registry = default_registry()
    spec = registry.spec(name)
    params = registry.parse({"strategy": name, **REQUIRED.get(name, {})})
    assert type(params) is spec.params
    built = registry.build(params)
    direct = spec.strategy(**REQUIRED.get(name, {}))
    assert type(built) is type(direct) and built.name == name
    assert vars(built) == vars(direct)


@pytest.mark.parametrize("name", BUILT_IN)
def test_an_unknown_key_is_refused_under_the_strategys_name(name: str) -> None:
    entry = {"strategy": name, **REQUIRED.get(name, {}), "no_such_key": 1}
    with pytest.raises(ValidationError) as info:
        validate({"pipeline": [entry]}, default_registry())
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [
        (("pipeline", 0, name, "no_such_key"), "extra_forbidden")
    ]


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_entry_takes_trigger_target_and_floor(name: str) -> None:
    entry = {
        "strategy": name,
        **REQUIRED.get(name, {}),
        "trigger": "always",
        "target": {"tokens_exceed": 5},
        "minimum_preserved": 2,
    }
    registry = default_registry()
    strategy = registry.build(registry.parse(entry))
    assert strategy.trigger == Always()
