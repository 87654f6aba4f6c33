"""What the key and tenant tests share: long conversations, summarizer calls, metric values.

The conversations are agent sessions well past an 8k window's trigger, in both APIs, with a
`FACT-<tag>` in their first user message; the fake summarizer (tests/fakes/upstream.py) lists
every `FACT-...` it was shown, so what reached a summary, and from there a forwarded request,
can be followed by its tag.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support.agent_session import CHAT, is_summarizer_text
from tests.support.servers import Recorded, UpstreamServer

WINDOW = 8_000
MODEL = "agent-8k"
MODELS = {MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}}
SUMMARIZATION = {"enabled": True, "maxSummaryTokens": 800, "retainRecent": {"turns": 2}}


def conversation(
    tag: str,
    steps: int = 12,
    *,
    system: str = "You are a coding agent.",
    chars: int = 1_400,
    turn_every: int = 4,
) -> list[dict[str, Any]]:
    """A chat agent session of ``steps`` tool steps (``chars`` of output each), a user turn
    every ``turn_every`` steps; 12 steps of 1,400 characters are over the 8k window."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task {tag}: remember FACT-{tag}."},
    ]
    for step in range(steps):
        call = {
            "id": f"c{tag}{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        output = f"{tag} {step} " + "z " * (chars // 2)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        if step % turn_every == turn_every - 1:
            messages.append({"role": "user", "content": f"Continue {tag} {step}."})
    return messages


def responses_input(tag: str, steps: int = 12) -> list[dict[str, Any]]:
    """The same session as Responses input items."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": f"Task {tag}: remember FACT-{tag}."},
    ]
    for step in range(steps):
        call_id = f"call_{tag}{step}"
        items.append(
            {"type": "function_call", "call_id": call_id, "name": "grep", "arguments": "{}"}
        )
        output = f"{tag} {step} " + "z " * 700
        items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        if step % 4 == 3:
            items.append({"role": "user", "content": f"Continue {tag} {step}."})
    return items


def summarizer_calls(upstream: UpstreamServer) -> list[Recorded]:
    return [r for r in upstream.requests(CHAT) if is_summarizer_text(r.text)]


def forwarded(upstream: UpstreamServer, path: str = CHAT) -> list[Recorded]:
    """What the upstream got that was not a summary call."""
    return [r for r in upstream.requests(path) if not is_summarizer_text(r.text)]


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when the series is absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    series = f"{name}{{{wanted}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
