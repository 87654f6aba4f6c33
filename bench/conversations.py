"""Deterministic generator of realistic agent conversations (OpenAI chat-completions dicts).

A conversation is a system prompt followed by turns.  Each turn is a user message, then zero or
more agent steps -- an assistant message carrying 1-3 parallel ``tool_calls`` (sometimes with a
line of text) followed by one ``tool`` result per call -- and a final assistant answer.  The
request always ends with the newest user message (what a client sends).

Tool outputs have a heavy-tailed size: most are a few hundred characters (JSON search hits,
directory listings, shell output), some are a few kB (log excerpts, file chunks), and a few
are huge file reads or log dumps of tens of kB.  The total tool output grows linearly with the
message count and is capped at ``MAX_TOOL_CHARS`` (2,600,000 characters) -- reached at the
top size, 6,500 messages (about a million tokens).

Everything is a function of ``(size, seed)``; :func:`next_turn` gives the two messages of the
following request (the assistant's reply to the newest user message and a new user message),
so ``conversation(n) + next_turn(n)`` is the "same conversation, one turn later".
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

Msg = dict[str, Any]

MAX_TOOL_CHARS = 2_600_000
TOOL_CHARS_PER_MESSAGE = 400
"""Tool-output characters budgeted per message (the cap is reached at 6,500 messages)."""

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "were",
    "all",
    "we",
    "when",
    "there",
    "can",
    "been",
    "has",
    "more",
    "if",
    "will",
    "would",
    "what",
    "their",
    "about",
    "so",
    "out",
    "up",
    "into",
    "than",
    "them",
    "could",
    "only",
    "other",
    "new",
    "some",
    "time",
    "these",
    "two",
    "may",
    "first",
    "then",
    "do",
    "any",
    "like",
    "my",
    "now",
    "over",
    "such",
    "our",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
    "function",
    "request",
    "response",
    "server",
    "client",
    "config",
    "value",
    "error",
    "retry",
    "timeout",
    "cache",
    "token",
    "budget",
    "message",
    "handler",
    "module",
    "test",
    "deploy",
    "build",
    "commit",
    "branch",
    "merge",
    "review",
    "pipeline",
    "latency",
    "throughput",
    "memory",
    "thread",
    "async",
    "await",
    "import",
    "return",
    "class",
    "method",
    "field",
    "schema",
    "database",
    "query",
    "index",
    "table",
    "column",
    "user",
]

_IDENTS = (
    "user_id",
    "request",
    "payload",
    "result",
    "items",
    "config",
    "session",
    "handler",
    "retry_count",
    "timeout",
    "buffer",
    "offset",
    "cursor",
    "batch",
    "record",
    "token",
    "messages",
    "window",
    "budget",
    "logger",
    "client",
    "response",
    "status",
    "value",
)

_TOOLS = (
    "read_file",
    "search_web",
    "run_shell",
    "grep_repo",
    "list_dir",
    "query_db",
    "fetch_url",
    "get_issue",
)

SYSTEM_PROMPT_CHARS = 6_000


def _prose(r: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    sentence = 0
    while size < chars:
        word = r.choice(_WORDS)
        if sentence == 0:
            word = word.capitalize()
        sentence += 1
        if sentence > r.randint(6, 18):
            word += "."
            sentence = 0
        elif r.random() < 0.06:
            word += ","
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def _code(r: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    indent = 0
    while size < chars:
        a, b = r.choice(_IDENTS), r.choice(_IDENTS)
        kind = r.random()
        if kind < 0.12:
            line = f"def {a}_{r.choice(_WORDS)}({b}, {r.choice(_IDENTS)}=None):"
            indent = 4
        elif kind < 0.22:
            line = " " * indent + f"if {a} is not None and len({b}) > {r.randint(0, 512)}:"
            indent = min(indent + 4, 12)
        elif kind < 0.30:
            line = " " * indent + f"return {a}.get({json.dumps(r.choice(_WORDS))}, {b})"
            indent = max(4, indent - 4)
        elif kind < 0.38:
            line = " " * indent + f"# {_prose(r, r.randint(20, 70))}"
        else:
            line = (
                " " * indent + f"{a} = {b}.{r.choice(_WORDS)}_{r.choice(_IDENTS)}("
                f"{r.randint(0, 9999)}, {json.dumps(r.choice(_WORDS))})"
            )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


def _logs(r: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    level = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
    t = r.randint(0, 86_000)
    while size < chars:
        t += r.randint(0, 5)
        line = (
            f"2025-03-{r.randint(1, 28):02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:"
            f"{t % 60:02d}.{r.randint(0, 999):03d}Z {r.choice(level)} "
            f"{r.choice(_IDENTS)}.{r.choice(_WORDS)}: {_prose(r, r.randint(20, 90))} "
            f"id={r.getrandbits(48):012x} took={r.randint(1, 900)}ms"
        )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


def _json_hits(r: random.Random, chars: int) -> str:
    hits: list[dict[str, Any]] = []
    size = 2
    while size < chars:
        hit = {
            "title": _prose(r, r.randint(20, 60)),
            "url": f"https://example.com/{r.choice(_WORDS)}/{r.getrandbits(32):08x}",
            "score": round(r.random(), 4),
            "snippet": _prose(r, r.randint(60, 240)),
        }
        hits.append(hit)
        size += len(json.dumps(hit)) + 2
    return json.dumps({"results": hits})[:chars]


def _listing(r: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        line = (
            f"{'d' if r.random() < 0.2 else '-'}rw-r--r-- 1 agent agent "
            f"{r.randint(0, 2_000_000):>8} Mar {r.randint(1, 28):>2} "
            f"src/{r.choice(_IDENTS)}/{r.choice(_WORDS)}_{r.choice(_IDENTS)}.py"
        )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


_OUTPUT_BY_TOOL = {
    "read_file": _code,
    "search_web": _json_hits,
    "run_shell": _logs,
    "grep_repo": _code,
    "list_dir": _listing,
    "query_db": _json_hits,
    "fetch_url": _prose,
    "get_issue": _prose,
}


def _tool_output_size(r: random.Random) -> int:
    u = r.random()
    if u < 0.85:
        return max(20, int(r.lognormvariate(math.log(220), 0.8)))
    if u < 0.98:
        return r.randint(1_000, 4_000)
    return r.randint(10_000, 40_000)  # a huge file read or log dump


def _arguments(r: random.Random, tool: str) -> str:
    if tool in ("read_file", "list_dir", "grep_repo"):
        args: dict[str, Any] = {"path": f"src/{r.choice(_IDENTS)}/{r.choice(_WORDS)}.py"}
        if tool == "grep_repo":
            args["pattern"] = r.choice(_IDENTS)
    elif tool == "run_shell":
        args = {"command": f"pytest -q tests/test_{r.choice(_IDENTS)}.py -k {r.choice(_WORDS)}"}
    elif tool == "query_db":
        args = {"sql": f"SELECT {r.choice(_IDENTS)} FROM {r.choice(_WORDS)} LIMIT 50"}
    else:
        args = {"query": _prose(r, r.randint(15, 60))}
    return json.dumps(args)


class _Generator:
    def __init__(self, seed: int, tool_budget: int) -> None:
        self.r = random.Random(seed)
        self.call_no = 0
        self.tool_budget = tool_budget
        self.tool_chars = 0

    def user(self) -> Msg:
        r = self.r
        chars = r.randint(40, 400) if r.random() < 0.9 else r.randint(1_000, 3_000)
        return {"role": "user", "content": _prose(r, chars)}

    def answer(self) -> Msg:
        return {"role": "assistant", "content": _prose(self.r, self.r.randint(150, 1_500))}

    def step(self) -> list[Msg]:
        r = self.r
        parallel = 1 if r.random() < 0.6 else (2 if r.random() < 0.65 else 3)
        calls = []
        for _ in range(parallel):
            tool = r.choice(_TOOLS)
            self.call_no += 1
            calls.append(
                {
                    "id": f"call_{self.call_no:06d}_{r.getrandbits(40):010x}",
                    "type": "function",
                    "function": {"name": tool, "arguments": _arguments(r, tool)},
                }
            )
        text = _prose(r, r.randint(30, 200)) if r.random() < 0.3 else None
        out: list[Msg] = [{"role": "assistant", "content": text, "tool_calls": calls}]
        for call in calls:
            size = min(_tool_output_size(r), max(20, self.tool_budget - self.tool_chars))
            self.tool_chars += size
            output = _OUTPUT_BY_TOOL[call["function"]["name"]](r, size)
            out.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        return out


def conversation(size: int, seed: int = 0) -> list[Msg]:
    """About ``size`` messages (never fewer, at most a few more), ending with a user message."""
    if size < 2:
        raise ValueError("size must be >= 2")
    tool_budget = min(MAX_TOOL_CHARS, TOOL_CHARS_PER_MESSAGE * size)
    g = _Generator(seed * 1_000_003 + size, tool_budget)
    r = g.r
    msgs: list[Msg] = [{"role": "system", "content": _prose(r, SYSTEM_PROMPT_CHARS)}]
    while len(msgs) < size - 1:
        msgs.append(g.user())
        steps = r.choice((0, 1, 1, 2, 2, 3, 4, 6))
        for _ in range(steps):
            if len(msgs) + 4 >= size - 1:
                break
            msgs.extend(g.step())
        if len(msgs) < size - 1:
            msgs.append(g.answer())
    msgs.append(g.user())
    return msgs


def next_turn(size: int, seed: int = 0) -> list[Msg]:
    """The two messages of the following request: the assistant's reply, a new user message."""
    g = _Generator(seed * 1_000_003 + size + 7_777_777, 0)
    return [g.answer(), g.user()]


def stats(msgs: list[Msg]) -> dict[str, int]:
    """Message, character and tool-output counts (characters of string contents/arguments)."""
    chars = tool_chars = tool_msgs = calls = 0
    for m in msgs:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
            if m["role"] == "tool":
                tool_chars += len(content)
                tool_msgs += 1
        for call in m.get("tool_calls") or ():
            calls += 1
            chars += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return {
        "messages": len(msgs),
        "chars": chars,
        "tool_chars": tool_chars,
        "tool_messages": tool_msgs,
        "tool_calls": calls,
    }


def tools() -> list[Msg]:
    """The request's ``tools`` definitions (one function per tool the generator calls)."""
    out: list[Msg] = []
    for name in _TOOLS:
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{name.replace('_', ' ').capitalize()}: "
                    + _prose(random.Random(name), 120),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "path": {
                                "type": "string",
                                "description": "A repository-relative path.",
                            },
                            "query": {"type": "string", "description": "What to look for."},
                            "limit": {
                                "type": "integer",
                                "description": "Maximum number of results.",
                            },
                        },
                        "required": ["query"],
                    },
                },
            }
        )
    return out
