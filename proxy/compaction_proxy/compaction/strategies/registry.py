"""The strategies by name: each ``strategy:`` name's parameter model and class.

The registry is the one list of strategies.  A ``compaction.pipeline`` entry
(:data:`StrategyEntry`) is validated by the model its name selects
(:meth:`StrategyRegistry.parse`), and built as ``StrategyClass(**params.arguments(ctx))``
(:meth:`StrategyRegistry.build`); the names in error messages, ``check-config`` and the tests
that hold ``config.example.yaml`` to the vocabulary all come from here.

:data:`STRATEGIES` is the process's registry: the built-in strategies, registered into it by
:mod:`.builtin` (which the ``strategies`` package imports, so they are there whenever any of its
modules is), and whatever ``compaction.plugins`` registered at start-up.  This module imports no
strategy: the pipeline's own parameter model holds entries of :data:`StrategyEntry`.  A plug-in
is a function ``register(registry)`` named as ``"module:function"``::

    def register(registry: StrategyRegistry) -> None:
        registry.register("my_strategy", MyParams, MyStrategy)

The settings load the plug-ins before they validate the pipeline, so its entries may name
``my_strategy`` (see "Strategies of your own" in compaction_proxy/compaction/README.md).  A
validation context
``{"strategies": registry}`` selects another registry (tests use a fresh one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import PlainValidator, SerializeAsAny, ValidationError, ValidationInfo

from ..errors import CompactionProxyError
from ..fields import error_at, errors_under
from .base import Strategy
from .params import BuildContext, StrategyParams

CONTEXT_KEY = "strategies"
"""The validation-context key naming the registry to validate pipeline entries with."""


class UnknownStrategy(CompactionProxyError, LookupError):
    """A name this registry holds no strategy for."""


class PluginError(CompactionProxyError, ValueError):
    """A ``compaction.plugins`` reference that could not be loaded (the message says why)."""


@dataclass(frozen=True)
class StrategySpec:
    """One registered strategy: its parameter model and what builds it (the class, or any
    callable taking the parameters' :meth:`~.params.StrategyParams.arguments` as keywords)."""

    name: str
    params: type[StrategyParams]
    strategy: Callable[..., Strategy]


class StrategyRegistry:
    """Maps ``strategy:`` names to their parameter model and class."""

    def __init__(self) -> None:
        self._specs: dict[str, StrategySpec] = {}
        self._plugins: set[str] = set()

    def register(
        self,
        name: str,
        params: type[StrategyParams],
        strategy: Callable[..., Strategy],
        *,
        replace: bool = False,
    ) -> None:
        """Register ``strategy`` under ``name``, its entries validated by ``params``
        (``replace=True`` to override an existing name)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a strategy name is a non-empty string")
        if not (isinstance(params, type) and issubclass(params, StrategyParams)):
            raise TypeError(f"{name}: the parameter model must subclass StrategyParams")
        if name in self._specs and not replace:
            raise ValueError(f"strategy {name!r} is already registered")
        self._specs[name] = StrategySpec(name, params, strategy)

    @property
    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._specs)

    def spec(self, name: str) -> StrategySpec:
        """The registration of ``name``."""
        spec = self._specs.get(name)
        if spec is None:
            raise UnknownStrategy(self._unknown(name))
        return spec

    def _unknown(self, name: object) -> str:
        return (
            f"unknown strategy {name!r}; known: {', '.join(self.names) or 'none'} (a strategy "
            "of your own is registered by a module listed in compaction.plugins)"
        )

    def parse(self, value: object, context: object = None) -> StrategyParams:
        """One pipeline entry validated by the model its ``strategy`` names.

        Errors name the path below the entry, with the strategy's name in front of its own
        keys (``truncation.max_n``) as pydantic does for a tagged union; ``context`` is
        passed on to nested entries.
        """
        if isinstance(value, StrategyParams):
            spec = self._specs.get(value.strategy)
            if spec is None or not isinstance(value, spec.params):
                raise error_at(("strategy",), "unknown_strategy", self._unknown(value), value)
            return value
        if not isinstance(value, Mapping):
            raise error_at((), "dict_type", "an entry is a mapping with a strategy key", value)
        name = value.get("strategy")
        if name is None:
            raise error_at(("strategy",), "missing", "Field required", value)
        spec = self._specs.get(name) if isinstance(name, str) else None
        if spec is None:
            raise error_at(("strategy",), "unknown_strategy", self._unknown(name), name)
        try:
            return spec.params.model_validate(value, context=context)
        except ValidationError as exc:
            raise errors_under(spec.name, exc) from None

    def build(self, params: StrategyParams) -> Strategy:
        """The strategy for one validated entry."""
        spec = self.spec(params.strategy)
        if not isinstance(params, spec.params):
            raise TypeError(
                f"strategy {spec.name!r} takes {spec.params.__name__}, not {type(params).__name__}"
            )
        return spec.strategy(**params.arguments(BuildContext(self.build)))

    def load_plugin(self, reference: str) -> None:
        """Call the ``"module:function"`` plug-in with this registry (once per registry)."""
        if reference in self._plugins:
            return
        function = _resolve(reference)
        try:
            function(self)
        except Exception as exc:  # a plug-in's own error, worded for the config's author
            raise PluginError(f"{reference} failed: {type(exc).__name__}: {exc}") from exc
        self._plugins.add(reference)


def _resolve(reference: object) -> Callable[[StrategyRegistry], Any]:
    """The function a ``"module:function"`` reference names."""
    if not isinstance(reference, str):
        raise PluginError("a plug-in is written 'module:function'")
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise PluginError("a plug-in is written 'module:function', e.g. 'my_strategies:register'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PluginError(
            f"cannot import {module_name!r}: {exc} (a plug-in module is installed, or in a "
            "directory on PYTHONPATH)"
        ) from exc
    except Exception as exc:
        raise PluginError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise PluginError(f"{module_name!r} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


STRATEGIES = StrategyRegistry()
"""The process's registry: the built-ins (:mod:`.builtin`) and what ``compaction.plugins``
added."""


def registry_for(context: object) -> StrategyRegistry:
    """The registry a validation ``context`` names (:data:`CONTEXT_KEY`), else
    :data:`STRATEGIES`."""
    if isinstance(context, Mapping):
        chosen = context.get(CONTEXT_KEY)
        if isinstance(chosen, StrategyRegistry):
            return chosen
    return STRATEGIES


def _entry(value: object, info: ValidationInfo) -> StrategyParams:
    return registry_for(info.context).parse(value, info.context)


StrategyEntry = Annotated[SerializeAsAny[StrategyParams], PlainValidator(_entry)]
"""One pipeline entry: validated by the parameter model its ``strategy`` names in the registry
in use (the validation context's ``strategies``, else :data:`STRATEGIES`), written back with
every key of that model."""
