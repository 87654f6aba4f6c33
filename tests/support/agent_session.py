"""A simulated agent session: each tool step is a new request, as agents make them.

Used by the checkpoint integration tests and by `bench/session.py`, which reports the same
figures for a longer run. The conversation is deterministic: user turns, parallel tool calls,
large tool outputs, and `FACT-...` tokens sprinkled in so a test can follow what the
summarizer was shown through rolling updates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.fakes.upstream import SUMMARIZER_PREFIX_MARKER
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamControl

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search the repository",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
]


@dataclass
class Step:
    """One request of the session and what came of it."""

    index: int
    sent: int  # messages the client sent
    forwarded: list[dict[str, Any]]  # messages the upstream received
    checkpoint: str
    strategies: str
    tokens_before: int
    tokens_after: int
    prompt_tokens: int
    warning: str | None


@dataclass
class SessionReport:
    steps: list[Step] = field(default_factory=list)
    summarizer_calls: int = 0
    facts_shown: list[str] = field(default_factory=list)
    final_conversation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compaction_events(self) -> int:
        return sum(1 for s in self.steps if s.checkpoint == "new")

    def prefix_stable(self) -> list[bool]:
        """Per transition: does the next forwarded request extend the previous one unchanged?"""
        out = []
        for before, after in zip(self.steps, self.steps[1:], strict=False):
            prefix = after.forwarded[: len(before.forwarded)]
            out.append(prefix == before.forwarded)
        return out

    def stable_share(self) -> float:
        flags = self.prefix_stable()
        return sum(flags) / len(flags) if flags else 1.0


def tool_output(step: int, call: int, size: int) -> str:
    header = f"# output of step {step} call {call}\n"
    line = f"line {{}} of step {step}: value={step * 7 + call}\n"
    body = "".join(line.format(n) for n in range(size // len(line) + 1))
    return header + body[:size]


def is_summarizer_text(text: str | None) -> bool:
    """A summarizer call, in either form: the transcript in <conversation> tags, or the chat
    request's own prefix ending in the marked instruction
    (compaction_proxy/summarizer/_prefix.py)."""
    if not text:
        return False
    return "<conversation>" in text or SUMMARIZER_PREFIX_MARKER in text


def count_summarizer_calls(upstream: UpstreamControl) -> int:
    return sum(1 for r in upstream.requests(CHAT) if is_summarizer_text(r.text))


def forwarded_requests(upstream: UpstreamControl) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests(CHAT) if not is_summarizer_text(r.text)]


def run_session(
    client: openai.OpenAI,
    upstream: UpstreamControl,
    *,
    model: str,
    requests: int,
    tool_output_chars: int = 1500,
    turn_every: int = 6,
    on_step: Callable[[Step], None] | None = None,
) -> SessionReport:
    """Drive `requests` chat requests through the proxy, growing the conversation each time."""
    report = SessionReport()
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. Use the tools."},
        {"role": "user", "content": "Fix the flaky parser test. The ticket is FACT-T0."},
    ]
    report.facts_shown.append("FACT-T0")
    calls_before = count_summarizer_calls(upstream)
    for index in range(requests):
        raw = create_raw(client, model=model, messages=conversation, tools=TOOLS)
        completion = raw.parse()
        forwarded = forwarded_requests(upstream)[-1]["messages"]
        step = Step(
            index=index,
            sent=len(conversation),
            forwarded=forwarded,
            checkpoint=raw.headers.get("x-compaction-checkpoint", ""),
            strategies=raw.headers.get("x-compaction-strategies", ""),
            tokens_before=int(raw.headers.get("x-compaction-tokens-before", "0")),
            tokens_after=int(raw.headers.get("x-compaction-tokens-after", "0")),
            prompt_tokens=completion.usage.prompt_tokens if completion.usage else 0,
            warning=raw.headers.get("x-compaction-warning"),
        )
        report.steps.append(step)
        if on_step is not None:
            on_step(step)
        if index < requests - 1:
            _advance(conversation, index, tool_output_chars, turn_every, report)
    report.summarizer_calls = count_summarizer_calls(upstream) - calls_before
    report.final_conversation = conversation
    return report


def _advance(
    conversation: list[dict[str, Any]],
    index: int,
    size: int,
    turn_every: int,
    report: SessionReport,
) -> None:
    """What the agent does after a reply: a tool step, or (every few steps) a new user turn."""
    if index % turn_every == turn_every - 1:
        fact = f"FACT-U{index}"
        report.facts_shown.append(fact)
        conversation.append(
            {"role": "assistant", "content": f"Progress report after step {index}."}
        )
        conversation.append(
            {"role": "user", "content": f"Good. Remember {fact}. Continue with the next file."}
        )
        return
    parallel = 2 if index % 2 else 1
    calls = [
        {
            "id": f"call_{index}_{n}",
            "type": "function",
            "function": {
                "name": "read_file" if n == 0 else "grep",
                "arguments": json.dumps({"path": f"src/mod_{index}_{n}.py"}),
            },
        }
        for n in range(parallel)
    ]
    conversation.append({"role": "assistant", "content": None, "tool_calls": calls})
    for n, call in enumerate(calls):
        content = tool_output(index, n, size)
        if n == 0 and index % 5 == 0:
            fact = f"FACT-R{index}"
            report.facts_shown.append(fact)
            content = f"Found {fact} in the config.\n" + content
        conversation.append({"role": "tool", "tool_call_id": call["id"], "content": content})


def assert_valid_pairing(messages: list[dict[str, Any]]) -> None:
    declared: list[str] = []
    answered: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            declared.append(call["id"])
        if message.get("role") == "tool":
            assert message["tool_call_id"] in declared, "a tool result lost its call"
            answered.append(message["tool_call_id"])
    assert sorted(declared) == sorted(answered), "a tool call lost its result"
