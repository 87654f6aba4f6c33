"""A long chat with tools whose system and user messages state rules, as users write them.

Used by `tests/integration/test_ledger_rules.py` and `bench/session.py --prose`. The system
message states a few rules; every third user turn states one more, in the forms people use
("Never ...", "Always ...", "You must ...", "Don't ...", "Make sure ...", an "IMPORTANT: ..."
line, a numbered list of requirements), each naming something of its own so a rule found in
the forwarded request is that rule. Between user turns the model reads a file (~900 tokens).
One request per turn: the whole list, ending with the user's new message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.agent_session import CHAT, TOOLS, is_summarizer_text, tool_output
from tests.support.artifact_loop import MODULES, request_text
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamServer

SYSTEM_RULES = (
    "Never commit directly to the main branch.",
    "Always answer in English, whatever language the code comments use.",
    "IMPORTANT: never print the contents of .env files or any credential.",
)
SYSTEM = {
    "role": "system",
    "content": "You are a careful coding agent working in the user's repository. "
    + " ".join(SYSTEM_RULES[:2])
    + "\n"
    + SYSTEM_RULES[2],
}
RULE_EVERY = 3
CONTEXT = (
    "Here is what I noticed while using the {module} screen this morning: the page takes a "
    "while to load, the totals look a little off, and the export button seems to do nothing the "
    "first time I press it. I am not sure whether these are related. The logs from yesterday "
    "are attached to the ticket, and the colleague who wrote this part is away this week, so I "
    "would appreciate a careful look at how the data flows from the service into the view. "
    "Last quarter we rewrote the {module} layer in a hurry before a release, and some of the "
    "shortcuts taken then may be coming back to bite us now; keep that in mind as you read it."
)
"""What a user writes around a request (~150 tokens): the part of a turn that is no rule."""


def turn_rules(turn: int) -> tuple[str, list[str]]:
    """The rule text a user turn adds (as it appears in the message) and the rules it states."""
    n = f"{turn:03d}"
    module = MODULES[turn % len(MODULES)]
    form = (turn // RULE_EVERY) % 7
    if form == 4:
        items = [
            f"Keep answers about {module}_{n} under {200 + turn} words.",
            f"Only touch files in src/{module}_{n}/.",
        ]
        return "Requirements for this part:\n1. " + items[0] + "\n2. " + items[1], items
    rule = (
        f"Never edit files under vendor/lib{n}/ because they are generated.",
        f"Always run make lint-{n} before you report a step as done.",
        f"You must keep the signature of {module}_api_{n} unchanged.",
        f"IMPORTANT: the staging database stage-db-{n} is shared, so do not write to it.",
        "",
        f"Don't rename the column col_{n} in any migration.",
        f"Make sure every new test for {module}_{n} is marked slow.",
    )[form]
    return rule, [rule]


def user_message(turn: int, rules: list[str]) -> dict[str, Any]:
    module = MODULES[turn % len(MODULES)]
    text = (
        f"Turn {turn}: please look at the {module} code next and tell me what you find there, "
        "in a few sentences. " + CONTEXT.format(module=module)
    )
    if turn % RULE_EVERY == 0:
        said, stated = turn_rules(turn)
        rules.extend(stated)
        separator = "\n" if said.startswith(("IMPORTANT", "Requirements")) else " "
        text += separator + said
    return {"role": "user", "content": text}


def tool_step(turn: int, chars: int) -> list[dict[str, Any]]:
    """The model's tool call after a user turn, its result and the model's short answer."""
    call_id = f"call_t{turn}"
    path = f"src/{MODULES[turn % len(MODULES)]}/part_{turn:03d}.py"
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": tool_output(turn, 0, chars)},
        {"role": "assistant", "content": f"I read {path}; nothing there needs a change yet."},
    ]


@dataclass
class RuleTurn:
    index: int
    forwarded: list[dict[str, Any]]
    checkpoint: str
    strategies: str
    prompt_tokens: int


@dataclass
class RuleSession:
    turns: list[RuleTurn] = field(default_factory=list)
    rules: list[str] = field(default_factory=lambda: list(SYSTEM_RULES))
    conversation: list[dict[str, Any]] = field(default_factory=list)

    def missing(self) -> list[str]:
        """The rules stated so far that the last request did not forward verbatim."""
        text = request_text(self.turns[-1].forwarded)
        return [rule for rule in self.rules if rule not in text]

    def figure(self) -> str:
        kept = len(self.rules) - len(self.missing())
        return (
            f"{kept} of {len(self.rules)} rules forwarded verbatim ({kept / len(self.rules):.0%})"
        )


def run_rule_turns(
    client: openai.OpenAI,
    upstream: UpstreamServer,
    *,
    model: str,
    turns: int,
    tool_chars: int = 3_600,
) -> RuleSession:
    """``turns`` requests, each the whole list ending with the user's new message."""
    session = RuleSession(conversation=[SYSTEM])
    upstream.clear()
    for index in range(turns):
        session.conversation.append(user_message(index, session.rules))
        raw = create_raw(client, model=model, messages=session.conversation, tools=TOOLS)
        completion = raw.parse()
        forwarded = [r for r in upstream.take(CHAT) if not is_summarizer_text(r.text)]
        assert len(forwarded) >= 1, f"turn {index}: nothing forwarded"
        session.turns.append(
            RuleTurn(
                index=index,
                forwarded=forwarded[-1].json()["messages"],
                checkpoint=raw.headers.get("x-compaction-checkpoint", ""),
                strategies=raw.headers.get("x-compaction-strategies", ""),
                prompt_tokens=completion.usage.prompt_tokens if completion.usage else 0,
            )
        )
        session.conversation.extend(tool_step(index, tool_chars))
    return session
