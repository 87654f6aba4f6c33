"""What a wire format knows about the recall tool (docs/recall.md).

The proxy offers one tool of its own, ``compaction_recall``, to an agent's request once
something of its conversation is archived, and answers the model's calls to it itself: the
client never sees the hidden step. The loop (``compaction_proxy/api/_recall.py``) is shared;
each format says, through :class:`RecallWire`, how its request declares a tool, how its reply
(JSON or a buffered stream) shows a call to one, how a reply is given back without the
proxy's calls (a turn that also called the client's own tools), and how the request is
continued with the answers.

Everything here works on whole values: a reply is read once it has ended (the loop holds a
reply to a request that offered the tool), a continuation is built from the forwarded request
as parsed. Nothing is streamed through these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._amendment import Amendment, UpstreamTraits

__all__ = [
    "RECALL",
    "RECALL_TOOL",
    "RecallAnswer",
    "RecallCall",
    "RecallTool",
    "RecallTurn",
    "RecallWire",
]

RECALL_TOOL = "compaction_recall"
"""The tool's name: prefixed so it cannot be mistaken for a client's tool (a client that
declares a tool of this name gets a 400, never a silent clash)."""


@dataclass(frozen=True, slots=True)
class RecallTool:
    """The tool as the proxy declares it, format-neutral: each format writes it its own way
    (chat: ``{"type": "function", "function": {...}}``; Responses: ``{"type": "function",
    "name": ...}``; Messages: ``{"name", "description", "input_schema"}``)."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # a JSON schema object


RECALL = RecallTool(
    name=RECALL_TOOL,
    description=(
        "Earlier parts of this conversation were compacted: summarized, cleared or cut. "
        "Each placeholder or summary names a recall id (like [recall id r1a2b3c4d5e6]). "
        "Call this tool with those ids to read the originals again, or with a query to search "
        "everything compacted away, before guessing or re-running a tool."
    ),
    parameters={
        "type": "object",
        "properties": {
            "ids": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Recall ids named by placeholders or summaries.",
            },
            "query": {
                "type": "string",
                "description": "Words to search the compacted originals for.",
            },
            "page": {
                "type": "integer",
                "minimum": 1,
                "description": "The page of a long answer (default 1).",
            },
        },
        "additionalProperties": False,
    },
)
"""The tool as every format declares it."""


@dataclass(frozen=True, slots=True)
class RecallCall:
    """One call of the recall tool in a reply: its id (chat ``tool_calls[].id``, Responses
    ``call_id``, Messages ``tool_use.id``) and its arguments as the model wrote them (JSON
    text; the loop parses them and answers a malformed one with an error text, not a
    failure)."""

    call_id: str
    arguments: str


@dataclass(frozen=True, slots=True)
class RecallTurn:
    """A reply that called the recall tool.

    ``calls``: its recall calls, in order. ``others``: how many calls of the client's own
    tools it made beside them (a mixed turn when > 0). ``assistant``: the reply's turn in the
    request's own form (chat: one assistant message with its ``tool_calls``; Responses: the
    output items; Messages: one assistant message with every content block, thinking and its
    signature included), exactly what :meth:`RecallWire.continuation` appends.
    """

    calls: tuple[RecallCall, ...]
    others: int
    assistant: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class RecallAnswer:
    """What the proxy answers one call with: plain text (a tool result)."""

    call_id: str
    text: str
    is_error: bool = False


class RecallWire(Protocol):
    """One format's side of the recall loop; see the module docstring."""

    def declared(self, body: Mapping[str, Any]) -> bool:
        """Whether the request declares tools of its own (only an agent is offered recall)."""
        ...

    def clashes(self, body: Mapping[str, Any], name: str) -> bool:
        """Whether the client's own tools already hold one named ``name``."""
        ...

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        """What the request needs, offered the tool, to be accepted by ``upstream``: used in
        place of :meth:`WireFormat.amend` (Messages: the thinking binding that covers every
        signed block, since ``tools`` is part of each one's prefix; the OpenAI formats:
        None)."""
        ...

    def offer(self, body: Mapping[str, Any], tool: RecallTool) -> dict[str, Any]:
        """The body members to write so the request also declares ``tool`` (``{"tools":
        [...the client's tools, the recall tool]}``); the client's tools keep their order and
        bytes, the recall tool goes last, so the tool list's prefix stays cache-stable."""
        ...

    def read(self, reply: bytes, *, stream: bool, name: str) -> RecallTurn | None:
        """The recall calls in a whole reply (``stream``: an SSE body, every event of it), or
        None when it calls no tool named ``name`` (also for a reply that is not one: an error,
        a body that does not parse)."""
        ...

    def strip(self, reply: bytes, *, stream: bool, name: str) -> bytes:
        """``reply`` without its calls of ``name``, in a shape the client's SDK accepts: the
        client's own calls kept (renumbered where the format numbers them), everything else
        byte for byte where the format allows."""
        ...

    def continuation(
        self,
        body: Mapping[str, Any],
        turn: RecallTurn,
        answers: Sequence[RecallAnswer],
    ) -> dict[str, Any]:
        """The body members to write for the next round: the forwarded request's items
        (``body``: the forwarded request, parsed) followed by ``turn.assistant`` and one tool
        result per answer, in the format's form (chat: ``{"messages": [...]}``; Responses:
        ``{"input": [...]}``; Messages: ``{"messages": [...]}``)."""
        ...

    def closing(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body members that keep the model from calling any tool in the last round the
        loop allows (chat and Responses ``tool_choice: "none"``; Messages ``tool_choice:
        {"type": "none"}``)."""
        ...
