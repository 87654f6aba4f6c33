"""Agent-session request bodies: a long conversation that grows by one tool step per request.

The gateway's 1 KB body says nothing about what agents send: 40-500 KB bodies, each the
previous one plus the next step. The proxy's per-request work on such a body is what this
module lets the benchmarks measure, with the shape that matters for it:

* a *base*: system prompt, earlier turns (user, tool steps, answer), then the running turn
  (the task and its steps so far), grown with the generator of bench/conversations.py until
  it reaches the target size (o200k tokens, counted exactly);
* *forks*: sequences of further steps (an assistant ``tool_calls`` message and one result per
  call). Request ``i`` of a session is the base plus the first ``j`` steps of one fork, so every
  request adds one step to the previous one. A fork ends after ``steps_per_fork`` steps (about
  a tenth of the target) and the next fork starts again from the base, so the body stays near
  its nominal size however many requests a run sends, and every new step is new to the proxy
  (tool-call ids carry the worker and the cycle, so no step repeats byte for byte).

Bodies are built from pre-serialized bytes (:class:`SessionBodies`), so the load generator
pays a memory copy per request, not a JSON encoding.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.conversations import _OUTPUT_BY_TOOL, _TOOLS, _arguments, _Generator, _prose
from compaction_proxy.compaction import EncodingLoader, Tokenizer, TokenizerProvider

Msg = dict[str, Any]

SIZES = {"8k": 8_000, "32k": 32_000, "128k": 128_000, "500k": 500_000}
STEP_OUTPUT_CAP = 4_000
"""Characters of one tool result in a fork step: agents' steps are mostly small; a rare huge
one would make the 8k session jump in size."""
GROWTH_SHARE = 0.10
"""How much a fork may add to the base before the next fork starts from the base again."""


def tokenizers() -> TokenizerProvider:
    """Offline tokenizers with the real o200k_base: the default search path, else the files
    litellm ships (located without importing it). Nothing is downloaded."""
    provider = TokenizerProvider()
    quiet = logging.getLogger("compaction_proxy.compaction.tokenizer_provider")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the fallback below is expected, not worth a warning
    try:
        provider.get("o200k_base")
    finally:
        quiet.setLevel(level)
    if not provider.fallback_active:
        return provider
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no offline o200k_base file: set TIKTOKEN_CACHE_DIR or install litellm")
    root = Path(next(iter(spec.submodule_search_locations)))
    loader = EncodingLoader(
        directories=[root / "litellm_core_utils" / "tokenizers"],
        include_env=False,
        include_default=False,
    )
    return TokenizerProvider(loader)


def o200k() -> Tokenizer:
    return tokenizers().get("o200k_base")


@dataclass
class AgentSession:
    """One agent session: the base conversation and the steps that follow it."""

    target: int
    base: list[Msg]
    base_tokens: int
    steps: list[list[Msg]]
    steps_per_fork: int
    step_tokens: float = 0.0  # mean tokens one step adds
    task_index: int = 0  # position of the running turn's task message in `base`

    def messages(self, request: int) -> list[Msg]:
        """The messages of request ``request`` (0-based) for worker 0, cycle 0 (no id tags)."""
        fork, step = divmod(request, self.steps_per_fork)
        fork %= len(self.steps) // self.steps_per_fork
        first = fork * self.steps_per_fork
        out = list(self.base)
        for s in self.steps[first : first + step + 1]:
            out.extend(s)
        return out


def _step(r: random.Random, counter: list[int], cap: int) -> list[Msg]:
    """One agent step: 1-3 parallel calls, a result per call (at most ``cap`` characters)."""
    parallel = 1 if r.random() < 0.6 else (2 if r.random() < 0.65 else 3)
    calls = []
    for _ in range(parallel):
        tool = r.choice(_TOOLS)
        counter[0] += 1
        calls.append(
            {
                "id": f"call_{counter[0]:06d}_{r.getrandbits(40):010x}",
                "type": "function",
                "function": {"name": tool, "arguments": _arguments(r, tool)},
            }
        )
    text = _prose(r, r.randint(30, 200)) if r.random() < 0.3 else None
    out: list[Msg] = [{"role": "assistant", "content": text, "tool_calls": calls}]
    for call in calls:
        u = r.random()
        size = (
            max(20, int(r.lognormvariate(math.log(220), 0.8)))
            if u < 0.85
            else r.randint(1_000, cap)
        )
        output = _OUTPUT_BY_TOOL[call["function"]["name"]](r, min(size, cap))
        out.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return out


def agent_session(
    target: int, tokenizer: Tokenizer, *, seed: int = 0, steps: int = 400
) -> AgentSession:
    """A session whose requests are about ``target`` o200k tokens (the base is ~95 % of it and
    forks add up to :data:`GROWTH_SHARE`); ``steps`` fork steps in all."""

    def tokens(msgs: list[Msg]) -> int:
        return sum(tokenizer.count_message(m) for m in msgs)

    g = _Generator(seed * 7_919 + target, tool_budget=10**12)
    r = g.r
    counter = [0]
    history_cap = max(2_000, target // 3)  # characters: one result never dominates a small base
    base: list[Msg] = [{"role": "system", "content": _prose(r, min(6_000, target))}]
    total = tokens(base)
    goal = int(target * (1 - GROWTH_SHARE / 2))
    # Earlier turns up to ~60 % of the goal, then the running turn: the task and its steps.
    while total < goal * 0.6:
        turn = [g.user()]
        for _ in range(r.choice((0, 1, 2, 3, 4, 6))):
            turn.extend(_step(r, counter, history_cap))
        turn.append(g.answer())
        base.extend(turn)
        total += tokens(turn)
    task_index = len(base)
    task = g.user()
    base.append(task)
    total += tokens([task])
    while True:
        step = _step(r, counter, min(history_cap, STEP_OUTPUT_CAP * 4))
        cost = tokens(step)
        if total + cost > goal and total > goal * 0.9:
            break
        base.extend(step)
        total += cost
    fork_rng = random.Random(seed * 104_729 + target + 1)
    fork_steps = [_step(fork_rng, counter, STEP_OUTPUT_CAP) for _ in range(steps)]
    step_tokens = sum(tokens(s) for s in fork_steps) / len(fork_steps)
    per_fork = max(2, min(steps, int(target * GROWTH_SHARE / step_tokens)))
    usable = (steps // per_fork) * per_fork
    return AgentSession(
        target=target,
        base=base,
        base_tokens=total,
        steps=fork_steps[:usable],
        steps_per_fork=per_fork,
        step_tokens=step_tokens,
        task_index=task_index,
    )


@dataclass
class SessionBodies:
    """Request bodies of one session for one model, built from pre-serialized messages.

    ``worker`` tags the running turn's task and every step's tool-call ids, so concurrent
    workers send different conversations (distinct checkpoint chains, distinct new steps)
    while sharing the earlier turns' bytes.
    """

    head: bytes  # '{"model": ..., "messages":[' + earlier turns, each followed by ','
    task: bytes  # the running turn's task message (tagged per worker)
    running: bytes  # the running turn's steps in the base, ',' joined ('' when none)
    steps: list[bytes]  # fork steps, each its messages ',' joined
    steps_per_fork: int
    tail: bytes = b"]}"

    @classmethod
    def build(
        cls, session: AgentSession, model: str, extra: dict[str, Any] | None = None
    ) -> SessionBodies:
        fields = orjson.dumps({"model": model, **(extra or {})})
        head = fields[:-1] + b',"messages":['
        earlier = session.base[: session.task_index]
        head += b"".join(orjson.dumps(m) + b"," for m in earlier)
        task = orjson.dumps(session.base[session.task_index])
        running = b",".join(orjson.dumps(m) for m in session.base[session.task_index + 1 :])
        steps = [b",".join(orjson.dumps(m) for m in step) for step in session.steps]
        return cls(head, task, running, steps, session.steps_per_fork)

    def base(self, worker: int = 0) -> bytes:
        """The base alone (what a checkpoint is primed with)."""
        parts = [self.head, self._task(worker)]
        if self.running:
            parts += [b",", self.running]
        return b"".join([*parts, self.tail])

    def body(self, request: int, worker: int = 0, first_cycle: int = 0) -> bytes:
        """Request ``request`` of ``worker``: the base plus the next step of its fork.

        ``first_cycle``: runs that must not resend each other's steps start at distinct cycles.
        """
        k = self.steps_per_fork
        forks = len(self.steps) // k
        fork, step = divmod(request, k)
        cycle, fork = divmod(fork, forks)
        cycle += first_cycle
        tag = b'"w%dc%dcall_' % (worker, cycle) if (worker or cycle) else None
        parts = [self.head, self._task(worker)]
        if self.running:
            parts += [b",", self.running]
        for s in self.steps[fork * k : fork * k + step + 1]:
            parts += [b",", s.replace(b'"call_', tag) if tag else s]
        parts.append(self.tail)
        return b"".join(parts)

    def _task(self, worker: int) -> bytes:
        if not worker:
            return self.task
        return self.task.replace(b'"content":"', b'"content":"[session %d] ' % worker, 1)

    def mean_bytes(self) -> int:
        """Mean body size over one fork (what "per 100 KB" divides by)."""
        k = self.steps_per_fork
        return sum(len(self.body(i)) for i in range(k)) // k

    def to_file(self, path: Path) -> None:
        path.write_bytes(
            orjson.dumps(
                {
                    "head": self.head.decode(),
                    "task": self.task.decode(),
                    "running": self.running.decode(),
                    "steps": [s.decode() for s in self.steps],
                    "steps_per_fork": self.steps_per_fork,
                }
            )
        )

    @classmethod
    def from_file(cls, path: Path) -> SessionBodies:
        data = json.loads(path.read_bytes())
        return cls(
            data["head"].encode(),
            data["task"].encode(),
            data["running"].encode(),
            [s.encode() for s in data["steps"]],
            int(data["steps_per_fork"]),
        )
