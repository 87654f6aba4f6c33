"""Seeded single-task agent loops with a known list of must-keep strings per item type.

A transcript is what a coding agent re-sends on its last step: a system prompt with rules, one
task message from the user (with rules of its own), then tool steps (an assistant message with
one tool call, then its result). The tool results hold what an agent needs again later, as
exact strings: file paths, commands and their verdict lines (exit codes, test counts), error
lines, URLs, identifiers (commit hashes, versions, ticket ids, names in backticks) and numbers
with their units, amid log noise that nothing needs. Every must-keep string is random enough
that no model can guess it, and appears in exactly one message, so an exact match in what is
forwarded can only come from that message (or from a summary that copied it).

Pure and deterministic: the same seed and size give the same transcript, byte for byte.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ITEM_TYPES = ("path", "command", "verdict", "error", "url", "identifier", "number", "rule")
"""The kinds of must-keep strings, in report order. `verdict`: an exit status or a test
summary line; `rule`: a statement with the force of a rule, from the system prompt or the
user's task."""

Message = dict[str, Any]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"}},
                "required": [arg],
            },
        },
    }
    for name, arg, description in (
        ("read_file", "path", "Read a file of the repository."),
        ("run_shell", "command", "Run a shell command in the repository; returns its output."),
        ("search", "query", "Search the repository for a string."),
        ("fetch_url", "url", "Fetch a web page (documentation, CI logs)."),
    )
]


@dataclass(frozen=True)
class Item:
    """One must-keep string: its type, its exact text and the message it comes from."""

    kind: str
    text: str
    message: int


@dataclass
class Transcript:
    name: str
    seed: int
    messages: list[Message]
    items: list[Item]
    steps: int
    step_starts: list[int] = field(default_factory=list)
    """Index of each step's assistant message: the agent's request at step k is
    ``messages[: step_starts[k] + 2]`` (the call and its result)."""

    def request_at(self, step: int) -> list[Message]:
        """The messages the agent sends after ``step`` steps (0: the task alone)."""
        if step == 0:
            return self.messages[:2]
        return self.messages[: self.step_starts[step - 1] + 2]

    def by_kind(self) -> dict[str, list[Item]]:
        out: dict[str, list[Item]] = {kind: [] for kind in ITEM_TYPES}
        for item in self.items:
            out[item.kind].append(item)
        return out


# ------------------------------------------------------------------ vocabulary

_PACKAGES = ("billing", "ingest", "auth", "scheduler", "reports", "gateway", "storage", "search")
_MODULES = ("parser", "client", "models", "handlers", "retry", "cache", "schema", "worker")
_FUNCS = ("normalize", "load", "resolve", "apply", "flush", "merge", "validate", "render")
_ERRORS = ("KeyError", "ValueError", "TypeError", "AssertionError", "AttributeError")
_UNITS = (("ms", "p99 latency"), ("MiB", "peak RSS"), ("s", "test run"), ("req/s", "throughput"))
_NOISE = (
    "collecting ... ok",
    "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
    "rootdir: /workspace/app, configfile: pyproject.toml",
    "plugins: asyncio-0.24.0, xdist-3.6.1",
    "Requirement already satisfied: setuptools in ./.venv/lib/python3.11/site-packages",
    "INFO  worker started, waiting for jobs",
    "DEBUG connection pool size 10, overflow 5",
    "WARNING deprecated call in third-party module, ignoring",
    "# This module is part of the service layer; see the docs folder for the design.",
    "    return result",
    "    def __repr__(self) -> str:",
    "from __future__ import annotations",
    "import logging",
    "logger = logging.getLogger(__name__)",
    "Everything up-to-date",
    "remote: Resolving deltas: 100% (12/12), done.",
    "Downloading artifacts from coordinator... ok",
    "Cleaning up project directory and file based variables",
)
_RULES_SYSTEM = (
    "Never run `git push --force` on any branch.",
    "Always run the unit tests before you declare a step done.",
    "Never edit files under `migrations/`.",
)
_RULES_USER = (
    "Do not change the public signature of `{func}()`.",
    "Only touch files under `src/{pkg}/`.",
    "Make sure the changelog entry mentions ticket {ticket}.",
)


class _Names:
    """Fresh random strings, none a substring of another (so an exact match is unambiguous)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: list[str] = []

    def fresh(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            value = make()
            if all(value not in u and u not in value for u in self.used):
                self.used.append(value)
                return value
        raise RuntimeError("no fresh name after 1000 tries")

    def token(self, n: int, alphabet: str = string.ascii_lowercase + string.digits) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def path(self) -> str:
        r = self.rng
        return self.fresh(
            lambda: f"src/{r.choice(_PACKAGES)}/{r.choice(_MODULES)}_{self.token(4)}.py"
        )

    def test_path(self) -> str:
        r = self.rng
        return self.fresh(lambda: f"tests/test_{r.choice(_MODULES)}_{self.token(4)}.py")

    def func(self) -> str:
        r = self.rng
        return self.fresh(lambda: f"{r.choice(_FUNCS)}_{self.token(5, string.ascii_lowercase)}")

    def sha(self) -> str:
        return self.fresh(lambda: self.token(10, "0123456789abcdef"))

    def version(self) -> str:
        r = self.rng
        return self.fresh(lambda: f"v{r.randint(2, 9)}.{r.randint(10, 49)}.{r.randint(100, 999)}")

    def ticket(self) -> str:
        return self.fresh(lambda: f"OPS-{self.rng.randint(10000, 99999)}")

    def url(self) -> str:
        r = self.rng
        return self.fresh(
            lambda: f"https://ci.example.com/{r.choice(_PACKAGES)}/jobs/{r.randint(100000, 999999)}"
        )

    def number(self) -> tuple[str, str]:
        unit, what = self.rng.choice(_UNITS)
        value = self.fresh(lambda: f"{self.rng.randint(101, 9899)}.{self.rng.randint(1, 9)} {unit}")
        return value, what

    def key(self) -> str:
        return self.fresh(lambda: f"tenant_{self.token(6, string.ascii_lowercase)}")


# ------------------------------------------------------------------ the generator


def build(seed: int, steps: int, name: str | None = None) -> Transcript:
    """A single-task agent loop of ``steps`` tool steps, deterministic in ``seed``."""
    rng = random.Random(seed)
    names = _Names(rng)
    items: list[Item] = []
    messages: list[Message] = []

    pkg = rng.choice(_PACKAGES)
    target_func = names.func()
    ticket = names.ticket()
    system_rules = list(_RULES_SYSTEM)
    user_rules = [rule.format(func=target_func, pkg=pkg, ticket=ticket) for rule in _RULES_USER]
    messages.append(
        {
            "role": "system",
            "content": "You are a careful coding agent working in a Python repository. "
            "Use the tools. Rules:\n" + "\n".join(f"- {r}" for r in system_rules),
        }
    )
    items += [Item("rule", r, 0) for r in system_rules]
    messages.append(
        {
            "role": "user",
            "content": f"The nightly build of the {pkg} service fails since yesterday "
            f"({ticket}). Find the cause and fix it.\n"
            + "\n".join(f"{n}. {r}" for n, r in enumerate(user_rules, 1)),
        }
    )
    items += [Item("rule", r, 1) for r in user_rules]

    kinds = ("read", "test", "search", "fetch", "shell")
    step_starts: list[int] = []
    for index in range(steps):
        kind = kinds[(index - 1) % len(kinds)] if index else "test"
        builder = _STEPS[kind]
        thought, tool, arg, result, found = builder(names, rng, index)
        call_id = f"call_{seed}_{index}"
        step_starts.append(len(messages))
        call_message: Message = {
            "role": "assistant",
            "content": thought,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({_ARG[tool]: arg})},
                }
            ],
        }
        messages.append(call_message)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        position = len(messages) - 1
        for kind_name, text, where in found:
            items.append(Item(kind_name, text, position - 1 if where == "call" else position))
    return Transcript(
        name=name or f"loop-{seed}-{steps}",
        seed=seed,
        messages=messages,
        items=items,
        steps=steps,
        step_starts=step_starts,
    )


_ARG = {"read_file": "path", "run_shell": "command", "search": "query", "fetch_url": "url"}
Found = list[tuple[str, str, str]]  # (kind, text, "call" | "result")
Step = tuple[str, str, str, str, Found]  # thought, tool, argument, result, items


def _noise(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(_NOISE) for _ in range(n)]


def _step_read(names: _Names, rng: random.Random, index: int) -> Step:
    path = names.path()
    func = names.func()
    version = names.version()
    lines = [
        f'"""{path.rsplit("/", 1)[-1]}: part of the service."""',
        *_noise(rng, 4),
        f'MIN_SCHEMA = "{version}"',
        f"def {func}(record, *, strict=False):",
        "    # called for every row of the import",
        *_noise(rng, 6),
    ]
    found: Found = [("path", path, "call"), ("identifier", version, "result")]
    found.append(("identifier", f"`{func}`", "result"))
    lines.append(f"# see `{func}` above: the fallback when the key is missing")
    return (f"Let me read {path}.", "read_file", path, "\n".join(lines), found)


def _step_test(names: _Names, rng: random.Random, index: int) -> Step:
    test = names.test_path()
    key = names.key()
    error = rng.choice(_ERRORS)
    error_line = f"E   {error}: '{key}'"
    failed, passed = rng.randint(1, 9), rng.randint(20, 400)
    seconds = f"{rng.randint(2, 90)}.{rng.randint(10, 99)}"
    verdict = f"{failed} failed, {passed} passed in {seconds}s"
    exit_line = f"exit code {rng.choice((1, 2))}"
    command = f"python -m pytest {test} -x -q"
    lines = [
        *_noise(rng, 4),
        f"{test}::test_case_{index} FAILED",
        *_noise(rng, 3),
        error_line,
        *_noise(rng, 3),
        f"=== {verdict} ===",
        exit_line,
    ]
    found: Found = [
        ("command", command, "call"),
        ("error", error_line.removeprefix("E   "), "result"),
        ("verdict", verdict, "result"),
    ]
    # exit lines repeat by nature ("exit code 1"); the verdict line above is the unique one.
    return ("Run the failing tests.", "run_shell", command, "\n".join(lines), found)


def _step_search(names: _Names, rng: random.Random, index: int) -> Step:
    func = names.func()
    paths = [names.path() for _ in range(2)]
    lines = [f"{p}:{rng.randint(10, 400)}:    value = {func}(row)" for p in paths]
    lines += _noise(rng, 3)
    found: Found = [("path", p, "result") for p in paths]
    return (f"Where is {func} called?", "search", func, "\n".join(lines), found)


def _step_fetch(names: _Names, rng: random.Random, index: int) -> Step:
    url = names.url()
    sha = names.sha()
    number, what = names.number()
    version = names.version()
    lines = [
        f"Job log for commit {sha}",
        *_noise(rng, 5),
        f"Benchmark: {what} {number} (budget exceeded)",
        f"Deployed artifact {version}",
        *_noise(rng, 4),
    ]
    found: Found = [
        ("url", url, "call"),
        ("identifier", sha, "result"),
        ("number", number, "result"),
        ("identifier", version, "result"),
    ]
    return ("Check the CI job log.", "fetch_url", url, "\n".join(lines), found)


def _step_shell(names: _Names, rng: random.Random, index: int) -> Step:
    path = names.path()
    number, what = names.number()
    ticket = names.ticket()
    command = f"python scripts/profile.py --module {path} --runs {rng.randint(3, 30)}"
    lines = [
        *_noise(rng, 3),
        f"profiling {path}",
        f"{what}: {number}",
        f"note: regression first reported in {ticket}",
        *_noise(rng, 3),
        "exit code 0",
    ]
    found: Found = [
        ("command", command, "call"),
        ("number", number, "result"),
        ("identifier", ticket, "result"),
    ]
    return ("Profile the module.", "run_shell", command, "\n".join(lines), found)


_STEPS: dict[str, Callable[[_Names, random.Random, int], Step]] = {
    "read": _step_read,
    "test": _step_test,
    "search": _step_search,
    "fetch": _step_fetch,
    "shell": _step_shell,
}
