"""The lowering's part of ``clear_thinking_20251015``: an assistant piece whose thinking
:class:`._edit_strategies.ClearThinking` cleared goes upstream as the client's message without
its ``thinking`` / ``redacted_thinking`` blocks.

The view's chat messages carry an assistant message's signed thinking in a riding field
(:data:`._lift.THINKING_FIELD`); the strategy drops the field, which :mod:`._lower` would take
for a message some strategy made up. So before lowering, each such piece is put back as the
piece lifted from the client (the lowering then finds the client's message by identity), and
afterwards the thinking blocks are taken out of what it lowered to, by the identity of the
client's own block objects: every other block, and every byte of the message the proxy did not
change, stays the client's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compaction_proxy.compaction.canonical import canonical_bytes

from ._lift import THINKING_FIELD, Lifted, thinking_blocks


def restore_thinking(
    lifted: Lifted, messages: Sequence[Mapping[str, Any]]
) -> tuple[Sequence[Mapping[str, Any]], set[int]]:
    """The pipeline's messages with each assistant piece :class:`ClearThinking` took the
    thinking from put back as the lifted piece (so the lowering finds the client's message,
    by identity), and the ids of the thinking blocks to drop from what it lowers to
    (:func:`drop_thinking`). A piece edited otherwise too (its tool inputs cleared) is left
    to the lowering, which finds it by its calls; its blocks are dropped all the same.

    A piece read back from a checkpoint is a copy: it is matched by its bytes, to the client's
    assistant piece with the same bytes or (its thinking cleared) the same bytes but the
    thinking, the next one after the last piece matched first, so that two pieces that differ
    only in their thinking are told apart by where they sit."""
    if not any(m.get(THINKING_FIELD) for m in lifted.messages):
        return messages, set()
    own = {id(message): index for index, message in enumerate(lifted.messages)}
    pieces: _Pieces | None = None
    out: list[Mapping[str, Any]] | None = None
    drop: set[int] = set()
    following = 0
    for position, message in enumerate(messages):
        index = own.get(id(message))
        if index is not None:
            following = index + 1
            if pieces is not None:
                pieces.used.add(index)
            continue
        if message.get("role") != "assistant":
            continue
        if pieces is None:
            seen = {own[id(m)] for m in messages[:position] if id(m) in own}
            pieces = _Pieces.of(lifted, seen)
        index, cleared = pieces.match(message, following)
        if index is None:
            index = _by_calls(lifted, message) if THINKING_FIELD not in message else None
            if index is None or not lifted.messages[index].get(THINKING_FIELD):
                continue
        else:
            following = index + 1
            if not cleared:
                continue
            if out is None:
                out = list(messages)
            out[position] = lifted.messages[index]
        drop.update(id(block) for block in thinking_blocks(lifted, index))
    return (out if out is not None else messages), drop


class _Pieces:
    """The lifted assistant pieces by their bytes (``exact``) and, for those with thinking,
    by their bytes without it (``bare``), and those already matched."""

    __slots__ = ("bare", "exact", "used")

    def __init__(
        self, exact: dict[bytes, list[int]], bare: dict[bytes, list[int]], used: set[int]
    ) -> None:
        self.exact = exact
        self.bare = bare
        self.used = used

    @classmethod
    def of(cls, lifted: Lifted, used: set[int]) -> _Pieces:
        exact: dict[bytes, list[int]] = {}
        bare: dict[bytes, list[int]] = {}
        for index, message in enumerate(lifted.messages):
            if message.get("role") != "assistant":
                continue
            exact.setdefault(canonical_bytes(message), []).append(index)
            if message.get(THINKING_FIELD):
                stripped = {k: v for k, v in message.items() if k != THINKING_FIELD}
                bare.setdefault(canonical_bytes(stripped), []).append(index)
        return cls(exact, bare, used)

    def match(self, message: Mapping[str, Any], following: int) -> tuple[int | None, bool]:
        """The piece ``message`` is a copy of, and whether its thinking was cleared."""
        data = canonical_bytes(message)
        found = [(i, False) for i in self.exact.get(data, ())]
        if THINKING_FIELD not in message:
            found += [(i, True) for i in self.bare.get(data, ())]
        free = sorted((item for item in found if item[0] not in self.used), key=lambda f: f[0])
        choice = next((f for f in free if f[0] >= following), free[0] if free else None)
        if choice is None:
            return None, False
        self.used.add(choice[0])
        return choice


def _by_calls(lifted: Lifted, message: Mapping[str, Any]) -> int | None:
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        call_id = call.get("id") if isinstance(call, Mapping) else None
        if isinstance(call_id, str) and call_id in lifted.calls:
            return lifted.calls[call_id]
    return None


def drop_thinking(items: Sequence[Any], drop: set[int]) -> list[Any]:
    """``items`` (lowered messages) without the thinking blocks named in ``drop`` (by
    identity: the client's own block objects)."""
    out = list(items)
    for position, item in enumerate(out):
        content = item.get("content") if isinstance(item, Mapping) else None
        if not isinstance(content, list) or not any(id(block) in drop for block in content):
            continue
        kept = [block for block in content if id(block) not in drop]
        if kept:
            out[position] = {**item, "content": kept}
    return out
