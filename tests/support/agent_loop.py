"""A single-turn agent loop: one task, then one tool step per request, all in the same turn.

The workload the proxy exists for (a coding agent re-sending the whole list after every tool
step). Used by `tests/integration/test_agent_loop.py` and by `bench/session.py --mode loop`.
Every other tool result is big (~850 tokens), every tenth carries a `FACT-...` token so a test
can follow what the summarizer was shown.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.agent_session import CHAT, TOOLS, is_summarizer_text, tool_output
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamControl

SYSTEM = {"role": "system", "content": "You are a careful coding agent. Use the tools."}
TASK = {"role": "user", "content": "Fix the failing tests in the parser. Ticket FACT-TASK."}


@dataclass
class LoopStep:
    index: int
    forwarded: list[dict[str, Any]]
    checkpoint: str
    strategies: str
    warnings: list[str]
    prompt_tokens: int
    summarizer_calls: int


@dataclass
class LoopReport:
    steps: list[LoopStep] = field(default_factory=list)
    facts_shown: list[str] = field(default_factory=list)
    conversation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events(self) -> list[LoopStep]:
        return [s for s in self.steps if s.checkpoint == "new"]

    @property
    def summarizer_calls(self) -> int:
        return sum(s.summarizer_calls for s in self.steps)

    def stable_share(self) -> float:
        flags = [
            after.forwarded[: len(before.forwarded)] == before.forwarded
            for before, after in itertools.pairwise(self.steps)
        ]
        return sum(flags) / len(flags)


def add_step(conversation: list[dict[str, Any]], index: int, report: LoopReport) -> None:
    """The agent's next step: one call, and a result that is big every other step."""
    call_id = f"call_{index}"
    conversation.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": json.dumps({"path": f"src/mod_{index}.py"}),
                    },
                }
            ],
        }
    )
    content = tool_output(index, 0, 2_000 if index % 2 == 0 else 150)
    if index % 10 == 5:
        fact = f"FACT-R{index}"
        report.facts_shown.append(fact)
        content = f"Found {fact} in the config.\n" + content
    conversation.append({"role": "tool", "tool_call_id": call_id, "content": content})


StepMaker = Callable[[list[dict[str, Any]], int, LoopReport], None]
"""Appends the agent's next step to the conversation (and records the facts it shows)."""


def run_loop(
    client: openai.OpenAI,
    upstream: UpstreamControl,
    *,
    model: str,
    steps: int,
    add: StepMaker = add_step,
) -> LoopReport:
    """``steps`` requests, each followed by the next step ``add`` makes (the last one unsent)."""
    report = LoopReport(facts_shown=["FACT-TASK"])
    conversation: list[dict[str, Any]] = [SYSTEM, TASK]
    upstream.clear()
    for index in range(steps):
        raw = create_raw(client, model=model, messages=conversation, tools=TOOLS)
        completion = raw.parse()
        recorded = upstream.take(CHAT)  # keeps each fetch small: the bodies reach ~100 KB
        summaries = [r for r in recorded if is_summarizer_text(r.text)]
        forwarded = [r.json() for r in recorded if not is_summarizer_text(r.text)]
        assert len(forwarded) == 1, f"step {index}: {len(forwarded)} forwarded requests"
        report.steps.append(
            LoopStep(
                index=index,
                forwarded=forwarded[0]["messages"],
                checkpoint=raw.headers.get("x-compaction-checkpoint", ""),
                strategies=raw.headers.get("x-compaction-strategies", ""),
                warnings=raw.headers.get_list("x-compaction-warning"),
                prompt_tokens=completion.usage.prompt_tokens if completion.usage else 0,
                summarizer_calls=len(summaries),
            )
        )
        add(conversation, index, report)
    report.conversation = conversation
    return report
