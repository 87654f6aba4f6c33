"""A single-task agent loop whose tool results hold the exact strings an agent needs later.

Used by `tests/integration/test_ledger_loop.py` and `bench/session.py --prose`. Each step is
one bash call and its result, in one of four realistic shapes (a pytest run, a compiler error,
a script's traceback, a benchmark), and every step's strings are its own: a file path, the
command, an error line, a measured number with its unit and, for a pytest run, its verdict
line; none of them appears in any other step. The task
message states the user's rules. With a summarizer that writes prose (the fake upstream's
``summarizer: prose``), what survives folding is what compaction itself carried.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.agent_session import CHAT, is_summarizer_text
from tests.support.forwarded_spans import message_spans
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamServer

KINDS = ("path", "command", "verdict", "error", "number")
MODULES = ("parser", "billing", "scheduler", "auth", "storage", "render", "ingest", "cache")

SYSTEM = {
    "role": "system",
    "content": "You are a careful coding agent working in the user's repository. Use the tools.",
}
TASK_RULES = (
    "Never edit anything under vendor/ or third_party/.",
    "Always run the affected tests before you call a fix done.",
    "You must keep the public API of the billing module unchanged.",
    "IMPORTANT: do not touch the migrations in db/migrations/0042_ledger.sql.",
)
TASK = {
    "role": "user",
    "content": "The nightly build of the service is red: tests fail, a native module does not "
    "compile and two scripts crash. Find out why and fix it.\n" + "\n".join(TASK_RULES),
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string"}},
                "required": [key],
            },
        },
    }
    for name, key, description in (
        ("bash", "command", "Run a shell command in the repository"),
        ("read_file", "path", "Read a file of the repository"),
    )
]
NOISE = (
    "platform linux -- Python 3.12.7, pytest-8.3.3, pluggy-1.5.0\n"
    "rootdir: /srv/app\nconfigfile: pyproject.toml\nplugins: xdist-3.6.1, cov-5.0.0\n"
)


@dataclass(frozen=True)
class ArtifactStep:
    """One tool step: the call's arguments, its result, and the exact strings it holds."""

    index: int
    tool: str
    arguments: dict[str, str]
    result: str
    strings: dict[str, str]  # kind -> the exact string

    @property
    def call_id(self) -> str:
        return f"call_{self.index:03d}"

    def messages(self) -> list[dict[str, Any]]:
        call = {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.tool, "arguments": json.dumps(self.arguments)},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": self.call_id, "content": self.result},
        ]


def _hex(index: int, salt: int) -> str:
    return f"{(index * 2_654_435_761 + salt * 40_503) % 0xFFFFFFF:07x}"


def make_step(index: int, filler_lines: int = 24) -> ArtifactStep:
    """Step ``index`` (deterministic): the shape cycles through four; every string holds the
    step's own three-digit number, so none is a substring of another step's."""
    n = f"{index:03d}"
    module = MODULES[index % len(MODULES)]
    value = f"{100 + index}.{(index * 37) % 100:02d}"  # a unique integer part: 100..999
    filler = "".join(
        f"  {module} worker: chunk done, nothing to report\n" for _ in range(filler_lines)
    )
    shape = index % 4
    if shape == 0:
        path = f"tests/{module}/test_{module}_{n}.py"
        command = f"python -m pytest {path} -q -x"
        error = f"AssertionError: expected checksum 0x{_hex(index, 1)} got 0x{_hex(index, 2)}"
        verdict = f"{1 + index % 3} failed, {20 + index} passed"
        number = f"{value} MiB"
        result = (
            f"{NOISE}collected {21 + index + index % 3} items\n\n{path} ....F\n{filler}"
            f"_____ test_{module}_roundtrip_{n} _____\n{path}:{40 + index % 50}: in "
            f"test_{module}_roundtrip_{n}\n    assert decode(encode(record)) == record\n"
            f"E   {error}\nFAILED {path}::test_{module}_roundtrip_{n} - {error}\n"
            f"peak RSS of test_{module}_roundtrip_{n}: {number}\n"
            f"{verdict} in {2 + index % 5}.{n[1:]}s\nexit code 1\n"
        )
        strings = {"path": path, "command": command, "verdict": verdict}
    elif shape == 1:  # make's "Error 1" line is no verdict the ledger promises: not counted
        path = f"src/native/{module}_{n}.c"
        command = f"make -j2 build/{module}_{n}.o"
        error = f"error: '{module}_table_{n}' undeclared (first use in this function)"
        number = f"{value} s"
        result = (
            f"gcc -O2 -Wall -c {path} -o build/{module}_{n}.o\n{filler}"
            f"{path}: In function '{module}_checksum_{n}':\n"
            f"{path}:{40 + index % 60}:17: {error}\ncompilation terminated.\n"
            f"make: *** [Makefile:{80 + index}: build/{module}_{n}.o] Error 1\n"
            f"build/{module}_{n}.o compile time {number}\nexit code 2\n"
        )
        strings = {"path": path, "command": command}
    elif shape == 2:
        path = f"/srv/app/src/{module}/pipeline_{n}.py"
        command = f"python scripts/replay_{module}.py --batch {n} --limit {500 + index}"
        error = f"KeyError: '{module}-order-{n}-{_hex(index, 3)}'"
        number = f"{value} records/s"
        result = (
            f"loading fixtures/{module}/batch_{n}.jsonl\n{filler}"
            f"batch_{n} throughput {number} over 4 workers\n"
            "Traceback (most recent call last):\n"
            f'  File "{path}", line {100 + index}, in run_batch\n'
            f"    row = index[key]\n{error}\nexit code 1\n"
        )
        strings = {"path": path, "command": command}
    else:
        path = f"bench/{module}_latency_{n}.py"
        command = f"python {path} --requests {1000 + index} --concurrency 8"
        error = f"FAILED: p99 latency over the 250 ms budget in run {_hex(index, 4)}"
        number = f"{value} ms"
        result = (
            f"warming up {module}...\n{filler}requests: {1000 + index}, errors: 0\n"
            f"{module}_{n} p50 latency {number}\n{error}\nexit code 2\n"
        )
        strings = {"path": path, "command": command}
    strings = {**strings, "error": error, "number": number}
    return ArtifactStep(index, "bash", {"command": command}, result, strings)


def present(needle: str, haystack: str) -> bool:
    """``needle`` in ``haystack`` as a whole string (not the tail of a longer path or number)."""
    pattern = r"(?<![\w/.-])" + re.escape(needle) + r"(?![\w/-])"
    return re.search(pattern, haystack) is not None


def request_text(messages: list[dict[str, Any]]) -> str:
    """Everything the model reads of a request's messages: texts and tool-call arguments."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        for call in message.get("tool_calls") or ():
            parts.append(str(call.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


def is_ledger(message: dict[str, Any]) -> bool:
    """The ledger message: its text starts with `<ledger>` and ends with `</ledger>`."""
    text = request_text([{"content": message.get("content")}]).strip()
    return text.startswith("<ledger>") and text.endswith("</ledger>")


@dataclass
class LoopStep:
    """One request: what the upstream received (parsed, and each message's exact bytes)."""

    index: int
    forwarded: list[dict[str, Any]]
    spans: list[bytes]
    checkpoint: str
    strategies: str
    headers: dict[str, str]
    prompt_tokens: int
    summarizer_calls: int

    @property
    def ledgers(self) -> list[bytes]:
        return [s for s, m in zip(self.spans, self.forwarded, strict=True) if is_ledger(m)]


@dataclass
class ArtifactLoop:
    steps: list[LoopStep] = field(default_factory=list)
    made: list[ArtifactStep] = field(default_factory=list)
    conversation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> LoopStep:
        return self.steps[-1]

    def folded(self) -> list[ArtifactStep]:
        """The steps whose tool result the last request did not forward as it was sent."""
        kept = {
            (m.get("tool_call_id"), m.get("content"))
            for m in self.last.forwarded
            if m.get("role") == "tool"
        }
        sent = self.made[: self.last.index]  # the last request carried steps 0..index-1
        return [s for s in sent if (s.call_id, s.result) not in kept]

    def survival(self) -> dict[str, tuple[int, int]]:
        """Per kind: (strings of the folded steps still in the last request, all of them)."""
        text = request_text(self.last.forwarded)
        out: dict[str, tuple[int, int]] = {}
        for kind in KINDS:
            wanted = [s.strings[kind] for s in self.folded() if kind in s.strings]
            out[kind] = (sum(1 for w in wanted if present(w, text)), len(wanted))
        return out

    def missing(self) -> list[tuple[ArtifactStep, str]]:
        text = request_text(self.last.forwarded)
        return [
            (step, kind)
            for step in self.folded()
            for kind in KINDS
            if kind in step.strings and not present(step.strings[kind], text)
        ]

    def rules_kept(self) -> tuple[int, int]:
        text = request_text(self.last.forwarded)
        return sum(1 for r in TASK_RULES if r in text), len(TASK_RULES)


StepFactory = Callable[[int], ArtifactStep]


def run_artifact_loop(
    client: openai.OpenAI,
    upstream: UpstreamServer,
    *,
    model: str,
    steps: int,
    make: StepFactory = make_step,
) -> ArtifactLoop:
    """``steps`` requests: request i carries the task and steps 0..i-1 (the last step made is
    never sent, as in tests/support/agent_loop.py)."""
    loop = ArtifactLoop(conversation=[SYSTEM, TASK])
    upstream.clear()
    for index in range(steps):
        raw = create_raw(client, model=model, messages=loop.conversation, tools=TOOLS)
        completion = raw.parse()
        recorded = upstream.take(CHAT)
        forwarded = [r for r in recorded if not is_summarizer_text(r.text)]
        assert len(forwarded) >= 1, f"step {index}: nothing forwarded"
        body = forwarded[-1]
        loop.steps.append(
            LoopStep(
                index=index,
                forwarded=body.json()["messages"],
                spans=message_spans(body.body),
                checkpoint=raw.headers.get("x-compaction-checkpoint", ""),
                strategies=raw.headers.get("x-compaction-strategies", ""),
                headers={k: v for k, v in raw.headers.items() if k.startswith("x-compaction")},
                prompt_tokens=completion.usage.prompt_tokens if completion.usage else 0,
                summarizer_calls=sum(1 for r in recorded if is_summarizer_text(r.text)),
            )
        )
        step = make(index)
        loop.made.append(step)
        loop.conversation.extend(step.messages())
    return loop
