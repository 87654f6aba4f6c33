"""Where a checkpoint is stored: a hash chain over the messages, under a namespace.

Keys form a hash chain over the messages after the leading system block,
`h_0 = H(namespace)`, `h_i = H(h_{i-1} ‖ canonical(m_i))`, so one store round trip over all
`h_i` finds the longest stored prefix. The namespace holds everything else that can reach a
summary or a checkpoint (:func:`namespace_for`, :func:`scope_of`): a hash of the caller's
credential, the summarizer model and prompts, the compaction configuration, and the request's
own scope: its leading system block and `tools` (a summary call in the prefix form sends both
to the summarizer, so a summary can quote them) and the per-user fields a client sends
(`user`, `safety_identifier`, the `X-Compaction-Tenant` header). Two conversations that differ
in any of them never share a checkpoint, a prepared summary or a summary in flight, even under
one API key. The price: a system prompt or tool list that changes from request to request (a
timestamp in it) finds no checkpoint, so each such request over the trigger is summarized
afresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compaction_proxy.compaction.canonical import canonical_bytes, digest

Message = dict[str, Any]
_SYSTEM_ROLES = frozenset({"system", "developer"})
NAMESPACE_VERSION = "cp2"  # cp2: the request's scope (system block, tools, tenant) joined it
SCOPE_FIELDS = ("user", "safety_identifier")
"""Per-user fields of a request body (chat completions and Responses alike) that key its
checkpoints: an app serving many end users under one key sends them to tell them apart."""


def leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    for message in messages:
        if message.get("role") not in _SYSTEM_ROLES:
            break
        count += 1
    return count


def namespace_for(
    *,
    credential: str | None,
    summarizer_model: str,
    prompt_version: str,
    fingerprint: str,
    scope: str = "",
) -> str:
    """One namespace per tenant, summarizer model, prompt version, compaction config and
    request scope (:func:`scope_of`).

    The credential is hashed: the namespace is stored and logged, the key must never be.
    """
    tenant = digest((credential or "anonymous").encode()).hex()
    parts = [NAMESPACE_VERSION, tenant, summarizer_model, prompt_version, fingerprint, scope]
    return digest("\x1f".join(parts).encode()).hex()


def scope_of(body: Mapping[str, Any], tenant: str | None = None) -> str:
    """The digest of what, besides the credential and the chained messages, can reach a
    summary or a checkpoint of ``body`` (a chat-shaped body: the Responses adapter's view has
    ``instructions`` as its first system message).

    The leading system block and the tool definitions (``tools``, legacy ``functions``) go
    to the summarizer with the prefix form; the per-user fields (:data:`SCOPE_FIELDS`) and
    ``tenant`` (the ``X-Compaction-Tenant`` header) name whose conversation it is.
    ``tool_choice`` is left out: it names a tool the definitions already hold, and clients
    flip it between turns.
    """
    messages = body.get("messages")
    system = messages[: leading_system_count(messages)] if isinstance(messages, list) else []
    scope: dict[str, Any] = {
        "system": system,
        "tools": body.get("tools"),
        "functions": body.get("functions"),
        "tenant": tenant,
    }
    for name in SCOPE_FIELDS:
        scope[name] = body.get(name)
    return digest(canonical_bytes(scope)).hex()


def chain(namespace: str, messages: Sequence[Message], known: Sequence[str] = ()) -> list[str]:
    """`h_1..h_n` for `messages` (already without the leading system block).

    `known`: `h_1..h_j` of the same namespace and the same leading messages, computed before
    (the conversation's previous request, compaction_proxy/engine/_known.py): the chain goes
    on from `h_j`, and only the messages after them are serialized and hashed."""
    hashes = list(known[: len(messages)])
    current = bytes.fromhex(hashes[-1]) if hashes else digest(namespace.encode())
    for index in range(len(hashes), len(messages)):
        message = messages[index]
        current = digest(current + canonical_bytes(message))
        hashes.append(current.hex())
    return hashes


def could_have_checkpoint(rest: Sequence[Message]) -> bool:
    """Whether any checkpoint can cover a prefix of `rest` (the messages after the system block).

    A checkpoint is stored only when a compaction changed something other than the newest
    user message and the newest step, so the request it was made for had at least two
    messages after the system block (an agent loop compacts inside its first turn), and so
    does every request that extends it. A single question skips the store round trip.
    """
    return len(rest) >= 2
