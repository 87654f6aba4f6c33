"""What a strategy's parameter model is, and how it becomes the strategy's arguments.

Each strategy declares its parameters once, as a subclass of :class:`StrategyParams` in its own
module (``TruncationParams`` beside ``TruncationStrategy``): the keys a ``compaction.pipeline``
entry accepts, their defaults, ranges and cross-key rules.  The registry (:mod:`.registry`)
maps a ``strategy:`` name to that model and the strategy class; a pipeline entry
(:data:`.registry.StrategyEntry`) is validated by the model its name selects, and the strategy
is built as ``StrategyClass(**params.arguments(ctx))``.  Most parameter models name the
constructor's keywords exactly and need nothing more; a model whose config shape differs (a
nested LibreChat block, two selection shapes, child entries) overrides :meth:`arguments`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..fields import StrictModel, TargetField, TriggerField

if TYPE_CHECKING:
    from .base import Strategy


@dataclass(frozen=True)
class BuildContext:
    """What building a strategy may need besides its parameters: how to build a child entry
    (a nested ``strategy: pipeline``), with the registry that built the parent."""

    build: Callable[[StrategyParams], Strategy]


class StrategyParams(StrictModel):
    """The keys every pipeline entry accepts; a strategy's model adds its own.

    ``strategy`` is the registered name the entry was written with.  ``minimum_preserved``
    unset means the strategy's own floor (its constructor's default).
    """

    strategy: str
    trigger: TriggerField | None = None
    target: TargetField | None = None
    minimum_preserved: int | None = Field(default=None, ge=0)

    def arguments(self, ctx: BuildContext) -> dict[str, Any]:
        """The strategy constructor's keywords: every parameter by its own name."""
        arguments = {name: getattr(self, name) for name in type(self).model_fields}
        del arguments["strategy"]
        if self.minimum_preserved is None:
            del arguments["minimum_preserved"]
        return arguments


def require_system_kept(preserve_system: bool, strategy: str) -> None:
    """Refuse ``preserve_system: false``: the key exists for the Agent Framework's signature,
    and the only value it may take is the one invariant 1 already holds to."""
    if not preserve_system:
        raise ValueError(
            f'{strategy} never removes system messages (invariant 1, see "Groups and '
            'invariants" in compaction_proxy/compaction/README.md); preserve_system must be true'
        )
