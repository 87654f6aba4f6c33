"""A Messages request in the core's terms: chat-shaped messages, and what maps them back.

The compaction core works on chat messages (see "Groups and invariants" in
compaction_proxy/compaction/README.md). Rather than teach it a third wire format, the adapter shows
it each
Messages conversation as chat messages and maps the result back (:mod:`._lower`), so the
strategies, budget, triggers, checkpoints and reports are the very ones chat completions use.

Each chat message stands for a *piece* of one client message:

- the top-level ``system`` (a string or text blocks): one system message, which is never part of
  the ``messages`` spliced back (the client's ``system`` goes upstream as it came);
- a ``role: "system"`` message inside ``messages``: a system message, which the core never
  drops, edits or summarizes, so it keeps its place;
- a user message without ``tool_result`` blocks: a user message;
- a user message with ``tool_result`` blocks: one ``tool`` message per result (the core pairs it
  with its ``tool_use`` wherever it sits, and keeps parallel results with their calls); its
  other blocks (Claude Code's system reminders after the results) ride on the last result's
  ``tool`` message, in a ``blocks`` field. They belong to the step: shown as a user message of
  their own they would start a new turn, which leaves the newest step unprotected (a strategy
  could drop the very calls the model must answer) and makes every reminder of a tool loop a
  turn of its own;
- an assistant message: one assistant message, its text as ``text`` parts, its ``tool_use``
  blocks as ``tool_calls`` (input as JSON text), its ``thinking`` / ``redacted_thinking`` blocks
  riding in a ``thinking`` field (what the model reads of them: the text, not the signature)
  and its server-tool and unknown blocks in a ``blocks`` field (counted as JSON, never edited,
  dropped only with the whole turn: a strategy that drops a step drops its thinking with it,
  and one that edits a step never touches its thinking).

The chat messages are a pure function of what the model reads: ``cache_control`` (which moves
to the newest block every turn) is left out, so a checkpoint's hash chain over them is stable
from one request to the next. They are never sent anywhere: :mod:`._lower` maps every message
the pipeline kept back to the client's own message objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from compaction_proxy.compaction.canonical import json_text

from ._blocks import CACHE_CONTROL, THINKING_TYPES, block_type, lift_part, lift_parts

THINKING_FIELD = "thinking"
"""Where an assistant message's signed thinking blocks ride; the summarizer's transcript drops
the field whole."""
BLOCKS_FIELD = "blocks"
"""Where server-tool and unknown assistant blocks ride, and the blocks after the results of a
user message, counted as their JSON."""


class Piece(Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    RESULT = "result"


@dataclass(frozen=True, slots=True)
class Owner:
    """Which part of which client message a chat message stands for.

    ``source``: the index in the request's ``messages``; ``blocks``: the indices of the
    content blocks it stands for (``None``: the whole content, a string or every block).
    """

    piece: Piece
    source: int
    blocks: tuple[int, ...] | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Lifted:
    """A Messages request as the core sees it, and what is needed to map it back.

    ``messages[i]`` stands for ``owners[i]`` (``None``: the top-level ``system``).
    ``results`` and ``calls`` find a message by tool-use id, for messages a strategy edited;
    ``pieces[source]`` are the chat messages that stand for one client message.
    """

    messages: list[dict[str, Any]]
    owners: list[Owner | None]
    sources: list[Any]
    pieces: dict[int, list[int]]
    results: dict[str, list[int]]
    calls: dict[str, int]

    def chat_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """What the compaction flow takes: model, messages, tools, the output limit and the
        per-user field that keys its checkpoints (``metadata.user_id`` as ``user``)."""
        chat: dict[str, Any] = {"model": body.get("model"), "messages": self.messages}
        tools = chat_tools(body.get("tools"))
        if tools:
            chat["tools"] = tools
        metadata = body.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if isinstance(user, str) and user:
            chat["user"] = user
        limit = body.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            chat["max_completion_tokens"] = limit
        return chat


def request_messages(body: Mapping[str, Any]) -> list[Any]:
    value = body.get("messages")
    return value if isinstance(value, list) else []


def lift(body: Mapping[str, Any]) -> Lifted:
    """The chat-shaped view of a validated Messages body (see the module docstring)."""
    sources = request_messages(body)
    messages: list[dict[str, Any]] = []
    owners: list[Owner | None] = []
    system = body.get("system")
    if system is not None and system != "" and system != []:
        messages.append({"role": "system", "content": lift_parts(system)})
        owners.append(None)
    pieces: dict[int, list[int]] = {}
    results: dict[str, list[int]] = {}
    calls: dict[str, int] = {}
    for source, message in enumerate(sources):
        for owner, chat in _pieces(source, message):
            index = len(messages)
            messages.append(chat)
            owners.append(owner)
            pieces.setdefault(source, []).append(index)
            if owner.piece is Piece.RESULT and owner.key is not None:
                results.setdefault(owner.key, []).append(index)
            for call in chat.get("tool_calls") or ():
                calls.setdefault(call["id"], index)
    return Lifted(messages, owners, sources, pieces, results, calls)


def _pieces(source: int, message: Mapping[str, Any]) -> list[tuple[Owner, dict[str, Any]]]:
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        return [(Owner(Piece.SYSTEM, source), {"role": "system", "content": lift_parts(content)})]
    if role == "assistant":
        return [(Owner(Piece.ASSISTANT, source), _assistant(content))]
    if not isinstance(content, list) or not any(block_type(b) == "tool_result" for b in content):
        return [(Owner(Piece.USER, source), {"role": "user", "content": lift_parts(content)})]
    out: list[tuple[Owner, dict[str, Any]]] = []
    rest: list[int] = []
    for position, block in enumerate(content):
        if block_type(block) != "tool_result":
            rest.append(position)
            continue
        key = block.get("tool_use_id")
        chat: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": key,
            "content": _result_content(block.get("content")),
        }
        if block.get("is_error") is True:
            chat["is_error"] = True
        out.append((Owner(Piece.RESULT, source, (position,), key), chat))
    if rest:  # they ride with the last result (see the module docstring)
        owner, chat = out[-1]
        assert owner.blocks is not None
        chat[BLOCKS_FIELD] = [lift_part(content[position]) for position in rest]
        out[-1] = (Owner(Piece.RESULT, source, (*owner.blocks, *rest), owner.key), chat)
    return out


def _result_content(content: Any) -> Any:
    if content is None:
        return ""
    return lift_parts(content)


def _assistant(content: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    if isinstance(content, str):
        message["content"] = content
        return message
    texts: list[Any] = []
    calls: list[dict[str, Any]] = []
    thinking: list[Any] = []
    riding: list[Any] = []
    for block in content if isinstance(content, list) else ():
        kind = block_type(block)
        if kind == "text":
            texts.append(lift_part(block))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind in THINKING_TYPES:
            thinking.append(_thought(block))
        else:
            riding.append(lift_part(block))
    message["content"] = texts or None
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message[THINKING_FIELD] = thinking
    if riding:
        message[BLOCKS_FIELD] = riding
    return message


def _thought(block: Mapping[str, Any]) -> dict[str, Any]:
    """A thinking block as the core counts it: what the model reads of it. The signature (a
    long base64 seal the model never reads: a quarter of a Claude Code session's bytes) and
    ``cache_control`` are left out; a redacted block's ``data`` stands for the thinking it
    hides."""
    if block.get("type") == "thinking":
        text = block.get("thinking")
        return {"type": "thinking", "thinking": text if isinstance(text, str) else ""}
    return {"type": "redacted_thinking", "data": block.get("data")}


def thinking_blocks(lifted: Lifted, index: int) -> list[Any]:
    """The client's own thinking blocks of the assistant piece ``lifted.messages[index]``
    (its :data:`THINKING_FIELD` holds what the core counts of them, in the same order)."""
    owner = lifted.owners[index]
    if owner is None:
        return []
    content = lifted.sources[owner.source].get("content")
    blocks = content if isinstance(content, list) else []
    return [block for block in blocks if block_type(block) in THINKING_TYPES]


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    function = {"name": block.get("name"), "arguments": json_text(block.get("input", {}))}
    return {"id": block.get("id"), "type": "function", "function": function}


def chat_tools(tools: Any) -> list[Any] | None:
    """The request's tools for counting: client tools (``name``, ``description``,
    ``input_schema``) in chat's nested function shape, which the core renders as the model
    sees them; server tools (``type`` such as ``web_search_20250305``) as they are."""
    if not isinstance(tools, list) or not tools:
        return None
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, Mapping) and "input_schema" in tool:
            function: dict[str, Any] = {"name": tool.get("name")}
            if "description" in tool:
                function["description"] = tool["description"]
            function["parameters"] = tool.get("input_schema")
            out.append({"type": "function", "function": function})
        elif isinstance(tool, Mapping):
            out.append({k: v for k, v in tool.items() if k != CACHE_CONTROL})
        else:
            out.append(tool)
    return out
