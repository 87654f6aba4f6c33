"""Request parts the Messages tests share: Claude Code's shape of a request to ``/v1/messages``.

Claude Code marks its two system blocks and the newest message's last block with an ephemeral
``cache_control`` breakpoint, and offers a ``Bash`` tool; tests that drive a session the way it
does build their bodies here, so a change to that shape is made once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

EPHEMERAL = {"type": "ephemeral"}
BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def claude_code_system(intro: int, workdir: int) -> list[dict[str, Any]]:
    """Two cached system blocks, their sizes set by how often each sentence repeats (a test picks
    them to put the prefix where its window needs it)."""
    return [
        {"type": "text", "text": "You are Claude Code. " * intro, "cache_control": EPHEMERAL},
        {"type": "text", "text": "Work in /repo. " * workdir, "cache_control": EPHEMERAL},
    ]


def claude_code_request(
    messages: Sequence[dict[str, Any]],
    *,
    model: str,
    max_tokens: int,
    system: list[dict[str, Any]],
    thinking: dict[str, Any],
) -> dict[str, Any]:
    """The body Claude Code sends for ``messages``: its breakpoint on the newest message's last
    block (on a copy: the caller's history keeps none, as Claude Code's does), the Bash tool."""
    sent = list(messages)
    last = copy.deepcopy(sent[-1])
    last["content"][-1]["cache_control"] = EPHEMERAL
    sent[-1] = last
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": system,
        "tools": [BASH],
        "thinking": thinking,
        "messages": sent,
    }
