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

from ._lift import THINKING_FIELD, Lifted


def restore_thinking(
    lifted: Lifted, messages: Sequence[Mapping[str, Any]]
) -> tuple[Sequence[Mapping[str, Any]], set[int]]:
    """The pipeline's messages with each assistant piece :class:`ClearThinking` took the
    thinking from put back as the lifted piece (so the lowering finds the client's message,
    by identity), and the ids of the thinking blocks to drop from what it lowers to
    (:func:`drop_thinking`). A piece edited otherwise too (its tool inputs cleared) is left
    to the lowering, which finds it by its calls; its blocks are dropped all the same."""
    with_thinking = [i for i, m in enumerate(lifted.messages) if m.get(THINKING_FIELD)]
    if not with_thinking:
        return messages, set()
    own = {id(message) for message in lifted.messages}
    by_bytes: dict[bytes, list[int]] | None = None
    used: set[int] = set()
    out: list[Mapping[str, Any]] | None = None
    drop: set[int] = set()
    for position, message in enumerate(messages):
        if id(message) in own or message.get("role") != "assistant" or THINKING_FIELD in message:
            continue
        if by_bytes is None:
            by_bytes = {}
            for piece in with_thinking:
                bare = {k: v for k, v in lifted.messages[piece].items() if k != THINKING_FIELD}
                by_bytes.setdefault(canonical_bytes(bare), []).append(piece)
        candidates = by_bytes.get(canonical_bytes(message), [])
        index: int | None = next((i for i in candidates if i not in used), None)
        if index is not None:
            used.add(index)
            if out is None:
                out = list(messages)
            out[position] = lifted.messages[index]
        else:
            index = _by_calls(lifted, message)
            if index is None or not lifted.messages[index].get(THINKING_FIELD):
                continue
        drop.update(id(block) for block in lifted.messages[index][THINKING_FIELD])
    return (out if out is not None else messages), drop


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
