"""Preserved thinking: a compacted request asks Anthropic's API to drop the thinking blocks
compaction unbound, rather than refuse the request.

Claude's newer models (Fable 5.1 and later) bind each ``thinking`` / ``redacted_thinking``
block to its conversation prefix: the top-level ``system``, ``tools`` and everything in
``messages`` before the block. When that prefix changed since the block was made, the API
refuses the request ("The block is bound to a different conversation", a 400; the default for
accounts created after 2026-08-31) unless the request sets
``thinking.block_binding.prefix_mismatch_behavior: "drop_block"`` under the
``thinking-binding-controls-2026-08-01`` beta: then it drops the failing blocks and lists them
in the reply's ``input_transformations``. Compaction changes exactly that prefix (a summary or
a checkpoint in place of older turns, a cleared result), so a compacted request that still
carries signed blocks after the first message it changed would be refused where the client's
own request was accepted. Blocks the model made after the proxy's checkpoint was in place are
bound to the compacted prefix and pass; only the older ones are dropped.

Asked only of Anthropic's own API (:class:`~compaction_proxy.wire.format.UpstreamTraits`):
local servers check no signature, and may refuse a beta or field they do not know. Never over
the client's own ``block_binding`` (its choice), never with thinking turned off (the API's
advice then is to remove the blocks, which is the client's call), never on a request
compaction did not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..format import Amendment, UpstreamTraits
from ._blocks import CACHE_CONTROL, THINKING_TYPES, block_type, blocks_of
from ._sizes import BINDING_BETA

DROP_BLOCK = {"prefix_mismatch_behavior": "drop_block"}
ADAPTIVE = "adaptive"
"""The ``thinking`` type a request without one gets: what models with preserved thinking do
by default, so adding it changes nothing else (Anthropic's advice)."""


def thinking_binding(
    body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
) -> Amendment | None:
    """The amendment that lets ``upstream`` accept ``items`` (the lowered ``messages``) in place
    of the client's: ``thinking`` with ``block_binding`` set to ``drop_block`` and the beta,
    when signed blocks follow the first message compaction changed; None otherwise."""
    if not _may_bind(body, upstream):
        return None
    original = body.get("messages")
    unbound = unbound_blocks(original if isinstance(original, list) else [], items)
    return _drop_block(body, unbound, "compaction changed what comes before")


def offer_binding(
    body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
) -> Amendment | None:
    """The same amendment for a request offered the recall tool (compaction_proxy/wire/
    messages/_recall.py): ``tools`` is part of every block's prefix, so a block made before
    the tool was offered no longer matches it, wherever it is in ``items`` (the forwarded
    ``messages``). Blocks made since (the tool offered as it is now) still match and are kept;
    the API drops only the others. None: no signed block, or a case :func:`thinking_binding`
    leaves alone (not Anthropic's API, the client's own ``block_binding``, thinking off)."""
    if not _may_bind(body, upstream):
        return None
    signed = sum(
        1
        for message in items
        if isinstance(message, Mapping) and message.get("role") == "assistant"
        for block in blocks_of(message.get("content"))
        if block_type(block) in THINKING_TYPES
    )
    return _drop_block(body, signed, "the recall tool was added to the tools before")


def _may_bind(body: Mapping[str, Any], upstream: UpstreamTraits) -> bool:
    """Anthropic's own API, and a ``thinking`` the proxy may write ``block_binding`` into."""
    if not upstream.native:
        return False
    thinking = body.get("thinking")
    return thinking is None or (
        isinstance(thinking, Mapping)
        and "block_binding" not in thinking
        and thinking.get("type") != "disabled"
    )


def _drop_block(body: Mapping[str, Any], unbound: int, cause: str) -> Amendment | None:
    if not unbound:
        return None
    thinking = body.get("thinking")
    merged = {"type": ADAPTIVE} if not isinstance(thinking, Mapping) else dict(thinking)
    merged["block_binding"] = dict(DROP_BLOCK)
    plural = "block" if unbound == 1 else "blocks"
    note = (
        f"thinking.block_binding set to drop_block: {cause} {unbound} signed thinking "
        f"{plural}; the API drops those whose prefix no longer matches"
    )
    return Amendment({"thinking": merged}, (("anthropic-beta", BINDING_BETA),), (note,))


def unbound_blocks(original: Sequence[Any], items: Sequence[Any]) -> int:
    """How many ``thinking`` / ``redacted_thinking`` blocks of assistant messages in ``items``
    come after the first block that differs from the client's ``original`` messages (0: none,
    or nothing differs). A message is the client's when it is the client's object or equals
    it, or differs only by breakpoints or a string written as its text block; in the first
    one that is not, the blocks before its first changed block still have their prefix."""
    change = _first_change(original, items)
    if change is None:
        return 0
    first, kept = change
    count = 0
    for index in range(first, len(items)):
        message = items[index]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        blocks = blocks_of(message.get("content"))
        if index == first:
            blocks = blocks[kept:]
        count += sum(1 for block in blocks if block_type(block) in THINKING_TYPES)
    return count


def _first_change(original: Sequence[Any], items: Sequence[Any]) -> tuple[int, int] | None:
    """The message and block where ``items`` first differ from ``original``; None: nowhere
    (or only by leaving messages off the end, which no block follows)."""
    for index, item in enumerate(items):
        if index >= len(original):
            return index, 0
        before = original[index]
        if item is before or item == before:
            continue
        if not isinstance(before, Mapping) or not isinstance(item, Mapping):
            return index, 0
        if _bare_message(before) != _bare_message(item):
            return index, 0
        old, new = blocks_of(before.get("content")), blocks_of(item.get("content"))
        same = 0
        for block, was in zip(new, old, strict=False):
            if _bare(block) != _bare(was):
                break
            same += 1
        if same == len(old) == len(new):
            continue  # breakpoints or the block form only
        return index, same
    return None


def _bare_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message but its content."""
    return {key: value for key, value in message.items() if key != "content"}


def _bare(block: Any) -> Any:
    if isinstance(block, Mapping) and CACHE_CONTROL in block:
        return {key: value for key, value in block.items() if key != CACHE_CONTROL}
    return block
