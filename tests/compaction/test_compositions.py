"""The Agent Framework's two compositions, as its documentation describes them.

* The plain pipeline (.NET ``PipelineCompactionStrategy``): "the pipeline's trigger is
  ``CompactionTriggers.Always``; each child strategy evaluates its own trigger independently";
  "strategies run in the given order, so put the gentlest first"; it reports a change when any
  child compacted.  Its documented example, ported to our config as written::

      new ToolResultCompactionStrategy(CompactionTriggers.TokensExceed(0x200)),
      new SummarizationCompactionStrategy(summarizer, CompactionTriggers.TokensExceed(0x500)),
      new SlidingWindowCompactionStrategy(CompactionTriggers.TurnsExceed(4)),
      new TruncationCompactionStrategy(CompactionTriggers.TokensExceed(0x8000))

  "collapses old tool results (gentle), summarizes older conversation segments (moderate),
  keeps only the last 4 user turns (aggressive), drops the oldest groups if still over budget
  (emergency)".  .NET is not run here (its package is not on PyPI for Python); these vectors
  are the documentation's own statements.
* The token-budget composition (Python ``TokenBudgetComposedStrategy``): "each child runs in
  order, stopping early once the budget is met; a built-in fallback excludes the oldest groups
  if the strategies cannot reach the target", ``early_stop=True`` by default.  Conformance with
  ``agent-framework-core`` itself is in test_conformance_af.py.

Plus how the proxy's own pipelines map onto them: an explicit ``compaction.pipeline`` is plain
(``early_stop: true`` makes it a token-budget composition); the default pipeline derived from
the ``summarization`` block (LibreChat's, pasted) is a token-budget composition whose budget is
its target, 0.5 of the request's budget, entered at 0.8 with hysteresis.

An explicit pipeline is read in the Agent Framework's terms: it has neither of the proxy's two
additions (``carry_user_messages``, ``min_saving``) unless its block writes them, so the seeds'
pipelines pasted verbatim are the Agent Framework's.  The default pipeline has both.  The
interplay tests at the end write both into the seeds' configurations, as a user who wants them
does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

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
from compaction_proxy.compaction.factory import default_target
from compaction_proxy.compaction.settings import LedgerSettings
from compaction_proxy.compaction.strategies import (
    PipelineStrategy,
    SlidingWindowStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.triggers import Always, TokenRatio, TokensExceed, TurnsExceed

from .helpers import Msg, a, call, s, tool, u
from .summarizer_fakes import FakeSummarizer

TOK = CharacterEstimatorTokenizer()
WINDOW_32K = ModelFacts(context_window=32_768, max_output_tokens=4_096)

DOTNET_PIPELINE_YAML = """
pipeline:
  - {strategy: tool_result_compaction, trigger: {tokens_exceed: 0x200}}
  - {strategy: summarization, trigger: {tokens_exceed: 0x500}}
  - {strategy: sliding_window, trigger: {turns_exceed: 4}}
  - {strategy: truncation, trigger: {tokens_exceed: 0x8000}}
"""
"""The seed's .NET ``PipelineCompactionStrategy`` example, entry for entry, its hex literals as
written (YAML reads ``0x200`` as 512)."""


ADDITIONS = {"carry_user_messages": 0.15, "min_saving": 0.02}
"""The proxy's two additions, written into an explicit pipeline's block (the default pipeline's
values): the churn cut (compaction/strategies/_support/churn.py: a collapse saving ~100 tokens
of a 28k budget is undone) and the carried user messages (compaction/carry.py: they stay beside
the window, so "the user messages forwarded" are not "the turns kept")."""


def dotnet_pipeline(extra: dict[str, Any] | None = None) -> Pipeline:
    block = yaml.safe_load(DOTNET_PIPELINE_YAML)
    return build_pipeline(CompactionSettings.model_validate({**block, **(extra or {})}))


def shopping(turns: int, result_chars: int = 150) -> list[Msg]:
    """The seed's shopping assistant: a price lookup per user turn."""
    msgs: list[Msg] = [s("You are a helpful shopping assistant.")]
    for i in range(turns):
        msgs += [
            u(f"turn {i}: what's the price of item {i}?"),
            call(f"c{i}", name="LookupPrice"),
            tool(f"c{i}", f"item {i} costs {i} USD " + "x" * result_chars),
            a(f"Item {i} costs {i} USD."),
        ]
    return msgs


def run(
    msgs: Sequence[Mapping[str, Any]],
    pipeline: Pipeline,
    facts: ModelFacts = WINDOW_32K,
    summarizer: FakeSummarizer | None = None,
) -> CompactionResult:
    request = CompactionRequest(
        msgs, model="m", pipeline=pipeline, tokenizer=TOK, facts=facts, reserve_ratio=0
    )
    return asyncio.run(compact_async(request, summarizer=summarizer))


def user_turns(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        str(m["content"])
        for m in messages
        if m["role"] == "user" and not str(m["content"]).startswith("<summary>")
    ]


def split_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[Mapping[str, Any]]]:
    """``(turns, carried)``: the user turns (a user message with a reply right after it, and the
    newest user message) and the user messages standing alone, carried verbatim while the rest of
    their turns went (compaction/carry.py: not turns)."""
    users = [
        i
        for i, m in enumerate(messages)
        if m["role"] == "user" and not str(m["content"]).startswith("<summary>")
    ]
    turns: list[str] = []
    carried: list[Mapping[str, Any]] = []
    for i in users:
        after = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if i == users[-1] or after in ("assistant", "tool"):
            turns.append(str(messages[i]["content"]))
        else:
            carried.append(messages[i])
    return turns, carried


# ------------------------------------------------------------- the plain pipeline (.NET)


def test_the_seeds_dotnet_pipeline_is_a_plain_pipeline() -> None:
    pipeline = dotnet_pipeline()
    assert [s.name for s in pipeline.strategies] == [
        "tool_result_compaction",
        "summarization",
        "sliding_window",
        "truncation",
    ]
    assert [s.trigger for s in pipeline.strategies] == [
        TokensExceed(0x200),
        TokensExceed(0x500),
        TurnsExceed(4),
        TokensExceed(0x8000),
    ]
    assert (pipeline.early_stop, pipeline.hysteresis) == (False, False)
    # pasted as written, it has neither of the proxy's additions: the Agent Framework's
    assert (pipeline.carry_user_share, pipeline.min_saving) == (0.0, 0.0)


def more_turns(msgs: Sequence[Mapping[str, Any]], first: int, count: int) -> list[Any]:
    """``msgs`` (the same dicts) and the next ``count`` shopping turns, from turn ``first`` on."""
    return [*msgs, *shopping(first + count)[1 + 4 * first :]]


def test_every_child_of_the_seeds_pipeline_runs_as_its_trigger_says() -> None:
    """30 turns on a 32k model: the request fits the budget all along, yet every child whose
    trigger fires runs, in order, each on what the one before left.  Summarization folds all
    but the ``retainRecent`` turns (2), so the window's trigger, checked on what it left, does
    not fire; five turns later (the summary then under 0x500 tokens) it does."""
    msgs = shopping(30)
    summarizer = FakeSummarizer()
    pipeline = dotnet_pipeline()
    result = run(msgs, pipeline, summarizer=summarizer)
    report = result.report
    assert report.tokens_before < report.budget  # nothing here is about the budget
    collapse, summarization, window, truncation = report.strategies
    assert collapse.fired and collapse.changed  # over 0x200 tokens
    assert summarization.fired and summarization.changed  # over 0x500 tokens
    assert len(summarizer.calls) == 1
    assert window.skipped == "trigger"  # 2 turns left: not more than 4
    assert truncation.skipped == "trigger"  # under 0x8000 tokens: its trigger does not fire
    assert all(r.skipped != "early_stop" for r in report.strategies)
    for before, after in zip(report.strategies, report.strategies[1:], strict=False):
        assert after.tokens_before == before.tokens_after  # each sees the previous output
    assert user_turns(result.messages) == [
        f"turn {i}: what's the price of item {i}?" for i in (28, 29)
    ]
    assert str(result.messages[1]["content"]).startswith("<summary>")
    # five turns later: 7 turns, under 0x500 tokens once collapsed
    later = run(more_turns(result.messages, 30, 5), pipeline, summarizer=summarizer)
    collapse, summarization, window, truncation = later.report.strategies
    assert collapse.fired and collapse.changed
    assert summarization.skipped == "trigger" and len(summarizer.calls) == 1
    assert window.fired and window.changed  # more than 4 turns were left
    assert truncation.skipped == "trigger"
    # "keeps only the last 4 user turns": the newest 4, the summary before them
    assert user_turns(later.messages) == [
        f"turn {i}: what's the price of item {i}?" for i in (31, 32, 33, 34)
    ]
    assert str(later.messages[1]["content"]).startswith("<summary>")


def test_a_child_whose_trigger_does_not_fire_is_skipped_even_after_another_acted() -> None:
    """No hysteresis in a plain pipeline: an earlier child acting engages nothing."""
    msgs = shopping(12)
    total = TOK.count_messages(msgs)
    pipeline = Pipeline(
        (
            TruncationStrategy(trigger=TokensExceed(total // 2)),
            SlidingWindowStrategy(trigger=TurnsExceed(100)),
        ),
        early_stop=False,
    )
    report = run(msgs, pipeline, ModelFacts(10 * total, 0)).report
    assert report.strategies[0].changed
    assert report.strategies[1].skipped == "trigger"


def test_a_nested_plain_pipeline_runs_every_child_by_its_own_trigger() -> None:
    """The same as an entry (``strategy: pipeline`` without a token_budget): its trigger is
    ``always``, it has no early stop of its own, and it reports a change when a child made one."""
    msgs = shopping(10)
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "pipeline",
                    "strategies": [
                        {"strategy": "truncation", "trigger": "over_budget"},
                        {"strategy": "sliding_window", "trigger": {"turns_exceed": 2}},
                    ],
                }
            ],
        }
    )
    pipeline = build_pipeline(settings)
    (entry,) = pipeline.strategies
    assert isinstance(entry, PipelineStrategy)
    assert entry.trigger == Always() and not entry.early_stop and not entry.fallback
    facts = ModelFacts(int(TOK.count_messages(msgs) / 1.2), 0)
    result = run(msgs, pipeline, facts)
    (nested,) = result.report.strategies
    truncation, window = nested.children
    assert truncation.changed  # brought the request under the budget ...
    assert result.report.tokens_after <= result.report.budget
    assert window.fired and window.changed  # ... and the window still ran by its own trigger
    assert len(user_turns(result.messages)) == 2
    assert nested.changed
    # under the budget from the start: the entry still fires (``always``), and so does the window
    small = run(msgs, pipeline, ModelFacts(100 * TOK.count_messages(msgs), 0))
    (nested,) = small.report.strategies
    assert nested.fired
    assert [c.skipped for c in nested.children] == ["trigger", None]
    assert len(user_turns(small.messages)) == 2


def test_a_plain_pipeline_is_idempotent() -> None:
    msgs = shopping(30)
    first = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=dotnet_pipeline(),
            tokenizer=TOK,
            facts=WINDOW_32K,
            reserve_ratio=0,
        )
    )
    assert first.changed
    again = compact(
        CompactionRequest(
            first.messages,
            model="m",
            pipeline=dotnet_pipeline(),
            tokenizer=TOK,
            facts=WINDOW_32K,
            reserve_ratio=0,
        )
    )
    assert not again.changed


# ------------------------------------------------------- the token-budget composition


def test_top_level_early_stop_makes_the_token_budget_composition() -> None:
    """``early_stop: true`` over the same entries: once collapsing brought the request under
    the budget, the rest are skipped (what an explicit pipeline did before it was plain)."""
    # the collapse saves ~100 tokens here: with min_saving written it would be undone (no
    # change: summarization would run, see the end of this module); the early stop is under test
    pipeline = dotnet_pipeline({"early_stop": True})
    assert pipeline.early_stop and pipeline.stop_when is None  # over_budget
    summarizer = FakeSummarizer()
    report = run(shopping(30), pipeline, summarizer=summarizer).report
    assert report.strategies[0].changed
    assert [r.skipped for r in report.strategies[1:]] == ["early_stop"] * 3
    assert not summarizer.calls


SEED_PYTHON_BUDGET = {
    "strategy": "pipeline",
    "token_budget": 16_000,
    "strategies": [
        {"strategy": "tool_result_compaction", "keep_last_tool_call_groups": 1},
        {"strategy": "summarization", "target_count": 4, "threshold": 2},
        {"strategy": "sliding_window", "keep_last_groups": 20},
    ],
}
"""The seed's Python ``TokenBudgetComposedStrategy(token_budget=16_000, ...)`` example."""


def test_the_seeds_token_budget_example_stops_once_its_budget_holds() -> None:
    """The seed's example verbatim, and again with ``min_saving`` written: the collapse saves
    less than 2 % of the model's (huge) budget, but it starts over the entry's own 16,000, so it
    is kept either way."""
    for extra in ({}, ADDITIONS):
        block = {"pipeline": [SEED_PYTHON_BUDGET], **extra}
        check_the_seeds_token_budget_example(
            build_pipeline(CompactionSettings.model_validate(block))
        )


def check_the_seeds_token_budget_example(pipeline: Pipeline) -> None:
    (entry,) = pipeline.strategies
    assert isinstance(entry, PipelineStrategy)
    assert entry.early_stop and entry.fallback and entry.trigger == TokensExceed(16_000)
    msgs = shopping(60, result_chars=1_200)
    assert TOK.count_messages(msgs) > 16_000
    summarizer = FakeSummarizer()
    result = run(msgs, pipeline, ModelFacts(10**6, 0), summarizer)
    (nested,) = result.report.strategies
    collapse, summarization, window = nested.children
    assert collapse.changed and collapse.tokens_after > 16_000  # not enough on its own
    assert summarization.changed and summarization.tokens_after <= 16_000
    assert window.skipped == "early_stop"  # the budget holds: the aggressive step is skipped
    assert len(summarizer.calls) == 1
    # "within budget: nothing to do": the entry does not fire at all
    fits = run(shopping(5), pipeline, ModelFacts(10**6, 0), FakeSummarizer())
    assert fits.report.strategies[0].skipped == "trigger" and not fits.changed


def test_the_token_budget_fallback_drops_the_oldest_groups_when_the_children_fall_short() -> None:
    entry = {**SEED_PYTHON_BUDGET, "token_budget": 2_000}
    pipeline = build_pipeline(CompactionSettings.model_validate({"pipeline": [entry]}))
    result = run(shopping(60, result_chars=1_200), pipeline, ModelFacts(10**6, 0))  # no summarizer
    (nested,) = result.report.strategies
    assert [c.name for c in nested.children][-1] == "fallback_truncation"
    assert nested.children[-1].changed
    assert result.report.tokens_after <= 2_000


# ------------------------------------------------------------- the two are never mixed


@pytest.mark.parametrize(
    "extra",
    [{"early_stop": True}, {"stop_when": {"token_ratio": 0.5}}, {"fallback": True}],
)
def test_a_plain_pipeline_entry_refuses_the_token_budget_keys(extra: dict[str, Any]) -> None:
    (key,) = extra
    entry = {"strategy": "pipeline", "strategies": [{"strategy": "truncation"}], **extra}
    with pytest.raises(ValidationError, match=f"{key} belongs to a token_budget pipeline"):
        CompactionSettings.model_validate({"pipeline": [entry]})
    with pytest.raises(ValueError, match="belongs to a token_budget pipeline"):
        PipelineStrategy(
            [TruncationStrategy()], **{key: TokenRatio(0.5) if key == "stop_when" else True}
        )
    # stating the plain pipeline's own values is fine
    CompactionSettings.model_validate(
        {"pipeline": [{**entry, key: False}]} if key != "stop_when" else {"pipeline": []}
    )


@pytest.mark.parametrize("extra", [{"stop_when": {"token_ratio": 0.6}}, {"hysteresis": True}])
def test_a_plain_top_level_pipeline_refuses_a_stop_condition(extra: dict[str, Any]) -> None:
    block = {"pipeline": [{"strategy": "truncation"}], **extra}
    with pytest.raises(ValidationError, match="add early_stop: true"):
        CompactionSettings.model_validate(block)
    with pytest.raises(ValidationError, match="add early_stop: true"):
        CompactionSettings.model_validate({**block, "early_stop": False})
    pipeline = build_pipeline(CompactionSettings.model_validate({**block, "early_stop": True}))
    assert pipeline.early_stop
    if "hysteresis" in extra:  # the default pipeline's too: it runs towards stop_when
        with pytest.raises(ValidationError, match="hysteresis needs early_stop"):
            CompactionSettings.model_validate({"hysteresis": True, "early_stop": False})
        relaxed = build_pipeline(CompactionSettings.model_validate({"early_stop": False}))
        assert (relaxed.early_stop, relaxed.hysteresis) == (False, False)


# --------------------------------------------------- the default pipeline's composition


def test_the_default_pipeline_is_a_token_budget_composition_with_hysteresis() -> None:
    """Fire at 0.8, budget (and every entry's target) 0.5, early stop, hysteresis: as today."""
    librechat = SummarizationSettings.model_validate(
        {
            "maxSummaryTokens": 4096,
            "reserveRatio": 0.05,
            "trigger": {"type": "token_ratio", "value": 0.8},
            "contextPruning": {"enabled": True, "keepLastAssistants": 3},
        }
    )
    for block in (SummarizationSettings(), librechat):
        pipeline = build_pipeline(CompactionSettings(), block)
        assert (pipeline.early_stop, pipeline.hysteresis) == (True, True)
        assert pipeline.stop_when == default_target() == TokenRatio(0.5)
        assert all(s.trigger == TokenRatio(0.8) for s in pipeline.strategies)
        assert all(s.target == TokenRatio(0.5) for s in pipeline.strategies)


def test_the_written_out_default_pipeline_behaves_as_the_default() -> None:
    """With ``early_stop`` and ``hysteresis`` written, an explicit list is the default pipeline."""
    written = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "context_pruning",
                    "trigger": {"token_ratio": 0.8},
                    "target": {"token_ratio": 0.5},
                },
                {
                    "strategy": "tool_result_compaction",
                    "trigger": {"token_ratio": 0.8},
                    "target": {"token_ratio": 0.5},
                },
                {
                    "strategy": "summarization",
                    "trigger": {"token_ratio": 0.8},
                    "target": {"token_ratio": 0.5},
                    "retain_recent": {"turns": 2},
                },
                {
                    "strategy": "truncation",
                    "trigger": {"token_ratio": 0.8},
                    "target": {"token_ratio": 0.5},
                },
            ],
            "early_stop": True,
            "stop_when": {"token_ratio": 0.5},
            "hysteresis": True,
            # the default pipeline's own additions, which an explicit one has only when written
            **ADDITIONS,
            "ledger": {"enabled": True},
        }
    )
    msgs = shopping(40, result_chars=20)
    facts = ModelFacts(int(TOK.count_messages(msgs) / 0.85), 0)
    default = run(msgs, build_pipeline(CompactionSettings()), facts)
    ours = run(msgs, build_pipeline(written), facts)
    assert ours.messages == default.messages
    assert ours.report.tokens_after <= 0.5 * ours.report.budget
    # without hysteresis the collapse's nudge under 0.8 is the end of it
    # (the ledger off: what it holds of each collapse is not what this measures)
    off = LedgerSettings(enabled=False)
    plain = written.model_copy(update={"hysteresis": False, "ledger": off})
    nudged = run(msgs, build_pipeline(plain), facts)
    assert 0.5 * nudged.report.budget < nudged.report.tokens_after < 0.8 * nudged.report.budget


# ------------------------------ the seeds' configurations with the proxy's additions written


def assert_carried_verbatim(
    result: CompactionResult, sent: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The user messages standing alone in ``result`` are the client's own (the same dicts,
    in the order they were said) and together fit ``carry_user_messages`` of the budget."""
    _, carried = split_turns(result.messages)
    said = [m for m in sent if m["role"] == "user"]
    assert all(any(m is s for s in said) for m in carried)
    assert carried == [m for m in said if any(m is c for c in carried)]
    share = ADDITIONS["carry_user_messages"]
    assert sum(TOK.count_message(m) for m in carried) <= share * result.report.budget
    return carried


def test_the_seeds_dotnet_pipeline_compacts_as_documented_with_the_additions_written() -> None:
    """The churn cut and the carried user messages written (0.02, 0.15): every child still fires
    by its trigger, the summary reaches the model, the window keeps 4 real turns although
    dropping the others saves less than the minimum, and the user's own words stay beside."""
    pipeline = dotnet_pipeline(ADDITIONS)
    assert (pipeline.min_saving, pipeline.carry_user_share) == (0.02, 0.15)
    msgs = shopping(30)
    summarizer = FakeSummarizer()
    result = run(msgs, pipeline, summarizer=summarizer)
    report = result.report
    minimum = math.ceil(pipeline.min_saving * report.budget)
    collapse, summarization, window, truncation = report.strategies
    assert collapse.fired  # over 0x200 tokens; it saves less than the minimum, so undone
    assert not collapse.changed and collapse.tokens_before - collapse.tokens_after < minimum
    assert summarization.fired and summarization.changed and len(summarizer.calls) == 1
    assert window.skipped == "trigger" and truncation.skipped == "trigger"
    assert str(result.messages[1]["content"]).startswith("<summary>")  # paid for, forwarded
    assert not report.unforwarded and "summarization" in report.changed_by
    turns, _ = split_turns(result.messages)
    assert turns == [f"turn {i}: what's the price of item {i}?" for i in (28, 29)]
    assert len(assert_carried_verbatim(result, msgs)) == 28  # every folded question
    # five turns later the window's trigger fires: it drops 3 turns, under the minimum saving
    grown = more_turns(result.messages, 30, 5)
    later = run(grown, pipeline, summarizer=summarizer)
    window = later.report.strategies[2]
    assert window.fired and window.changed
    assert window.tokens_before - window.tokens_after < minimum  # kept: the turn count asked
    turns, _ = split_turns(later.messages)
    assert turns == [f"turn {i}: what's the price of item {i}?" for i in (31, 32, 33, 34)]
    assert later.messages[1] is result.messages[1]  # the summary stays before them
    assert_carried_verbatim(later, grown)
    assert len(summarizer.calls) == 1
    again = run(later.messages, pipeline, summarizer=summarizer)
    assert not again.changed and len(summarizer.calls) == 1


def test_a_nested_plain_pipeline_holds_its_window_with_the_additions_written() -> None:
    """The window of 2 turns holds on real turns; the folded turns' questions stay verbatim."""
    msgs = shopping(10)
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {
                    "strategy": "pipeline",
                    "strategies": [{"strategy": "sliding_window", "trigger": {"turns_exceed": 2}}],
                }
            ],
            **ADDITIONS,
        }
    )
    result = run(msgs, build_pipeline(settings), ModelFacts(100 * TOK.count_messages(msgs), 0))
    (nested,) = result.report.strategies
    (window,) = nested.children
    assert window.fired and window.changed  # saves far under 2 % of this budget: kept
    turns, _ = split_turns(result.messages)
    assert turns == [f"turn {i}: what's the price of item {i}?" for i in (8, 9)]
    assert len(assert_carried_verbatim(result, msgs)) == 8


def test_an_undone_collapse_is_no_change_to_the_token_budget_composition() -> None:
    """``early_stop: true`` over the .NET entries with the additions written: the collapse saves
    less than the minimum and is undone, so nothing has changed the request yet and
    summarization runs by its trigger; after it the budget holds and the rest are skipped."""
    pipeline = dotnet_pipeline({"early_stop": True, **ADDITIONS})
    summarizer = FakeSummarizer()
    result = run(shopping(30), pipeline, summarizer=summarizer)
    collapse, summarization, *rest = result.report.strategies
    assert collapse.fired and not collapse.changed
    assert any("under the minimum" in n for n in collapse.notes)
    assert summarization.changed and len(summarizer.calls) == 1
    assert [r.skipped for r in rest] == ["early_stop"] * 2
    assert str(result.messages[1]["content"]).startswith("<summary>")
