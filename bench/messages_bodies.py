"""Claude Code-shaped Messages sessions, and the same conversation as chat completions.

What Claude Code sends on ``POST /v1/messages``: a ``system`` of three
text blocks, two of them cache breakpoints; 12 tools of ~31.9k characters; ``max_tokens:
32000``; adaptive thinking with signed blocks sent back; one task, then a single-turn tool loop
where every step is an assistant message (thinking with a signature, text, one or two
``tool_use``) and a user message (the ``tool_result`` blocks, ~3,000 characters every other
step, and now and then a ``<system-reminder>`` text block), with a third breakpoint on the
newest ``tool_result``, which moves every turn.

:func:`conversation` builds one deterministically (the ``tag`` seeds every text and id, so two
tags share no message); :meth:`Conversation.messages_body` writes it as a Messages body and
:meth:`Conversation.chat_body` as the chat-completions body a chat agent would send for the
same turns (thinking as ``reasoning_content``, which chat servers that think take back; tool
results as ``tool`` messages, a reminder as a user message after them). The benchmarks size a
session by its content blocks (bench/messages_adapter.py) or by the proxy's own token count of
the lifted body (bench/messages_latency.py).
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

Msg = dict[str, Any]

TOOL_NAMES = (
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
)
STEP_TOOLS = ("Read", "Bash", "Grep", "Edit", "Glob")
TOOLS_CHARS = 31_900
"""Claude Code's 12 tools as JSON, in characters."""
LONG_RESULT = 3_000
MAX_TOKENS = 32_000
EPHEMERAL = {"type": "ephemeral"}

_TEXT = (
    "the file parser returns a value when each token is read from input and the test checks "
    "that every branch of this function handles an empty list before it calls the helper "
    "module config loader writes cache entries with keys so later requests find them quickly "
    "while errors raise a clear message naming which field failed validation during startup "
    "then retry logic waits before sending again because upstream servers refuse too many "
    "concurrent streams under load so we keep state small and free memory after use"
)
_WORDS = tuple(_TEXT.split())
_IDENTS = (
    "parser",
    "tokens",
    "value",
    "result",
    "config",
    "entry",
    "cache",
    "index",
    "buffer",
    "node",
    "state",
    "offset",
)


def _prose(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def _code(rng: random.Random, chars: int, first: int = 1) -> str:
    """``cat -n``-style lines of code, as Claude Code's Read tool returns them."""
    lines: list[str] = []
    size = 0
    number = first
    while size < chars:
        a, b, c = (rng.choice(_IDENTS) for _ in range(3))
        indent = "    " * rng.randint(0, 3)
        line = f"{number:>6}\t{indent}{a}_{b} = {c}({a}, {rng.randint(0, 999)})  # {b}"
        lines.append(line)
        size += len(line) + 1
        number += 1
    return "\n".join(lines)[:chars]


def system_blocks(rng: random.Random) -> list[Msg]:
    return [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": _prose(rng, 11_000), "cache_control": EPHEMERAL},
        {"type": "text", "text": _prose(rng, 2_500), "cache_control": EPHEMERAL},
    ]


def tools(rng: random.Random) -> list[Msg]:
    """12 client tools whose JSON is about :data:`TOOLS_CHARS` characters together."""
    out: list[Msg] = []
    for name in TOOL_NAMES:
        schema = {
            "type": "object",
            "properties": {
                key: {"type": "string", "description": _prose(rng, 90)}
                for key in ("path", "pattern", "description")
            },
            "required": ["path"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        }
        out.append({"name": name, "description": "", "input_schema": schema})
    spare = TOOLS_CHARS - len(orjson.dumps(out))
    for tool in out:
        tool["description"] = _prose(rng, max(200, spare // len(out)))
    return out


@dataclass(frozen=True, slots=True)
class Step:
    """One tool step: the assistant's turn and the user message holding its results."""

    assistant: Msg
    user: Msg
    chat: tuple[Msg, ...]  # the same step as chat messages

    @property
    def blocks(self) -> int:
        return len(self.assistant["content"]) + len(self.user["content"])


def step(tag: str, n: int) -> Step:
    """Step ``n`` of the session ``tag``: its texts and ids are its own."""
    rng = random.Random(f"{tag}:{n}")
    thinking = _prose(rng, rng.randint(300, 1_200))
    signature = base64.b64encode(rng.randbytes(rng.randint(240, 420))).decode()
    said = _prose(rng, rng.randint(60, 260))
    calls = 2 if n % 3 == 2 else 1  # parallel tool uses every third step
    uses: list[Msg] = []
    for k in range(calls):
        name = STEP_TOOLS[(n + k) % len(STEP_TOOLS)]
        uses.append(
            {
                "type": "tool_use",
                "id": f"toolu_{tag}_{n:04d}_{k}",
                "name": name,
                "input": _tool_input(rng, name, n, k),
            }
        )
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": signature},
            {"type": "text", "text": said},
            *uses,
        ],
    }
    results: list[Msg] = []
    for k, use in enumerate(uses):
        size = LONG_RESULT if n % 2 == 0 and k == 0 else rng.randint(80, 300)
        output = _code(rng, size, first=1 + 40 * n) if k == 0 else _prose(rng, size)
        results.append({"type": "tool_result", "tool_use_id": use["id"], "content": output})
    reminder = None
    if n % 5 == 4:
        reminder = {
            "type": "text",
            "text": f"<system-reminder>{_prose(rng, 220)}</system-reminder>",
        }
    user = {"role": "user", "content": [*results, *([reminder] if reminder else [])]}
    chat: list[Msg] = [
        {
            "role": "assistant",
            "content": said,
            "reasoning_content": thinking,
            "tool_calls": [
                {
                    "id": use["id"],
                    "type": "function",
                    "function": {"name": use["name"], "arguments": _arguments(use["input"])},
                }
                for use in uses
            ],
        },
        *(
            {"role": "tool", "tool_call_id": r["tool_use_id"], "content": r["content"]}
            for r in results
        ),
    ]
    if reminder:
        chat.append({"role": "user", "content": reminder["text"]})
    return Step(assistant, user, tuple(chat))


def _tool_input(rng: random.Random, name: str, n: int, k: int) -> Msg:
    path = f"/repo/src/{rng.choice(_IDENTS)}/{rng.choice(_IDENTS)}_{n}_{k}.py"
    if name == "Bash":
        return {"command": f"pytest -q tests/test_{rng.choice(_IDENTS)}.py", "description": "Run"}
    if name == "Grep":
        return {"pattern": f"def {rng.choice(_IDENTS)}", "path": "/repo/src", "-n": True}
    if name == "Edit":
        return {"file_path": path, "old_string": _prose(rng, 60), "new_string": _prose(rng, 70)}
    if name == "Glob":
        return {"pattern": f"src/**/{rng.choice(_IDENTS)}*.py"}
    return {"file_path": path}


def _arguments(value: Msg) -> str:
    return orjson.dumps(value).decode()


@dataclass
class Conversation:
    """A Claude Code session: its fixed prefix and its steps (more are made on demand)."""

    tag: str
    system: list[Msg]
    tools: list[Msg]
    task: Msg
    steps: list[Step] = field(default_factory=list)

    @property
    def blocks(self) -> int:
        """Content blocks in ``messages`` (the system blocks are not counted)."""
        return len(self.task["content"]) + sum(s.blocks for s in self.steps)

    def grow(self, count: int = 1) -> None:
        for _ in range(count):
            self.steps.append(step(self.tag, len(self.steps)))

    def messages_body(self, model: str, *, stream: bool = False, extra: Sequence[Step] = ()) -> Msg:
        """The Messages body for the task, the steps and ``extra``, with the third breakpoint
        on the newest ``tool_result`` (a copy of that message: the steps stay unmarked)."""
        messages: list[Msg] = [self.task]
        for s in (*self.steps, *extra):
            messages += (s.assistant, s.user)
        last = messages[-1]
        if last["role"] == "user":
            content = list(last["content"])
            newest = max(
                (i for i, b in enumerate(content) if b["type"] == "tool_result"), default=None
            )
            if newest is not None:
                content[newest] = {**content[newest], "cache_control": EPHEMERAL}
                messages[-1] = {**last, "content": content}
        body: Msg = {
            "model": model,
            "max_tokens": MAX_TOKENS,
            "system": self.system,
            "messages": messages,
            "tools": self.tools,
            "metadata": {"user_id": f"user_bench_{self.tag}"},
            "thinking": {"type": "enabled", "budget_tokens": 31_999},
        }
        if stream:
            body["stream"] = True
        return body

    def chat_body(self, model: str, *, stream: bool = False, extra: Sequence[Step] = ()) -> Msg:
        """The same conversation as a chat-completions body."""
        messages: list[Msg] = [
            {
                "role": "system",
                "content": [{"type": "text", "text": b["text"]} for b in self.system],
            },
            {"role": "user", "content": "\n\n".join(b["text"] for b in self.task["content"])},
        ]
        for s in (*self.steps, *extra):
            messages += s.chat
        body: Msg = {
            "model": model,
            "max_completion_tokens": MAX_TOKENS,
            "messages": messages,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["input_schema"],
                    },
                }
                for t in self.tools
            ],
            "user": f"user_bench_{self.tag}",
        }
        if stream:
            body["stream"] = True
        return body


def conversation(tag: str) -> Conversation:
    """The prefix every session of ``tag`` shares: system, tools and the task, no steps."""
    rng = random.Random(f"{tag}:prefix")
    task = {
        "role": "user",
        "content": [
            {"type": "text", "text": f"<system-reminder>{_prose(rng, 1_500)}</system-reminder>"},
            {"type": "text", "text": "Fix the failing parser tests in src/parser and run them."},
        ],
    }
    return Conversation(tag, system_blocks(rng), tools(rng), task)


def by_blocks(target: int, tag: str = "s") -> Conversation:
    """A session whose ``messages`` hold about ``target`` content blocks (the nearest whole
    step)."""
    session = conversation(tag)
    while session.blocks < target:
        session.grow()
    over = session.blocks - target
    if over and session.steps and target - (session.blocks - session.steps[-1].blocks) < over:
        session.steps.pop()
    return session


def fork_steps(tag: str, start: int, count: int) -> list[Step]:
    """Steps that continue a session from step ``start``, with ids and texts of their own."""
    return [step(tag, start + n) for n in range(count)]


def blocks_in(messages: Iterable[Msg]) -> int:
    return sum(len(m["content"]) if isinstance(m["content"], list) else 1 for m in messages)
