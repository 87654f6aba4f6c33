"""The summary call in Anthropic's Messages form: ``POST {base_url}/messages``.

An Anthropic upstream's ``base_url`` ends in ``/v1`` (``https://api.anthropic.com/v1``), as an
OpenAI one does, so the call goes to ``{base_url}/messages``. The Messages format
(compaction_proxy/wire/messages/) names :data:`MESSAGES_SUMMARY` as its ``summary``; the
summarizer also uses it for any upstream whose ``api`` is ``messages``
(docs/configuration.md, ``upstreams``).

Two bodies:

* **from chat-shaped messages** (the transcript form, and its chunks): system messages become
  the ``system`` parameter, user and assistant text become messages of text blocks;
* **the request's own prefix** (:attr:`SummaryCall.prefix`, the cache-aligned form): the
  client's own ``system`` (its ``cache_control`` blocks included), ``tools``, ``tool_choice`` and
  ``thinking``, and its messages up to the stretch's end as the request went upstream (the
  view maps them back, :meth:`View.lower`: the whole request's lowering, cut where the
  prefix's own ends, since a message's form may depend on what follows it), then one user
  message with the instruction.
  The upstream's prompt cache keys the messages on ``thinking`` and ``tool_choice`` too, so
  both go as the client sent them where they allow a text answer: a forced ``tool_choice``
  (``any``, ``tool``) becomes ``{"type": "none"}``, and a manual ``thinking`` budget
  (``"type": "enabled"``, which ``max_tokens`` must exceed) is left out, which costs the cached
  messages (the system and tools stay cached). Adaptive thinking stays; ``max_tokens`` then has
  :data:`THINKING_HEADROOM` over the summary's limit, which the summarizer still holds the text
  to (a reply that thought reports no ``completion_tokens``: ``output_tokens`` counts the
  thinking too). One ``cache_control`` breakpoint goes on the last block of the prefix's cached
  part, the messages the request went upstream with (the API looks for cached prefixes only at
  breakpoints and up to 20 blocks before them; the forwarded requests wrote entries at their
  own ends), not on the stretch messages an earlier strategy made up after it (new content:
  caching it costs more than reading it once); moved from the newest message breakpoint when
  the request already has the 4 the API allows, with the ``cache_control`` of the client's
  newest one (so a longer ``ttl`` never follows a shorter one).

``max_tokens`` is always set (the API requires it; chat's ``limit_param`` does not apply), the
call never streams, and of ``summarization.parameters`` only what Messages accepts is sent
(:data:`ACCEPTED_PARAMETERS`; chat's ``stop`` as ``stop_sequences``): an unknown field is a
400 there. Sampling parameters are left out beside thinking, which refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..format import PrefixCall, SummaryCall, SummaryReply, UpstreamAuth
from ._blocks import (
    CACHE_CONTROL,
    MAX_BREAKPOINTS,
    THINKING_TYPES,
    block_type,
    blocks_of,
    marked,
    marked_blocks,
)
from ._sizes import BINDING_BETA

__all__ = [
    "ACCEPTED_PARAMETERS",
    "ANTHROPIC_VERSION",
    "MESSAGES_SUMMARY",
    "THINKING_HEADROOM",
    "X_API_KEY",
]

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` every call sends (the API requires the header)."""

X_API_KEY = UpstreamAuth("x-api-key", "", version=(("anthropic-version", ANTHROPIC_VERSION),))
"""How an Anthropic upstream takes a key: ``x-api-key: <key>``, no scheme."""

ACCEPTED_PARAMETERS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "metadata",
        "service_tier",
        "thinking",
        "output_config",
    }
)
"""The ``summarization.parameters`` a Messages call sends; the rest are chat's."""

THINKING_HEADROOM = 4096
"""Output tokens allowed beside the summary's limit when the call keeps adaptive thinking: the
thinking is drawn from ``max_tokens`` too."""

_SAMPLING = ("temperature", "top_p", "top_k")
_EPHEMERAL: Mapping[str, Any] = {"type": "ephemeral"}


# ------------------------------------------------------------------ the bodies


def _messages_summary_body(
    parameters: Mapping[str, Any],
    model: str,
    messages: list[dict[str, Any]],
    extra: Mapping[str, Any],
    limit_param: str,
    limit: int,
) -> dict[str, Any]:
    system, turns = messages_form(messages)
    body = _accepted(parameters)
    body.update(model=model, stream=False, messages=turns)
    if system:
        body["system"] = system
    body.update(extra)
    body["max_tokens"] = output_limit(body.get("thinking"), limit)
    return _without_sampling_beside_thinking(body)


def _messages_prefix_body(
    parameters: Mapping[str, Any], model: str, call: PrefixCall, limit: int
) -> dict[str, Any]:
    native = call.request.body
    cached, tail = forwarded_prefix(call)
    if _open_tool_use([*cached, *tail][-1]):
        # the API wants its results in the very next message, not an instruction
        raise ValueError("the prefix ends in a tool use without its results")
    system = native.get("system")
    tools = native.get("tools")
    # The breakpoint closes the cached part: the tail is new, and caching it would cost more
    # than reading it once.
    items = [*with_end_breakpoint(system, tools, cached), *tail]
    body = _accepted(parameters)
    body.pop("thinking", None)  # the request's own decides: the cached messages depend on it
    thinking = kept_thinking(native.get("thinking"))
    body.update(model=model, stream=False)
    if system:
        body["system"] = system
    if tools:
        body["tools"] = tools
    choice = summary_tool_choice(native.get("tool_choice"))
    if choice is not None:
        body["tool_choice"] = choice
    if thinking is not None:
        body["thinking"] = _unbound(thinking, call.request.native, items)
    body["max_tokens"] = output_limit(thinking, limit)
    body["messages"] = [*items, {"role": "user", "content": call.instruction}]
    return _without_sampling_beside_thinking(body)


def _unbound(thinking: Any, native: bool, items: Sequence[Mapping[str, Any]]) -> Any:
    """The call's ``thinking`` on the API's own server when the prefix replays signed thinking:
    asking ``drop_block``, as the forwarded request itself does once compaction changed what
    comes before those blocks (compaction_proxy/wire/messages/_binding.py), or a model that
    binds thinking to its prefix refuses the call. The beta goes with the call's repeated
    headers (:func:`summary_headers`). The client's own ``block_binding`` wins."""
    if not native or not isinstance(thinking, Mapping) or "block_binding" in thinking:
        return thinking
    signed = any(
        block_type(block) in THINKING_TYPES
        for message in items
        for block in blocks_of(message.get("content"))
    )
    if not signed:
        return thinking
    return {**thinking, "block_binding": {"prefix_mismatch_behavior": "drop_block"}}


def forwarded_prefix(call: PrefixCall) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The prefix in Messages form, as (the cached part, the tail): the items the whole
    forwarded request lowers to, as many as its cached part lowers to on its own; then the tail
    lowered after them. ``ValueError`` when the view cannot lower them, or the two lowerings do
    not line up (an item of the client's own in one where the other has another)."""
    lower = call.request.lower
    cached = list(call.forwarded[: call.end])
    try:
        whole = list(lower(call.forwarded).items)
        head = list(lower(cached).items)
        tail = list(lower([*cached, *call.tail]).items)[len(head) :] if call.tail else []
    except Exception as exc:  # the view's own error, whatever its type: the transcript then
        raise ValueError("the prefix cannot be written in Messages form") from exc
    if not head or len(head) > len(whole):
        raise ValueError("the prefix has no Messages messages")
    messages = call.request.body.get("messages")
    own = {id(m) for m in messages} if isinstance(messages, list) else set()
    for alone, in_context in zip(head, whole, strict=False):
        if (id(alone) in own or id(in_context) in own) and alone is not in_context:
            raise ValueError("the prefix does not line up with the forwarded request")
    cached_items = whole[: len(head)]
    if not all(isinstance(item, dict) for item in [*cached_items, *tail]):
        raise ValueError("the prefix has no Messages messages")
    return cached_items, tail


def _open_tool_use(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and any(
        block_type(block) == "tool_use" for block in blocks_of(message.get("content"))
    )


def _accepted(parameters: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in parameters.items() if k in ACCEPTED_PARAMETERS}
    stop = parameters.get("stop")
    if "stop_sequences" not in body:
        if isinstance(stop, str):
            body["stop_sequences"] = [stop]
        elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
            body["stop_sequences"] = list(stop)
    return body


def _thinks(thinking: Any) -> bool:
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _without_sampling_beside_thinking(body: dict[str, Any]) -> dict[str, Any]:
    if _thinks(body.get("thinking")):
        for name in _SAMPLING:
            body.pop(name, None)
    return body


def output_limit(thinking: Any, limit: int) -> int:
    """``max_tokens`` for a summary of at most ``limit`` tokens under ``thinking``: the
    thinking budget (or :data:`THINKING_HEADROOM` for adaptive thinking) on top."""
    if not isinstance(thinking, Mapping):
        return limit
    kind = thinking.get("type")
    if kind == "adaptive":
        return limit + THINKING_HEADROOM
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and isinstance(budget, int) and not isinstance(budget, bool):
        return limit + max(budget, 0)
    return limit


def kept_thinking(thinking: Any) -> Any:
    """The request's ``thinking`` as the prefix-form call sends it: as sent, except a manual
    budget (``enabled``), whose ``budget_tokens`` ``max_tokens`` would have to exceed."""
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        return None
    return thinking


def summary_tool_choice(value: Any) -> Any:
    """The request's ``tool_choice`` when it lets the model answer in text, else ``none``
    (``None``: leave the field out, as the request did)."""
    if isinstance(value, Mapping) and value.get("type") in ("any", "tool"):
        return {"type": "none"}
    return value


def messages_form(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Chat-shaped messages as (``system``, ``messages``): system and developer messages
    joined into the one ``system`` text; every other message as text blocks, assistant ones
    as ``assistant`` and the rest as ``user``; a message without text is left out (the API
    refuses empty content)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        texts = _texts(message.get("content"))
        if role in ("system", "developer"):
            system.extend(texts)
            continue
        blocks = [{"type": "text", "text": text} for text in texts if text]
        if blocks:
            turns.append(
                {"role": "assistant" if role == "assistant" else "user", "content": blocks}
            )
    return "\n\n".join(t for t in system if t), turns


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            str(part["text"])
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
    return []


# ------------------------------------------------------------------ breakpoints


def with_end_breakpoint(
    system: Any, tools: Any, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` with a ``cache_control`` on the last message's last markable block (not a
    thinking block, not empty text), copying only what changes. At the API's limit, the
    newest message breakpoint moves there; with none in the messages to move, or nothing to
    mark, ``messages`` as they are."""
    target = _end_target(messages[-1])
    if target is None:
        return messages
    newest = _newest_mark(messages)
    if newest == (len(messages) - 1, target):
        return messages  # the client's own breakpoint is there already
    control = _control_of(newest, messages) if newest is not None else None
    out = list(messages)
    if marked_blocks(system, tools, messages) >= MAX_BREAKPOINTS:
        if newest is None:
            return messages
        out[newest[0]] = _unmarked(out[newest[0]], newest[1])
    out[-1] = _marked_at(out[-1], target, control or _last_control(system, tools))
    return out


def _end_target(message: Mapping[str, Any]) -> int | None:
    content = message.get("content")
    if isinstance(content, str):
        return 0 if content else None
    blocks = blocks_of(content)
    for index in range(len(blocks) - 1, -1, -1):
        block = blocks[index]
        if not isinstance(block, Mapping) or block.get("type") in THINKING_TYPES:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        return index
    return None


def _marked_at(
    message: Mapping[str, Any], index: int, control: Mapping[str, Any]
) -> dict[str, Any]:
    blocks = list(blocks_of(message.get("content")))
    blocks[index] = {**blocks[index], CACHE_CONTROL: dict(control)}
    return {**message, "content": blocks}


def _newest_mark(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
    """(message, block) of the newest marked content block."""
    for m_index in range(len(messages) - 1, -1, -1):
        blocks = blocks_of(messages[m_index].get("content"))
        for b_index in range(len(blocks) - 1, -1, -1):
            if marked(blocks[b_index]):
                return m_index, b_index
    return None


def _control_of(where: tuple[int, int], messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    block = blocks_of(messages[where[0]].get("content"))[where[1]]
    control: Mapping[str, Any] = block[CACHE_CONTROL]
    return control


def _last_control(system: Any, tools: Any) -> Mapping[str, Any]:
    for group in (blocks_of(system), blocks_of(tools)):
        for block in reversed(group):
            if marked(block):
                control: Mapping[str, Any] = block[CACHE_CONTROL]
                return control
    return _EPHEMERAL


def _unmarked(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    blocks = list(blocks_of(message.get("content")))
    blocks[index] = {k: v for k, v in blocks[index].items() if k != CACHE_CONTROL}
    return {**message, "content": blocks}


# ------------------------------------------------------------------ the answer


def _read_messages_summary(payload: Any) -> SummaryReply:
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        raise ValueError("not a Messages reply")
    if payload.get("type", "message") != "message" or payload.get("role", "assistant") != (
        "assistant"
    ):
        raise ValueError("not a Messages reply")
    content = payload["content"]
    text = "".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )
    thought = any(isinstance(b, dict) and b.get("type") in THINKING_TYPES for b in content)
    usage = payload.get("usage")
    return SummaryReply(
        text=text,
        cut=payload.get("stop_reason") == "max_tokens",
        # `output_tokens` counts the thinking too; the summarizer counts the text then
        completion_tokens=None if thought else _count(usage, "output_tokens"),
        cached_tokens=_count(usage, "cache_read_input_tokens") or 0,
    )


def _count(usage: Any, name: str) -> int | None:
    value = usage.get(name) if isinstance(usage, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


MESSAGES_SUMMARY = SummaryCall(
    "/messages",
    _messages_summary_body,
    _read_messages_summary,
    what="a Messages reply",
    prefix=_messages_prefix_body,
    headers=(("anthropic-version", ANTHROPIC_VERSION),),
    repeats=("anthropic-version", "anthropic-beta"),
    native_listed=(("anthropic-beta", BINDING_BETA),),
)
"""The summary call as a Messages request: what Anthropic's API, and the local servers that
serve ``/v1/messages`` (llama.cpp, vLLM, Ollama, LM Studio), answer."""
