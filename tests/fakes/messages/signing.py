"""Signed thinking: the fake signs what it thinks, and checks what comes back as the API does.

A signature is ``base64(b"FK1" + prefix digest + HMAC-SHA256(secret, prefix digest + text))``,
where the prefix digest is that of everything the block came after (tools, system, earlier
messages, earlier blocks of its own reply; see :mod:`tests.fakes.messages.prompt`) and ``text``
is the ``thinking`` the client was shown (empty with ``display: "omitted"``, as Claude Code asks).
So a changed thinking text or a forged signature fails ("Invalid `signature` in `thinking`
block"), always.

Whether the prefix must still match is ``thinking_binding``, Anthropic's *preserved thinking*
(Claude 5.1 and later models bind each block to its conversation prefix):

- ``off`` (default): not checked, as on models without preserved thinking.
- ``record``: an older account: not enforced unless the request sets
  ``thinking.block_binding.prefix_mismatch_behavior``; under the
  ``thinking-binding-controls-2026-08-01`` beta each failing block is listed in the reply's
  ``input_transformations`` as ``thinking_mismatch_allowed``.
- ``enforce``: an account created after 2026-08-31: a failing block is a 400 ("The block is
  bound to a different conversation. ... first at `<path>`"), unless the request asks for
  ``drop_block``: then the failing blocks are removed before counting and listed as
  ``thinking_dropped`` / ``prefix_binding_mismatch``.

Setting ``block_binding`` without the beta is the API's 400 ("Extra inputs are not permitted").
``redacted_thinking`` the fake did not make is accepted as is; its own carries the same token
in ``data`` and is bound the same way.

The final-turn rule: with thinking on, an assistant turn whose tool uses the last message
answers must start with a thinking block, when ``thinking.type`` is ``enabled`` or when the
fake itself thought in that turn (adaptive thinking may not think, so only then can the API
know).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.messages.prompt import DIGEST_SIZE, Prompt, content_blocks

BINDING_MODES = ("off", "record", "enforce")
BINDING_BETA = "thinking-binding-controls-2026-08-01"
BEHAVIOURS = ("error", "drop_block")
_MAGIC = b"FK1"
_MAC_SIZE = 32

FINAL_TURN_MESSAGE = (
    "Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, "
    "a final `assistant` message must start with a thinking block (preceeding the lastmost set "
    "of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
    "previous turns. To avoid this requirement, disable `thinking`. Please consult our "
    "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
BOUND_MESSAGE = (
    "Invalid `signature` in `thinking` block. The block is bound to a different conversation. "
    'Remove the block, or set `thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
)


@dataclass
class ThinkingCheck:
    problem: str | None = None
    dropped: list[str] = field(default_factory=list)
    transformations: list[dict[str, str]] = field(default_factory=list)


class Signer:
    """Makes and checks signatures; remembers where each block was made, for the error text."""

    LIMIT = 20_000

    def __init__(self, secret: bytes = b"compaction-proxy fake messages upstream") -> None:
        self._secret = secret
        self._origins: OrderedDict[bytes, tuple[bytes, ...]] = OrderedDict()
        self._thought: OrderedDict[str, None] = OrderedDict()

    def sign(self, text: str, prefix: bytes, origin: Sequence[bytes]) -> str:
        """A signature of ``text`` made after ``prefix``; ``origin`` lists the prefix's units."""
        mac = hmac.new(self._secret, prefix + text.encode(), hashlib.sha256).digest()
        self._remember(self._origins, mac, tuple(origin))
        return base64.b64encode(_MAGIC + prefix + mac).decode()

    def opened(self, signature: Any, text: str) -> tuple[bytes, bytes] | None:
        """The (prefix digest, mac) of a signature that matches ``text``; None when it does not."""
        parsed = _parse(signature)
        if parsed is None:
            return None
        prefix, mac = parsed
        expected = hmac.new(self._secret, prefix + text.encode(), hashlib.sha256).digest()
        return parsed if hmac.compare_digest(mac, expected) else None

    def origin(self, mac: bytes) -> tuple[bytes, ...] | None:
        return self._origins.get(mac)

    def note_thought(self, tool_use_ids: Sequence[str]) -> None:
        for tool_id in tool_use_ids:
            self._remember(self._thought, tool_id, None)

    def thought(self, tool_use_id: str) -> bool:
        return tool_use_id in self._thought

    def _remember(self, table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.LIMIT:
            table.popitem(last=False)


def _parse(signature: Any) -> tuple[bytes, bytes] | None:
    if not isinstance(signature, str):
        return None
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != len(_MAGIC) + DIGEST_SIZE + _MAC_SIZE or not raw.startswith(_MAGIC):
        return None
    body = raw[len(_MAGIC) :]
    return body[:DIGEST_SIZE], body[DIGEST_SIZE:]


def betas(headers: dict[str, str]) -> set[str]:
    return {item.strip() for item in headers.get("anthropic-beta", "").split(",") if item.strip()}


def thinking_type(payload: dict[str, Any]) -> str | None:
    thinking = payload.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    return kind if isinstance(kind, str) else None


def check_thinking(
    payload: dict[str, Any],
    prompt: Prompt,
    beta: set[str],
    mode: str,
    signer: Signer,
) -> ThinkingCheck:
    """Signatures, binding (by ``mode``) and the final-turn rule, on the request's thinking."""
    check = ThinkingCheck()
    thinking = payload.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, dict) else None
    behaviour: str | None = None
    if binding is not None:
        where = f"thinking.{thinking_type(payload)}.block_binding"
        if BINDING_BETA not in beta:
            check.problem = f"{where}: Extra inputs are not permitted"
            return check
        behaviour = binding.get("prefix_mismatch_behavior") if isinstance(binding, dict) else None
        if behaviour not in BEHAVIOURS:
            check.problem = (
                f"{where}.prefix_mismatch_behavior: Input should be 'error' or 'drop_block'"
            )
            return check
    if mode == "enforce" and behaviour is None:
        behaviour = "error"
    for index, unit in enumerate(prompt.units):
        if unit.role != "assistant" or unit.kind not in ("thinking", "redacted_thinking"):
            continue
        block = unit.raw if isinstance(unit.raw, dict) else {}
        if unit.kind == "thinking":
            if "signature" not in block:
                check.problem = f"{unit.path}.thinking.signature: Field required"
                return check
            opened = signer.opened(block.get("signature"), str(block.get("thinking", "")))
            if opened is None:
                check.problem = f"{unit.path}: Invalid `signature` in `thinking` block"
                return check
        else:
            opened = signer.opened(block.get("data"), "")
            if opened is None:  # not the fake's own: accepted as is
                continue
        if mode == "off" or opened[0] == prompt.content_before(index):
            continue
        if behaviour == "error":
            check.problem = f"{unit.path}: {BOUND_MESSAGE}" + _first_change(
                prompt, index, signer.origin(opened[1])
            )
            return check
        if behaviour == "drop_block":
            check.dropped.append(unit.path)
            check.transformations.append(_entry("thinking_dropped", unit.path))
        elif BINDING_BETA in beta:
            check.transformations.append(_entry("thinking_mismatch_allowed", unit.path))
    check.problem = _final_turn_problem(payload, signer, set(check.dropped))
    return check


def _entry(kind: str, path: str) -> dict[str, str]:
    return {"type": kind, "path": path, "reason": "prefix_binding_mismatch"}


def _first_change(prompt: Prompt, index: int, origin: tuple[bytes, ...] | None) -> str:
    if origin is None:  # made by an earlier process of the fake
        return ""
    for position in range(index + 1):
        current = prompt.units[position].digest if position < index else None
        made = origin[position] if position < len(origin) else None
        if current != made:
            path = prompt.units[min(position, index)].path
            return (
                f" Content before this block differs from when it was created, first at `{path}`."
            )
    return ""


def _final_turn_problem(payload: dict[str, Any], signer: Signer, dropped: set[str]) -> str | None:
    kind = thinking_type(payload)
    messages = payload.get("messages") or []
    if kind not in ("enabled", "adaptive") or len(messages) < 2:
        return None
    last, turn = messages[-1], messages[-2]
    if last.get("role") != "user" or turn.get("role") != "assistant":
        return None
    results = [b for b in content_blocks(last.get("content")) if b.get("type") == "tool_result"]
    blocks = content_blocks(turn.get("content"))
    uses = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
    if not results or not uses:
        return None
    index = len(messages) - 2
    if any(path.startswith(f"messages.{index}.") for path in dropped):
        return None
    required = kind == "enabled" or any(signer.thought(use) for use in uses)
    first = blocks[0].get("type") if blocks else None
    if required and first not in ("thinking", "redacted_thinking"):
        return f"messages.{index}.content.0.type: " + FINAL_TURN_MESSAGE.format(found=first)
    return None
