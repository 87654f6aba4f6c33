"""The ledger in the pipeline: after a fold the default pipeline forwards one ``<ledger>``
message (after the task in an agent loop, right after the summary when there is one), counted
inside the target; a run that folds nothing forwards it as it came; an explicit Agent Framework
pipeline has none unless it names ``- strategy: ledger``; the user's rules survive every
strategy; a long agent loop whose summarizer writes prose keeps its exact strings."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    ModelFacts,
    Pipeline,
    SummarizationSettings,
    build_pipeline,
    compact,
    compact_async,
)
from compaction_proxy.compaction.ledger import is_ledger

from .summarizer_fakes import FakeSummarizer

Msg = Mapping[str, Any]
TOK = CharacterEstimatorTokenizer()
PROSE = (
    "Goal: get the test suite green. Progress: investigated several failures, edited the "
    "database layer and re-ran the tests; some still fail. Next: keep fixing the remaining "
    "failures and re-run the suite."
)
"""A summarizer that writes plausible prose and copies no exact string."""
RULES = (
    "Never push to main.",
    "Always run the linter before you commit.",
    "HARD CONSTRAINT: Do not touch the migrations folder.",
)


def step(n: int) -> list[Msg]:
    """One agent step: a shell command and its output (a path, an exit code, an error line, a
    number with its unit, all distinct per step)."""
    command = f"pytest -q tests/test_mod{n}.py -k case{n}"
    output = (
        f"{'log line ' * 120}\n"
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}\n"
        f"src/app/mod{n}.py:{10 + n}: in handler{n}\n"
        f"handler{n} took {n + 0.5} s\n"
        f"exit code {n % 3 + 1}"
    )
    args = json.dumps({"command": command})
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": f"c{n}", "content": output},
    ]


def must_keep(n: int) -> list[str]:
    return [
        f"pytest -q tests/test_mod{n}.py -k case{n}",
        f"FAILED tests/test_mod{n}.py::test_case{n} - ValueError: bad value {n}",
        f"src/app/mod{n}.py",
        f"handler{n} took {n + 0.5} s",
        f"exit code {n % 3 + 1}",
    ]


def task() -> list[Msg]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests. " + " ".join(RULES)},
    ]


def run(
    messages: list[Msg], pipeline: Pipeline, window: int, summarizer: Any = None
) -> CompactionResult:
    request = CompactionRequest(
        messages,
        model="m",
        pipeline=pipeline,
        tokenizer=TOK,
        facts=ModelFacts(window, 0),
        reserve_ratio=0,
    )
    return asyncio.run(compact_async(request, summarizer=summarizer))


def ledgers(messages: list[Msg]) -> list[Msg]:
    return [m for m in messages if is_ledger(m.get("content"))]


def default(share: float | None = None, **summarization: Any) -> Pipeline:
    compaction = CompactionSettings.model_validate({"ledger": {"share": share}} if share else {})
    return build_pipeline(
        compaction, SummarizationSettings(**(summarization or {"enabled": False}))
    )


def test_an_agent_loop_gets_the_ledger_after_its_task_counted_inside_the_target() -> None:
    messages = task() + [m for n in range(40) for m in step(n)]
    result = run(messages, default(), 6_000)
    [ledger] = ledgers(result.messages)
    assert result.messages.index(ledger) == 2  # the system prompt, the task, then the ledger
    assert result.report.tokens_after <= 0.5 * result.report.budget  # the target, ledger in
    kept = {id(m) for m in result.messages}
    folded = [n for n in range(40) if id(messages[3 + 2 * n]) not in kept]  # its result
    assert len(folded) > 20
    wanted = [s for n in folded for s in must_keep(n)]
    missing = [s for s in wanted if s not in ledger["content"]]
    assert missing == [] or result.report.warnings, missing[:3]
    # compacting the output again changes nothing: the ledger included
    assert not run(result.messages, default(), 6_000).changed


def test_a_run_that_folds_nothing_forwards_the_ledger_as_it_came() -> None:
    messages = task() + [m for n in range(40) for m in step(n)]
    first = run(messages, default(), 6_000)
    [ledger] = ledgers(first.messages)
    grown = [*first.messages, *step(40)]  # one more step: under the trigger again
    again = run(grown, default(), 6_000)
    assert not again.changed
    assert ledgers(again.messages)[0] is ledger


@pytest.mark.parametrize("share", [None, 0.25])
def test_the_ledger_follows_the_summary_and_holds_what_the_prose_left_out(
    share: float | None,
) -> None:
    messages = task() + [m for n in range(40) for m in step(n)]
    summarizer = FakeSummarizer(PROSE)
    result = run(messages, default(share, enabled=True), 6_000, summarizer)
    assert summarizer.calls
    summary = next(
        i for i, m in enumerate(result.messages) if str(m["content"]).startswith("<summary>")
    )
    [ledger] = ledgers(result.messages)
    assert result.messages.index(ledger) == summary + 1
    kept = {id(m) for m in result.messages}
    folded = [n for n in range(40) if id(messages[3 + 2 * n]) not in kept]
    assert "pytest" not in PROSE and len(folded) > 20
    if share is None:  # the default share (half the budget) holds every folded step's strings
        assert all(s in ledger["content"] for n in folded for s in must_keep(n))
        assert not any("item(s) left out" in w for w in result.report.warnings)
        return
    # at a quarter: the newest folded step's strings are there; older ones went, reported
    assert all(s in ledger["content"] for s in must_keep(folded[-1]))
    assert any("item(s) left out" in w for w in result.report.warnings)


AF = [{"strategy": "truncation", "trigger": {"token_ratio": 0.8}, "target": {"token_ratio": 0.5}}]


@pytest.mark.parametrize(
    ("block", "has_ledger"),
    [
        ({"pipeline": AF}, False),
        ({"pipeline": [*AF, {"strategy": "ledger"}]}, True),
        ({"pipeline": [*AF, {"strategy": "ledger", "share": 0.1}]}, True),
        ({"pipeline": AF, "ledger": {"enabled": True}}, True),
        ({"ledger": {"enabled": False}}, False),
        ({}, True),
    ],
)
def test_which_pipelines_keep_a_ledger(block: dict[str, Any], has_ledger: bool) -> None:
    pipeline = build_pipeline(CompactionSettings.model_validate(block))
    assert (pipeline.ledger_share is not None) == has_ledger
    assert all(s.name != "ledger" for s in pipeline.strategies)
    messages = task() + [m for n in range(40) for m in step(n)]
    result = compact(
        CompactionRequest(
            messages, model="m", pipeline=pipeline, tokenizer=TOK, facts=ModelFacts(6_000, 0)
        )
    )
    assert result.changed and len(ledgers(result.messages)) == int(has_ledger)


def test_the_entrys_share_bounds_the_block() -> None:
    block = {"pipeline": [*AF, {"strategy": "ledger", "share": 0.05}]}
    pipeline = build_pipeline(CompactionSettings.model_validate(block))
    assert pipeline.ledger_share == 0.05
    messages = task() + [m for n in range(40) for m in step(n)]
    result = run(messages, pipeline, 6_000)
    assert any("left out to keep it within 0.05 of the budget" in w for w in result.report.warnings)


STRATEGIES = [
    {"strategy": "truncation", "trigger": {"token_ratio": 0.8}, "target": {"token_ratio": 0.4}},
    {"strategy": "sliding_window", "trigger": {"turns_exceed": 3}},
    {"strategy": "selective_tool_calls", "trigger": {"token_ratio": 0.5}},
    {"strategy": "summarization", "trigger": {"token_ratio": 0.6}, "retain_recent": {"turns": 2}},
]


@pytest.mark.parametrize("entry", STRATEGIES, ids=lambda e: e["strategy"])
def test_the_users_rules_survive_every_strategy_verbatim(entry: dict[str, Any]) -> None:
    """Turn 1 states the rules; 30 turns later, whatever folded turn 1, its rules are
    forwarded verbatim: in the task where a strategy kept it (selective_tool_calls keeps user
    messages), else in the ledger (this pipeline carries no user message)."""
    pipeline = build_pipeline(
        CompactionSettings.model_validate({"pipeline": [entry, {"strategy": "ledger"}]})
    )
    messages: list[Msg] = task()
    for n in range(30):
        messages += [{"role": "assistant", "content": f"on it ({n})"}, *step(n)]
        messages.append({"role": "user", "content": f"turn {n + 2}: continue with item {n}"})
    result = run(messages, pipeline, 4_000, FakeSummarizer(PROSE))
    assert result.changed
    [ledger] = ledgers(result.messages)
    carried = [m for m in result.messages if m.get("content") == messages[1]["content"]]
    assert all(rule in (carried[0] if carried else ledger)["content"] for rule in RULES)


@pytest.mark.parametrize("window", [8_000, 32_000])
def test_rules_stay_verbatim_over_100_turns(window: int) -> None:
    """A client that sends back what was forwarded plus its next turn, 100 times: every rule a
    user stated is in the request forwarded at the end, verbatim (carried or in the ledger)."""
    pipeline = default(enabled=True)
    summarizer = FakeSummarizer(PROSE)
    said: list[str] = []
    messages = task()[:1]
    for turn in range(100):
        rule = f"Never delete the file data/keep-{turn}.csv." if turn % 10 == 0 else None
        text = f"turn {turn}: look at item {turn}." + (f" {rule}" if rule else "")
        if rule:
            said.append(rule)
        messages = [*messages, {"role": "user", "content": text}, *step(turn)]
        messages.append({"role": "assistant", "content": f"item {turn} done"})
        result = run(messages, pipeline, window, summarizer)
        messages = list(result.messages)
    forwarded = json.dumps(messages)
    assert summarizer.calls
    assert [r for r in said if r not in forwarded] == []


def test_over_budget_the_ledger_releases_its_artifacts_before_its_rules() -> None:
    """A ledger that came with the request, big with artifacts, and a newest step that leaves
    it no room: its artifacts go (reported), its rules stay."""
    from compaction_proxy.compaction.ledger import Item, Section, render

    items = [Item(Section.RULES, rule) for rule in RULES] + [
        Item(Section.FILES, f"src/app/module_{n}.py") for n in range(300)
    ]
    ledger = {"role": "user", "content": render(items)}
    messages = [*task(), ledger, *step(0)]
    result = run(messages, default(), 1_500)
    [kept] = ledgers(result.messages)
    assert all(rule in kept["content"] for rule in RULES)
    assert "src/app/module_0.py" not in kept["content"]
    assert any(
        "released: the budget could not be met otherwise" in w for w in result.report.warnings
    )
    assert result.report.tokens_after <= result.report.budget


def test_with_recall_on_each_item_names_the_original_it_came_from() -> None:
    from compaction_proxy.compaction.archive import RecallIds

    messages = task() + [m for n in range(40) for m in step(n)]
    request = CompactionRequest(
        messages,
        model="m",
        pipeline=default(),
        tokenizer=TOK,
        facts=ModelFacts(6_000, 0),
        reserve_ratio=0,
        recall=RecallIds(b"ledger-test"),
    )
    result = asyncio.run(compact_async(request))
    [ledger] = ledgers(result.messages)
    ids = set(re.findall(r"\[recall id (r[a-z2-7]{11})\]", str(ledger["content"])))
    assert ids and result.archived is not None
    assert ids <= set(result.archived.originals)
