"""An agent loop driven request by request with wall-clock timings: the model takes a while
to answer and the agent a while to run its tool, as real ones do.

Used by `tests/integration/test_prepare.py` and `bench/session.py --latency`: whether the
request on which compaction happens waits for the summarizer (summarization.prepare).
Summarizer calls are collected from the upstream's recordings, whoever made them and whenever
(background calls land between requests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.agent_loop import SYSTEM, TASK, LoopReport, add_step
from tests.support.agent_session import CHAT, TOOLS, is_summarizer_text
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamServer


@dataclass
class Step:
    index: int
    seconds: float
    forwarded: list[dict[str, Any]]
    checkpoint: str
    prepared: str
    warnings: list[str]
    strategies: str = ""
    # Summarizer calls that reached the upstream between this request and its reply (the
    # request's own, or a background one).
    summarizer_calls: int = 0


@dataclass
class Session:
    steps: list[Step] = field(default_factory=list)
    summarizer_calls: int = 0
    summaries: list[str] = field(default_factory=list)
    facts_shown: list[str] = field(default_factory=list)
    # Every request was answered while the upstream held summarizer calls at a gate.
    held_summarizer: bool = False

    @property
    def events(self) -> list[Step]:
        return [s for s in self.steps if s.checkpoint == "new"]

    @property
    def summarized(self) -> list[Step]:
        """The events where summarization acted (others only collapsed or dropped)."""
        return [s for s in self.events if "summarization" in s.strategies.split(",")]

    @property
    def ordinary(self) -> list[Step]:
        return [s for s in self.steps if s.checkpoint != "new"]

    def stable_share(self) -> float:
        flags = [
            after.forwarded[: len(before.forwarded)] == before.forwarded
            for before, after in zip(self.steps, self.steps[1:], strict=False)
        ]
        return sum(flags) / len(flags)


def drive(
    clients: list[openai.OpenAI],
    upstream: UpstreamServer,
    *,
    model: str,
    steps: int,
    think_seconds: float,
    settle_seconds: float,
    hold_summarizer: bool = False,
) -> Session:
    """One agent loop; request i goes to clients[i % len(clients)] (replicas behind a
    balancer). Summarizer calls are collected from the upstream's recordings, whoever made
    them and whenever (background calls land between requests).

    ``hold_summarizer``: the upstream holds summarizer calls at a gate while each request is
    in flight and lets them go once it is answered (as the agent starts its tool), so a
    request that waited for a summarizer call could not have been answered in time: it runs
    into the proxy's summarization timeout and says so in its warnings."""
    session = Session(held_summarizer=hold_summarizer)
    report = LoopReport(facts_shown=["FACT-TASK"])
    conversation: list[dict[str, Any]] = [SYSTEM, TASK]
    upstream.clear()
    for index in range(steps):
        client = clients[index % len(clients)]
        if hold_summarizer:
            upstream.control(summarizer_hold=True)
        started = time.perf_counter()
        raw = create_raw(client, model=model, messages=conversation, tools=TOOLS)
        seconds = time.perf_counter() - started
        if hold_summarizer:
            upstream.control(summarizer_hold=False)
        raw.parse()
        recorded = upstream.take(CHAT)  # read and cleared at once: no background call is lost
        forwarded = [r.json() for r in recorded if not is_summarizer_text(r.text)]
        summaries = [r for r in recorded if is_summarizer_text(r.text)]
        session.summarizer_calls += len(summaries)
        session.summaries.extend(r.text or "" for r in summaries)
        assert len(forwarded) == 1, f"step {index}: {len(forwarded)} forwarded requests"
        session.steps.append(
            Step(
                index=index,
                seconds=seconds,
                forwarded=forwarded[0]["messages"],
                checkpoint=raw.headers.get("x-compaction-checkpoint", ""),
                prepared=raw.headers.get("x-compaction-prepared", ""),
                warnings=raw.headers.get_list("x-compaction-warning"),
                strategies=raw.headers.get("x-compaction-strategies", ""),
                summarizer_calls=len(summaries),
            )
        )
        add_step(conversation, index, report)
        time.sleep(think_seconds)
    # A summary still being made when the session ends lands after its last request.
    deadline = time.monotonic() + settle_seconds
    while time.monotonic() < deadline and session.steps[-1].prepared == "pending":
        late = [r for r in upstream.requests(CHAT) if is_summarizer_text(r.text)]
        if late:
            break
        time.sleep(0.1)
    session.summarizer_calls += sum(
        1 for r in upstream.requests(CHAT) if is_summarizer_text(r.text)
    )
    session.facts_shown = report.facts_shown
    return session
