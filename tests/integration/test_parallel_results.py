"""Parallel tool results through a 120-step agent loop: the second result survives collapse.

Every step makes two parallel calls: ``read_file`` returns a large file (over the 4,096
characters a collapsed ``[Tool results: ...]`` message may hold), ``grep`` a match naming a
``FACT-G...`` token, at the head of a short result on odd steps and of a longer one on even
steps.  The default pipeline collapses old tool-call groups before it summarizes them, so
whatever the collapse cuts, no summarizer ever sees.  The collapse used to spend its whole cap
on the first result, cutting every second one away (12% of their facts were left after 120
steps); the cap is now shared between the results, each keeping its head and its tail, so the
summarizer is shown every match and its summary carries them to the end.

Real processes: the proxy under ``serve``, the fake upstream enforcing a 32k window and playing
the summarizer (it lists every ``FACT-...`` it was shown), the official openai SDK.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.compaction.strategies.tool_result_compaction import MIDDLE_MARKER
from tests.support.agent_loop import LoopReport, run_loop
from tests.support.agent_session import tool_output
from tests.support.in_thread import InThreadServers
from tests.support.servers import UpstreamControl, proxy_config, upstream_entry

WINDOW = 32_000
MODEL = "parallel-32k"
STEPS = 120
FIRST_CHARS = 4_500  # alone over the 4,096-character cap of a collapsed message


def second_fact(index: int) -> str:
    return f"FACT-G{index}"


def add_parallel_step(conversation: list[dict[str, Any]], index: int, report: LoopReport) -> None:
    """Two parallel calls: a large ``read_file`` result first, then a ``grep`` match."""
    calls = [
        {
            "id": f"call_{index}_{n}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"q": f"mod_{index}"})},
        }
        for n, name in enumerate(("read_file", "grep"))
    ]
    conversation.append({"role": "assistant", "content": None, "tool_calls": calls})
    fact = second_fact(index)
    report.facts_shown.append(fact)
    results = [
        tool_output(index, 0, FIRST_CHARS),
        f"src/mod_{index}.py:12: {fact} matched\n"
        + tool_output(index, 1, 2_500 if index % 2 == 0 else 100),
    ]
    conversation.extend(
        {"role": "tool", "tool_call_id": call["id"], "content": result}
        for call, result in zip(calls, results, strict=True)
    )


@pytest.fixture(scope="module")
def loop(
    in_thread: InThreadServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> LoopReport:
    upstream: UpstreamControl = in_thread.upstream(WINDOW)
    db: Path = tmp_path_factory.mktemp("parallel") / "checkpoints.db"
    proxy = in_thread.proxy(
        proxy_config(
            upstream_entry(upstream),
            models={MODEL: {"context_window": WINDOW, "max_output_tokens": 2_000}},
            store={"backend": "sqlite", "path": str(db)},
            summarization={
                "maxSummaryTokens": 1_000,
                "retainRecent": {"turns": 2},
                "timeout": 10,
            },
        )
    )
    return run_loop(
        proxy.openai_client(), upstream, model=MODEL, steps=STEPS, add=add_parallel_step
    )


def test_the_second_results_facts_survive_the_loop(loop: LoopReport) -> None:
    assert len(loop.steps) == STEPS  # the SDK raises on any non-2xx
    assert all(0 < step.prompt_tokens <= WINDOW for step in loop.steps)
    assert loop.events and loop.summarizer_calls > 0
    assert any("tool_result_compaction" in s.strategies.split(",") for s in loop.events)
    sent = [second_fact(i) for i in range(STEPS - 1)]  # the last step made is never sent
    last = json.dumps(loop.steps[-1].forwarded, ensure_ascii=False)
    kept = [fact for fact in sent if re.search(rf"{fact}(?![0-9])", last)]
    share = len(kept) / len(sent)
    assert share >= 0.95, f"{share:.0%} of the second results' facts reached the last request"


def test_collapsed_groups_keep_every_result(loop: LoopReport) -> None:
    """Each collapsed message within the cap holds both results: the file's head and tail
    around the cut's marker, and the match whole (or cut the same way, with the match in its
    head)."""
    collapsed = [
        m["content"]
        for step in loop.steps
        for m in step.forwarded
        if m.get("role") == "assistant" and str(m.get("content")).startswith("[Tool results: ")
    ]
    assert collapsed, "nothing was collapsed in the loop"
    for text in set(collapsed):
        assert len(text) <= 4_096
        head, _, tail = text.partition("; grep: ")
        step = re.match(r"\[Tool results: read_file: # output of step (\d+) call 0\n", head)
        assert step is not None, head[:80]
        file_head, file_tail = head.split(MIDDLE_MARKER)
        assert len(file_head) > len(file_tail) > 0  # 3/5 of what is kept, and 2/5
        assert tool_output(int(step[1]), 0, FIRST_CHARS).rstrip().endswith(file_tail)
        assert tail.startswith("src/mod_") and "FACT-G" in tail.split("\n", 1)[0]
