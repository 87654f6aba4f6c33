"""The summarization strategy: selection, rolling update, placement, failures, async pipeline."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionSettings,
    Mode,
    ModelFacts,
    Pipeline,
    SummarizationSettings,
    SummaryError,
    build_pipeline,
    build_view,
    compact,
)
from compaction_proxy.compaction.budget import compute_budget
from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies import (
    PipelineStrategy,
    StrategyContext,
    SummarizationStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.strategies.composite import run_strategy
from compaction_proxy.compaction.strategies.summarization import (
    CHECKPOINT_NOTE,
    unwrap_summary,
    wrap_summary,
)
from compaction_proxy.compaction.summarizer_contract import CUT_MARK
from compaction_proxy.compaction.triggers import Always, TokenRatio

from .helpers import a, call, contents, s, tool, u
from .summarizer_fakes import BIG, TOK, FakeSummarizer, failing, run_async

ALWAYS = Always()
PAD = " " + "p" * 300  # big enough that a summary with its note is shorter than the stretch


def U(label: str) -> dict[str, Any]:
    return u(label + PAD)


def A(label: str) -> dict[str, Any]:
    return a(label + PAD)


def checkpoint(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": wrap_summary(text)}


def is_summary(message: Any, role: str = "user") -> bool:
    return message["role"] == role and message["content"].startswith("<summary>\n")


def facts_for(messages: list[dict[str, Any]], ratio: float) -> ModelFacts:
    """A model whose budget makes ``messages`` fill ``ratio`` of it."""
    return ModelFacts(context_window=int(TOK.count_messages(messages) / ratio), max_output_tokens=0)


# ------------------------------------------------------------------ wrapper


def test_wrapper_round_trips_exactly() -> None:
    for text in ["x", "line 1\n\nline 2\n", "  spaced  ", "has </summary> inside"]:
        content = wrap_summary(text)
        assert content == f"<summary>\n{text}\n</summary>\n\n{CHECKPOINT_NOTE}"
        assert unwrap_summary(content) == text
    # another tool's (or an older version's) wrapper
    assert unwrap_summary("<summary>\nold notes\n</summary>\n\nsomething else") == "old notes"
    assert unwrap_summary("<summary>bare") == "bare"


# ------------------------------------------------------------------ turn selection


async def test_folds_everything_before_the_last_two_turns() -> None:
    msgs = [
        s(),
        U("u1"),
        A("a1"),
        U("u2"),
        call("c1", "c2"),
        tool("c1"),
        tool("c2"),
        U("u3"),
        A("a3"),
        U("u4"),
        A("a4"),
    ]
    fake = FakeSummarizer("the gist")
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, fake)
    assert result.changed
    (request,) = fake.calls
    assert list(request.messages) == msgs[1:7]
    assert all(x is y for x, y in zip(request.messages, msgs[1:7], strict=True))
    assert request.previous_summary is None
    assert request.model == "test-model"
    out = result.messages
    assert out[0] is msgs[0]
    assert out[1] == {"role": "user", "content": wrap_summary("the gist")}
    assert all(x is y for x, y in zip(out[2:], msgs[7:], strict=True))
    (report,) = result.report.strategies
    assert report.changed and not report.failed and result.report.failures == ()
    assert report.notes and "summarized 6 message(s)" in report.notes[0]


async def test_a_late_result_moves_the_cut_to_an_earlier_turn() -> None:
    # c2's result arrives after u2: the call's group spans turns 1 and 2, so no cut at u2
    msgs = [s(), U("u1"), call("c1", "c2"), tool("c1"), U("u2"), tool("c2"), A("a2"), U("u3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(retain_turns=2, trigger=ALWAYS), msgs, fake)
    assert not result.changed and fake.calls == []  # the only clean cut is u1: nothing before
    result = await run_async(SummarizationStrategy(retain_turns=1, trigger=ALWAYS), msgs, fake)
    assert [m["role"] for m in fake.calls[0].messages] == [
        "user",
        "assistant",
        "tool",
        "user",
        "tool",
        "assistant",
    ]
    assert is_summary(result.messages[1]) and result.messages[2:] == [msgs[-1]]


async def test_a_result_inside_the_newest_turn_keeps_its_call() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), call("c1"), U("u3"), tool("c1")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(retain_turns=1, trigger=ALWAYS), msgs, fake)
    assert fake.calls[0].messages == (msgs[1], msgs[2])
    assert contents(result.messages[2:]) == contents(msgs[3:])


async def test_parallel_calls_are_never_split() -> None:
    msgs = [s(), U("u1"), call("c1", "c2", "c3"), tool("c1"), tool("c2"), tool("c3")]
    msgs += [A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, fake)
    sent = fake.calls[0].messages
    assert sent == tuple(msgs[1:7])
    ids = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert ids == []


async def test_retain_tokens_keeps_fewer_whole_turns_but_never_the_newest_one() -> None:
    big = "x" * 400
    msgs = [s(), U("u1"), a(big), U("u2"), a(big), U("u3"), a(big), U("u4"), a(big + big)]
    fake = FakeSummarizer()
    result = await run_async(
        SummarizationStrategy(retain_turns=3, retain_tokens=200, trigger=ALWAYS), msgs, fake
    )
    # u4's turn alone exceeds 200 tokens: it is kept anyway, u2 and u3 are folded
    assert len(fake.calls[0].messages) == 6
    assert all(x is y for x, y in zip(result.messages[2:], msgs[7:], strict=True))
    fake = FakeSummarizer()
    await run_async(
        SummarizationStrategy(retain_turns=3, retain_tokens=500, trigger=ALWAYS), msgs, fake
    )
    assert len(fake.calls[0].messages) == 4  # u3's turn and u4's fit in 500 tokens


async def test_turns_zero_summarizes_everything_but_the_newest_turn() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), call("c9"), tool("c9")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(retain_turns=0, trigger=ALWAYS), msgs, fake)
    assert fake.calls[0].messages == tuple(msgs[1:5])
    assert all(x is y for x, y in zip(result.messages[2:], msgs[5:], strict=True))


@pytest.mark.parametrize(
    "msgs",
    [
        [s(), u("u1"), a("a1"), u("u2"), a("a2"), u("u3")],  # cheaper than an empty checkpoint
        [s(), A("greeting"), A("more"), U("u1")],  # no user message and no summary to fold
        [s(), u("only"), a("one turn")],
        [s(), a("no user at all"), a("still none")],
        [s()],
        [],
        [s(), checkpoint("old"), U("u1"), A("a1")],  # only an earlier summary before the cut
    ],
)
async def test_nothing_to_fold_means_no_call(msgs: list[dict[str, Any]]) -> None:
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(retain_turns=0, trigger=ALWAYS), msgs, fake)
    assert not result.changed and fake.calls == [] and result.report.failures == ()


async def test_mid_conversation_system_messages_stay_in_place_and_are_not_sent() -> None:
    dev = {"role": "developer", "content": "be brief"}
    msgs = [s(), U("u1"), dev, A("a1"), U("u2"), A("a2"), U("u3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, fake)
    assert fake.calls[0].messages == (msgs[1], msgs[3])
    assert result.messages[0] is msgs[0] and is_summary(result.messages[1])
    assert result.messages[2] is dev
    assert all(x is y for x, y in zip(result.messages[3:], msgs[4:], strict=True))


async def test_minimum_preserved_floor() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    fake = FakeSummarizer()
    strategy = SummarizationStrategy(retain_turns=0, minimum_preserved=4, trigger=ALWAYS)
    result = await run_async(strategy, msgs, fake)
    assert fake.calls[0].messages == (msgs[1], msgs[2])  # u2..a3 are the newest 4 groups
    assert result.messages[2:] == msgs[3:]
    fake = FakeSummarizer()
    strategy = SummarizationStrategy(retain_turns=0, minimum_preserved=6, trigger=ALWAYS)
    assert not (await run_async(strategy, msgs, fake)).changed and fake.calls == []


# ------------------------------------------------------------------ Agent Framework shape


async def test_af_shape_target_2_threshold_0() -> None:
    msgs = [U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(target_count=2, threshold=0), msgs, fake)
    assert fake.calls[0].messages == tuple(msgs[:4])
    assert is_summary(result.messages[0])
    assert result.messages[1:] == msgs[4:]


async def test_af_shape_fires_only_above_target_plus_threshold() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(target_count=4, threshold=2), msgs, fake)
    assert not result.changed and fake.calls == []  # 6 non-system messages, not > 6
    report = result.report.strategies[0]
    assert report.skipped == "trigger"
    result = await run_async(
        SummarizationStrategy(target_count=4, threshold=1), msgs, FakeSummarizer()
    )
    assert result.messages[2:] == msgs[3:]  # keep the newest groups holding >= 4 messages


async def test_af_shape_keeps_the_newest_turn_where_the_agent_framework_folds_it() -> None:
    # Agent Framework: [summary, call, tool, tool].  Invariant 4 keeps u2 (the newest turn).
    msgs = [U("u1"), A("a1"), U("u2"), call("c1", "c2"), tool("c1"), tool("c2")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(target_count=2, threshold=0), msgs, fake)
    assert fake.calls[0].messages == (msgs[0], msgs[1])
    assert is_summary(result.messages[0]) and result.messages[1:] == msgs[2:]


async def test_af_shape_cuts_at_group_boundaries_inside_a_turn() -> None:
    msgs = [U("u1"), A("a1"), U("u2"), call("c1", "c2"), tool("c1"), tool("c2"), U("u3")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(target_count=2, threshold=0), msgs, fake)
    assert fake.calls[0].messages == tuple(msgs[:3])
    assert is_summary(result.messages[0])
    assert all(x is y for x, y in zip(result.messages[1:], msgs[3:], strict=True))


# ------------------------------------------------------------------ rolling update


async def test_rolling_update_passes_the_previous_text_and_replaces_the_old_summary() -> None:
    old = checkpoint("what happened before\nwith two lines")
    msgs = [s(), old, U("u2"), A("a2"), U("u3"), A("a3"), U("u4"), A("a4")]
    fake = FakeSummarizer("merged")
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, fake)
    (request,) = fake.calls
    assert request.previous_summary == "what happened before\nwith two lines"
    assert request.messages == (msgs[2], msgs[3])
    assert result.messages[1] == checkpoint("merged")
    assert sum(is_summary(m) for m in result.messages) == 1
    assert result.messages[2:] == msgs[4:]
    assert "updated the summary" in result.report.strategies[0].notes[0]


async def test_assistant_summary_is_recognised_too() -> None:
    msgs = [s(), checkpoint("earlier", "assistant"), U("u2"), A("a2"), U("u3"), U("u4")]
    fake = FakeSummarizer()
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, fake)
    assert fake.calls[0].previous_summary == "earlier"
    assert sum(m["content"].startswith("<summary>") for m in result.messages) == 1


async def test_a_cut_summary_is_warned_and_its_mark_is_not_folded_into_the_next() -> None:
    """A summary kept from a reply cut at its limit ends with the core's mark: the report warns
    (the model reads the mark too), and the next update is given the summary without it."""
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    cut = f"## Goal\nShip it.\n\n{CUT_MARK}"
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, FakeSummarizer(cut))
    assert result.messages[1]["content"] == wrap_summary(cut)
    assert any("summary cut at its length limit" in w for w in result.report.warnings)
    fake = FakeSummarizer("whole")
    again = await run_async(
        SummarizationStrategy(trigger=ALWAYS), [*result.messages, U("u4"), A("a4"), U("u5")], fake
    )
    assert fake.calls[0].previous_summary == "## Goal\nShip it."
    assert not any("summary cut" in w for w in again.report.warnings)


# ------------------------------------------------------------------ placement


@pytest.mark.parametrize("placement", ["user", "assistant", "system"])
async def test_placement_sets_the_role_and_the_view_recognises_it(placement: str) -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    strategy = SummarizationStrategy(trigger=ALWAYS, placement=placement)  # type: ignore[arg-type]
    result = await run_async(strategy, msgs, FakeSummarizer("gist"))
    assert result.messages[1] == {"role": placement, "content": wrap_summary("gist")}
    # a later turn: the checkpoint is found again and updated (rolling), never duplicated
    later = [*result.messages, U("u4"), A("a4"), U("u5")]
    fake = FakeSummarizer("gist 2")
    again = await run_async(strategy, later, fake)
    assert fake.calls[0].previous_summary == "gist"
    assert again.messages[1] == {"role": placement, "content": wrap_summary("gist 2")}
    assert sum(m["content"].startswith("<summary>") for m in again.messages) == 1


def test_system_role_summaries_are_recognised_only_when_configured() -> None:
    assert Pipeline((SummarizationStrategy(),)).marker().roles == {"user", "assistant"}
    system = SummarizationStrategy(placement="system")
    assert "system" in Pipeline((system,)).marker().roles
    nested = PipelineStrategy([TruncationStrategy(), system])
    assert "system" in Pipeline((nested,)).marker().roles
    settings = SummarizationSettings.model_validate({"placement": "system"})
    assert "system" in build_pipeline(CompactionSettings(), settings).marker().roles
    assert "system" not in build_pipeline(CompactionSettings()).marker().roles


# ------------------------------------------------------------------ failures


def over_budget_conversation() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [s("system prompt")]
    for i in range(6):
        msgs += [u(f"question {i} " + "q" * 200), a(f"answer {i} " + "a" * 200)]
    return msgs


@pytest.mark.parametrize(
    "reason", ["timeout", "error", "empty", "oversized", "not_shorter", "backoff"]
)
async def test_summary_error_changes_nothing_and_truncation_takes_over(reason: str) -> None:
    msgs = over_budget_conversation()
    facts = facts_for(msgs, 1.5)
    pipeline = (SummarizationStrategy(), TruncationStrategy())
    result = await run_async(pipeline, msgs, failing(reason, "it broke"), facts=facts)
    summ, trunc = result.report.strategies
    assert summ.fired and not summ.changed and summ.failed == reason
    assert summ.failure_message == "it broke"
    assert summ.groups_affected == summ.messages_affected == 0
    assert trunc.changed
    assert not any(m["content"].startswith("<summary>") for m in result.messages)
    assert all(any(o is m for m in msgs) for o in result.messages)  # only originals
    assert result.report.failures == (("summarization", reason, "it broke"),)
    assert f"summarization failed ({reason}): it broke; fell back to truncation" in (
        result.report.warnings
    )
    assert result.report.tokens_after <= result.report.budget
    assert result.report.to_dict()["failures"] == [
        {"strategy": "summarization", "reason": reason, "message": "it broke"}
    ]


async def test_a_summary_that_is_not_shorter_is_a_failure() -> None:
    msgs = [s(), U("u1"), A("a1"), u("u2"), u("u3")]
    result = await run_async(
        SummarizationStrategy(trigger=ALWAYS), msgs, FakeSummarizer("much longer " * 100)
    )
    assert not result.changed
    (failure,) = result.report.failures
    assert failure.reason == "not_shorter" and "not shorter" in failure.message
    assert result.report.warnings[-1].endswith(
        "fell back to nothing (no later strategy changed the request)"
    )


@pytest.mark.parametrize("reply", ["", "   \n "])
async def test_an_empty_summary_is_a_failure(reply: str) -> None:
    msgs = over_budget_conversation()
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), msgs, FakeSummarizer(reply))
    assert not result.changed and result.report.failures[0].reason == "empty"


async def test_any_other_exception_counts_as_error_but_cancellation_propagates() -> None:
    import asyncio

    msgs = over_budget_conversation()
    result = await run_async(
        SummarizationStrategy(trigger=ALWAYS), msgs, FakeSummarizer(error=KeyError("boom"))
    )
    assert not result.changed
    assert result.report.failures[0].reason == "error"
    assert "KeyError" in result.report.failures[0].message
    with pytest.raises(asyncio.CancelledError):
        await run_async(
            SummarizationStrategy(trigger=ALWAYS),
            msgs,
            FakeSummarizer(error=asyncio.CancelledError()),
        )


async def test_failures_inside_a_nested_pipeline_are_reported() -> None:
    msgs = over_budget_conversation()
    nested = PipelineStrategy([SummarizationStrategy(), TruncationStrategy()])
    result = await run_async(nested, msgs, failing("timeout"), facts=facts_for(msgs, 1.5))
    assert [(f.strategy, f.reason) for f in result.report.failures] == [
        ("summarization", "timeout")
    ]
    assert any("fell back to truncation" in w for w in result.report.warnings)
    # and a nested summarization does call the summarizer when it works
    fake = FakeSummarizer()
    result = await run_async(nested, msgs, fake, facts=facts_for(msgs, 1.5))
    assert len(fake.calls) == 1 and is_summary(result.messages[1])


def test_summary_error_shape() -> None:
    error = SummaryError("timeout", "after 30s")
    assert (error.reason, error.message) == ("timeout", "after 30s")
    assert isinstance(error, Exception)


# ------------------------------------------------------------------ no summarizer


async def test_without_a_summarizer_it_skips_with_a_note() -> None:
    msgs = over_budget_conversation()
    facts = facts_for(msgs, 1.5)
    for result in (
        await run_async((SummarizationStrategy(), TruncationStrategy()), msgs, None, facts=facts),
        compact(
            CompactionRequest(
                msgs,
                model="m",
                pipeline=Pipeline((SummarizationStrategy(), TruncationStrategy()), fallback=False),
                tokenizer=TOK,
                facts=facts,
                reserve_ratio=0,
            )
        ),
    ):
        summ, trunc = result.report.strategies
        assert summ.fired and not summ.changed and not summ.failed
        assert any("summarizer not available" in note for note in summ.notes)
        assert trunc.changed and result.report.failures == ()
        assert result.report.tokens_after <= result.report.budget


def test_sync_run_strategy_never_calls_the_summarizer() -> None:
    msgs = over_budget_conversation()
    fake = FakeSummarizer()
    view = build_view(msgs, TOK)
    draft = Draft(view, tokenizer=TOK, budget=compute_budget(BIG), tools_tokens=0)
    ctx = StrategyContext(summarizer=fake, model="m")
    report = run_strategy(SummarizationStrategy(trigger=ALWAYS), draft, ctx)
    assert fake.calls == [] and not report.changed
    assert "summarizer not available" in report.notes[0]


# ------------------------------------------------------------------ idempotence


async def test_compacting_the_output_again_does_nothing() -> None:
    msgs = over_budget_conversation()
    facts = facts_for(msgs, 0.85)
    pipeline = build_pipeline(CompactionSettings())
    fake = FakeSummarizer()
    first = await _compact(msgs, pipeline, facts, fake)
    assert first.changed and len(fake.calls) == 1
    assert first.report.changed_by == ("summarization",)
    assert first.report.tokens_after <= 0.5 * first.report.budget
    second = await _compact(first.messages, pipeline, facts, fake)
    assert not second.changed and len(fake.calls) == 1


async def _compact(msgs: list[dict[str, Any]], pipeline: Pipeline, facts: ModelFacts, fake: Any):
    from compaction_proxy.compaction import CompactionRequest, compact_async

    return await compact_async(
        CompactionRequest(
            msgs, model="m", pipeline=pipeline, tokenizer=TOK, facts=facts, reserve_ratio=0
        ),
        summarizer=fake,
    )


async def test_default_pipeline_runs_summarization_before_truncation() -> None:
    msgs = over_budget_conversation()
    facts = facts_for(msgs, 0.9)
    fake = FakeSummarizer()
    result = await _compact(msgs, build_pipeline(CompactionSettings()), facts, fake)
    names = [r.name for r in result.report.strategies]
    assert names == ["context_pruning", "tool_result_compaction", "summarization", "truncation"]
    assert result.report.strategies[2].changed
    assert result.report.strategies[3].skipped == "early_stop"
    assert result.messages[0] is msgs[0] and is_summary(result.messages[1])
    # The folded turns' questions stay verbatim beside the summary, in order, newest first
    # while they fit the carried share of the budget; they stay, so reaching the target takes
    # folding every answer but the newest turn's (rather than truncation dropping two of them
    # unsummarized).
    assert all(x is y for x, y in zip(result.messages[-2:], msgs[-2:], strict=True))
    carried = result.messages[2:-2]
    assert carried and all(m["role"] == "user" and any(m is o for o in msgs) for m in carried)
    assert carried == [m for m in msgs[1:-2] if m["role"] == "user"][-len(carried) :]
    assert result.report.tokens_after <= 0.5 * result.report.budget


# ------------------------------------------------------------------ settings


def test_settings_placement_and_entries() -> None:
    assert SummarizationSettings().placement == "user"
    assistant = SummarizationSettings.model_validate({"placement": "assistant"})
    assert assistant.placement == "assistant"
    with pytest.raises(ValidationError) as info:
        SummarizationSettings.model_validate({"placement": "tool"})
    assert info.value.errors()[0]["loc"] == ("placement",)
    block = SummarizationSettings.model_validate(
        {"retainRecent": {"turns": 3, "tokens": 900}, "placement": "assistant"}
    )
    (strategy,) = [
        x
        for x in build_pipeline(CompactionSettings(), block).strategies
        if isinstance(x, SummarizationStrategy)
    ]
    assert (strategy.retain_turns, strategy.retain_tokens, strategy.placement) == (
        3,
        900,
        "assistant",
    )
    assert strategy.trigger == TokenRatio(0.8) and strategy.target == TokenRatio(0.5)
    assert not strategy.by_groups
    off = SummarizationSettings.model_validate({"enabled": False})
    assert "summarization" not in [
        x.name for x in build_pipeline(CompactionSettings(), off).strategies
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"target_count": 2, "threshold": 0}, (2, 0)),
        ({"target_count": 3}, (3, 2)),
        ({"threshold": 1}, (4, 1)),
        ({"threshold": None}, (4, 0)),
        ({}, (None, 0)),
    ],
)
def test_af_entry_parameters(entry: dict[str, Any], expected: tuple[Any, int]) -> None:
    settings = CompactionSettings.model_validate(
        {"pipeline": [{"strategy": "summarization", "minimum_preserved": 2, **entry}]}
    )
    (strategy,) = build_pipeline(settings).strategies
    assert isinstance(strategy, SummarizationStrategy)
    assert (strategy.target_count, strategy.threshold) == expected
    assert strategy.minimum_preserved == 2


def test_entry_rejects_both_shapes_and_bad_values() -> None:
    with pytest.raises(ValidationError, match="not both"):
        CompactionSettings.model_validate(
            {
                "pipeline": [
                    {"strategy": "summarization", "target_count": 2, "retain_recent": {"turns": 1}}
                ]
            }
        )
    for bad in ({"placement": "tool"}, {"target_count": 0}, {"retain_recent": {"turns": 21}}):
        with pytest.raises(ValidationError):
            CompactionSettings.model_validate({"pipeline": [{"strategy": "summarization", **bad}]})
    with pytest.raises(ValueError):
        SummarizationStrategy(placement="tool")  # type: ignore[arg-type]


# ------------------------------------------------------------------ agent loops (in-turn)


def step(n: int, size: int = 300) -> list[dict[str, Any]]:
    """One agent step: a call and its (large) result."""
    return [call(f"c{n}"), tool(f"c{n}", f"result {n} " + "r" * size)]


def loop(steps: int) -> list[dict[str, Any]]:
    msgs = [s(), u("fix the failing tests")]
    for n in range(steps):
        msgs += step(n)
    return msgs


async def test_an_agent_loop_folds_its_older_steps_after_the_task() -> None:
    msgs = loop(6)
    fake = FakeSummarizer("progress: steps 0-3 done")
    result = await run_async(SummarizationStrategy(retain_turns=2, trigger=ALWAYS), msgs, fake)
    assert result.changed
    (request,) = fake.calls
    assert list(request.messages) == msgs[2:10]  # steps 0-3; the task is not folded
    out = result.messages
    assert out[0] is msgs[0] and out[1] is msgs[1]  # system, then the task first
    assert out[2] == {"role": "user", "content": wrap_summary("progress: steps 0-3 done")}
    assert all(x is y for x, y in zip(out[3:], msgs[10:], strict=True))  # the last two steps
    assert len(out) == 7


async def test_an_in_turn_summary_is_rolled_forward_not_stacked() -> None:
    first = (
        await run_async(SummarizationStrategy(trigger=ALWAYS), loop(6), FakeSummarizer())
    ).messages
    grown = first + step(6) + step(7) + step(8)
    fake = FakeSummarizer("progress: steps 0-6 done")
    result = await run_async(SummarizationStrategy(trigger=ALWAYS), grown, fake)
    (request,) = fake.calls
    assert request.previous_summary == "summary of 8 message(s)"
    assert [m["tool_call_id"] for m in request.messages if m["role"] == "tool"] == [
        "c4",
        "c5",
        "c6",
    ]
    out = result.messages
    assert contents(out[:3]) == [
        "sys",
        "fix the failing tests",
        wrap_summary("progress: steps 0-6 done"),
    ]
    assert sum(1 for m in out if str(m.get("content", "")).startswith("<summary>")) == 1
    assert [m["tool_call_id"] for m in out if m["role"] == "tool"] == ["c7", "c8"]
    # idempotent: nothing more to fold once only the retained steps follow the summary
    again = FakeSummarizer()
    assert not (await run_async(SummarizationStrategy(trigger=ALWAYS), out, again)).changed
    assert again.calls == []


async def test_older_turns_are_folded_into_the_progress_summary_too() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), u("task")]
    for n in range(4):
        msgs += step(n)
    fake = FakeSummarizer("earlier talk and steps 0-1")
    result = await run_async(SummarizationStrategy(retain_turns=2, trigger=ALWAYS), msgs, fake)
    (request,) = fake.calls
    assert [m["role"] for m in request.messages] == ["user", "assistant"] * 2 + [
        "assistant",
        "tool",
    ] * 2
    out = result.messages
    assert contents(out[:3]) == ["sys", "task", wrap_summary("earlier talk and steps 0-1")]
    assert all(x is y for x, y in zip(out[3:], msgs[-4:], strict=True))


async def test_a_short_newest_turn_keeps_the_turn_shape() -> None:
    msgs = [s(), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), *step(0), *step(1)]
    fake = FakeSummarizer("the gist")
    result = await run_async(SummarizationStrategy(retain_turns=2, trigger=ALWAYS), msgs, fake)
    assert list(fake.calls[0].messages) == msgs[1:3]  # only turn 1: turns 2 and 3 are kept
    assert is_summary(result.messages[1])  # after the system block, as before


async def test_retain_tokens_keeps_fewer_steps_but_always_the_newest() -> None:
    msgs = loop(5)
    fake = FakeSummarizer("progress")
    strategy = SummarizationStrategy(retain_turns=3, retain_tokens=1, trigger=ALWAYS)
    result = await run_async(strategy, msgs, fake)
    assert list(fake.calls[0].messages) == msgs[2:10]
    assert result.messages[3:] == msgs[10:]  # only the newest step is kept


async def test_the_group_shape_may_cut_inside_the_newest_turn() -> None:
    msgs = loop(5)
    fake = FakeSummarizer("progress")
    result = await run_async(SummarizationStrategy(target_count=4, trigger=ALWAYS), msgs, fake)
    assert list(fake.calls[0].messages) == msgs[2:8]  # steps 0-2; 4 messages kept
    assert contents(result.messages[:3]) == [
        "sys",
        "fix the failing tests",
        wrap_summary("progress"),
    ]
    assert result.messages[3:] == msgs[8:]


# ------------------------------------------------------------------ stopping at the target
# A fold stops as soon as the estimated result (kept part + one checkpoint of
# ``summary_estimate`` tokens) reaches the target; ``retain_turns`` is the minimum kept.


def targeted(retain_turns: int) -> SummarizationStrategy:
    """The default pipeline's trigger and target (fire at 0.8 of the budget, fold towards 0.5)."""
    return SummarizationStrategy(
        retain_turns=retain_turns, trigger=TokenRatio(0.8), target=TokenRatio(0.5)
    )


def chat(turns: int) -> list[dict[str, Any]]:
    msgs = [s()]
    for n in range(turns):
        msgs += [U(f"u{n}"), A(f"a{n}")]
    return msgs


def estimated(strategy: SummarizationStrategy, folded: list[Any], kept: list[Any]) -> int:
    """The strategy's estimate of the prompt after folding ``folded`` and keeping ``kept``."""
    checkpoint_tokens = TOK.count_message(strategy.summary_message(""))
    text = strategy.summary_estimate(sum(TOK.count_message(m) for m in folded))
    return TOK.count_messages(kept) + checkpoint_tokens + text


async def test_many_turns_fold_everything_before_the_retained_turns() -> None:
    """A summary costs one call whatever it folds, so an event folds what
    retainRecent allows (not the least that just reaches the target, which the next turn or
    two would fire again)."""
    msgs = chat(20)  # 41 messages filling 0.9 of the budget; the target is 0.5
    facts = facts_for(msgs, 0.9)
    strategy = targeted(2)
    fake = FakeSummarizer("the gist")
    result = await run_async(strategy, msgs, fake, facts=facts)
    assert result.changed
    (request,) = fake.calls
    assert list(request.messages) == msgs[1:-4]  # every turn but the two retained, whole
    out = result.messages
    assert out[0] is msgs[0] and is_summary(out[1])
    assert all(x is y for x, y in zip(out[2:], msgs[-4:], strict=True))
    assert result.report.tokens_after < 0.3 * result.report.budget  # far under the target
    # idempotent: the output is under the target, so the trigger does not fire again
    again = FakeSummarizer()
    assert not (await run_async(strategy, out, again, facts=facts)).changed
    assert again.calls == []


async def test_retained_turns_over_the_target_shrink_to_the_newest_turn() -> None:
    """What is kept verbatim shrinks first: when the two retained turns alone miss the target,
    all but the newest turn is folded, rather than a later strategy dropping them unread."""
    msgs = [s(), *chat(6)[1:-4], U("q1 " + "x" * 1500), A("a1 " + "y" * 1500), U("q2"), A("a2")]
    facts = facts_for(msgs, 0.9)
    fake = FakeSummarizer("the gist")
    result = await run_async(targeted(2), msgs, fake, facts=facts)
    (request,) = fake.calls
    assert list(request.messages) == msgs[1:-2]
    assert all(x is y for x, y in zip(result.messages[2:], msgs[-2:], strict=True))
    assert result.report.tokens_after <= 0.5 * result.report.budget


async def test_without_a_reachable_target_the_fold_goes_as_far_as_retention_allows() -> None:
    # The newest turn alone holds more than the target: no cut reaches it, so everything
    # before the retained turns is folded, as before.
    msgs = [*chat(6), U("big " + "b" * 4000), A("reply")]
    facts = facts_for(msgs, 0.9)
    fake = FakeSummarizer("the gist")
    result = await run_async(targeted(1), msgs, fake, facts=facts)
    assert list(fake.calls[0].messages) == msgs[1:-2]
    assert result.messages[2:] == msgs[-2:]


async def test_force_folds_as_far_as_retention_allows() -> None:
    msgs = chat(20)
    facts = facts_for(msgs, 0.9)
    fake = FakeSummarizer("the gist")
    strategy = targeted(2)
    await run_async(strategy, msgs, fake, facts=facts, mode=Mode.FORCE)
    assert list(fake.calls[0].messages) == msgs[1:-4]


async def test_a_long_agent_loop_folds_every_step_but_the_retained_ones() -> None:
    msgs = loop(30)  # 62 messages, one task and 30 steps
    facts = facts_for(msgs, 0.9)
    strategy = targeted(2)
    fake = FakeSummarizer("progress so far")
    result = await run_async(strategy, msgs, fake, facts=facts)
    (request,) = fake.calls
    assert list(request.messages) == msgs[2:-4]  # every step but the two retained, whole
    out = result.messages
    assert out[0] is msgs[0] and out[1] is msgs[1]  # the task stays first
    assert out[2] == {"role": "user", "content": wrap_summary("progress so far")}
    assert all(x is y for x, y in zip(out[3:], msgs[-4:], strict=True))
    assert result.report.tokens_after <= 0.5 * result.report.budget
    again = FakeSummarizer()
    assert not (await run_async(strategy, out, again, facts=facts)).changed
