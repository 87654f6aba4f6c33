"""What the core keeps of a paid summary: pinned and bounded summaries, the fold-more path, what is
reported when a paid summary cannot be forwarded, carried user messages, the minimum saving.

Properties over generated conversations (``test_properties``' generator) check that carrying
user messages and undoing small savings keep invariants 1-4 and 6-8.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CompactionRequest,
    Mode,
    ModelFacts,
    Pipeline,
    build_view,
    compact,
    compact_async,
)
from compaction_proxy.compaction.budget import compute_budget
from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies import (
    PipelineStrategy,
    SlidingWindowStrategy,
    Strategy,
    SummarizationStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.strategies.base import StrategyContext, StrategyOutcome
from compaction_proxy.compaction.strategies.summarization import wrap_summary
from compaction_proxy.compaction.triggers import (
    AllOf,
    Always,
    AnyOf,
    Condition,
    GroupsExceed,
    MessagesExceed,
    Metrics,
    OverBudget,
    TokenRatio,
    TokensExceed,
    TurnsExceed,
    count_demands,
)
from compaction_proxy.compaction.view import GroupKind

from .helpers import a, call, s, tool, u
from .summarizer_fakes import TOK, FakeSummarizer, run_async
from .test_properties import check_invariants, conversations, strategies

Msg = dict[str, Any]


def turns(count: int, answer_chars: int = 800, question_chars: int = 40) -> list[Msg]:
    msgs: list[Msg] = [s("system prompt")]
    for n in range(count):
        msgs += [u(f"q{n} " + "q" * question_chars), a(f"a{n} " + "a" * answer_chars)]
    return msgs


def run(
    msgs: list[Msg],
    pipeline: Pipeline,
    window: int,
    mode: Mode = Mode.NORMAL,
) -> Any:
    return compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=pipeline,
            tokenizer=TOK,
            facts=ModelFacts(window, 0),
            reserve_ratio=0,
            mode=mode,
        )
    )


def summary(text: str = "what happened") -> Msg:
    return {"role": "user", "content": wrap_summary(text)}


# ------------------------------------------------------------------ the pinned summary


def test_no_strategy_drops_a_summary_checkpoint() -> None:
    """On main, truncation dropped the summary first: it is the oldest group."""
    msgs = [s(), summary("FACT-1 and all before it"), *turns(6)[1:]]
    window = TOK.count_messages(msgs)  # fits exactly: truncation goes to its target
    strategy = TruncationStrategy(trigger=Always(), target=TokenRatio(0.5))
    result = run(msgs, Pipeline((strategy,)), window)
    assert result.changed
    assert result.messages[1] is msgs[1]
    window_drop = SlidingWindowStrategy(keep_last_groups=2)
    assert run(msgs, Pipeline((window_drop,)), window).messages[1] is msgs[1]


async def test_a_summary_made_in_a_run_is_not_dropped_by_the_strategies_after_it() -> None:
    msgs = turns(8)
    window = int(TOK.count_messages(msgs) / 0.9)
    summarize = SummarizationStrategy(trigger=TokenRatio(0.8), target=TokenRatio(0.5))
    truncate = TruncationStrategy(trigger=Always(), target=TokenRatio(0.05))  # wants it all gone
    result = await run_async(
        (summarize, truncate), msgs, FakeSummarizer("the gist"), facts=ModelFacts(window, 0)
    )
    assert result.messages[1] == summary("the gist")
    assert "summarization" in result.report.changed_by
    assert result.report.unforwarded == ()


# ------------------------------------------------------------------ the bounded summary


async def test_the_summary_is_bounded_by_a_quarter_of_the_budget() -> None:
    msgs = turns(8)
    window = int(TOK.count_messages(msgs) / 0.9)
    fake = FakeSummarizer("short")
    strategy = SummarizationStrategy(trigger=TokenRatio(0.8), target=TokenRatio(0.5))
    await run_async(strategy, msgs, fake, facts=ModelFacts(window, 0))
    overhead = TOK.count_message(summary(""))
    (request,) = fake.calls
    assert request.max_tokens == math.floor(window * 0.25) - overhead


async def test_a_summary_too_big_to_fit_folds_more_with_the_update_prompt() -> None:
    """What is kept verbatim shrinks and the summary is made again (update prompt), rather
    than the summary being dropped."""
    msgs = turns(6)
    window = int(TOK.count_messages(msgs) / 0.9)
    long_text = "L" * (window * 4 // 2)  # half the budget: over its bound, and over budget

    def reply(request: Any) -> str:
        return long_text if request.previous_summary is None else "condensed"

    fake = FakeSummarizer(reply)
    strategy = SummarizationStrategy(
        retain_turns=2, trigger=TokenRatio(0.8), target=TokenRatio(0.5)
    )
    result = await run_async(strategy, msgs, fake, facts=ModelFacts(window, 0))
    first, second = fake.calls
    assert first.previous_summary is None and second.previous_summary == long_text
    assert list(second.messages) == msgs[-4:-2]  # the older retained turn
    assert result.messages[1] == summary("condensed")
    assert result.messages[2:] == msgs[-2:]  # only the newest turn stays verbatim
    assert result.report.tokens_after <= result.report.budget
    notes = result.report.strategies[0].notes
    assert any("folded 2 more group(s)" in n for n in notes), notes


async def test_a_summary_that_cannot_fit_is_reported_as_not_forwarded() -> None:
    """The system prompt and the newest user message leave no room: the summary is the last
    thing released, and the report says it was paid for and not forwarded."""
    system = s("rules " + "r" * 1800)
    task = u("now this " + "t" * 1800)
    msgs = [system, *turns(4)[1:], task]
    window = TOK.count_message(system) + TOK.count_message(task) + TOK.reply_priming + 40
    strategy = SummarizationStrategy(trigger=OverBudget())
    result = await run_async(
        strategy, msgs, FakeSummarizer("a summary of sixty characters or so, " * 3),
        facts=ModelFacts(window, 0), fallback=True,
    )  # fmt: skip
    assert result.messages == [system, task]
    (lost,) = result.report.unforwarded
    assert (lost.strategy, lost.reason) == ("summarization", "discarded")
    assert "summarization" not in result.report.changed_by
    assert any("not forwarded" in w for w in result.report.warnings)
    assert result.report.to_dict()["unforwarded"][0]["reason"] == "discarded"


# ------------------------------------------------------------------ carried user messages


def test_truncation_keeps_the_folded_turns_user_messages_verbatim() -> None:
    msgs = turns(10)
    window = int(TOK.count_messages(msgs) / 1.5)
    pipeline = Pipeline((TruncationStrategy(trigger=OverBudget()),), carry_user_share=0.2)
    result = run(msgs, pipeline, window)
    users = [m for m in msgs if m["role"] == "user"]
    assert [m for m in result.messages if m["role"] == "user"] == users
    assert all(any(o is m for o in result.messages) for m in users)  # the same dicts
    assert result.messages[-1] is msgs[-1] and result.report.tokens_after <= window
    # without the share, truncation takes them with their turns (the anchors' behaviour)
    plain = run(msgs, Pipeline((TruncationStrategy(trigger=OverBudget()),)), window)
    assert len([m for m in plain.messages if m["role"] == "user"]) < len(users)


def test_the_carried_share_takes_the_newest_user_messages_first() -> None:
    msgs = turns(10, question_chars=400)
    window = int(TOK.count_messages(msgs) / 2.5)
    share = 0.1
    pipeline = Pipeline((TruncationStrategy(trigger=OverBudget()),), carry_user_share=share)
    result = run(msgs, pipeline, window)
    users = [m for m in msgs if m["role"] == "user"]
    kept = [m for m in result.messages if m["role"] == "user"]
    older = kept[:-1]
    assert older == users[-1 - len(older) : -1]  # a newest-first run, in order
    carried = expected_carried(msgs, share, window)
    assert carried and all(any(o is m for o in result.messages) for m in carried)
    assert len(older) < len(users) - 1  # the oldest went with their turns
    assert len(carried) < len(users) - 1  # the share holds only the newest of them


def test_a_sliding_window_leaves_the_carried_messages_and_counts_the_turns_gone() -> None:
    msgs = turns(8)
    pipeline = Pipeline((SlidingWindowStrategy(keep_last_turns=2),), carry_user_share=0.2)
    window = TOK.count_messages(msgs) * 2
    result = run(msgs, pipeline, window)
    assistants = [m for m in result.messages if m["role"] == "assistant"]
    assert assistants == [msgs[-3], msgs[-1]]  # the last two turns' answers
    assert len([m for m in result.messages if m["role"] == "user"]) == 8
    assert not run(result.messages, pipeline, window).changed  # carried ones are no turns


def test_carried_messages_are_released_oldest_first_only_for_the_budget() -> None:
    msgs = turns(6, question_chars=400, answer_chars=40)
    newest = TOK.count_messages([msgs[0], *msgs[-2:]]) + TOK.reply_priming
    window = newest + TOK.count_message(msgs[-4]) + 5  # room for one carried question
    # a share the budget cannot hold: two questions pinned, room for one
    pipeline = Pipeline((TruncationStrategy(trigger=OverBudget()),), carry_user_share=0.9)
    result = run(msgs, pipeline, window)
    assert result.messages == [msgs[0], msgs[-4], *msgs[-2:]]
    assert result.report.tokens_after <= window
    assert result.report.fallback is not None
    assert "carried user messages released" in result.report.fallback.notes


# ------------------------------------------------ carried user messages inside an event's target


def event_pipeline(share: float = 0.5) -> Pipeline:
    """Summarization as the default pipeline runs it (fire at 0.8, compact to 0.5), carrying."""
    strategy = SummarizationStrategy(trigger=TokenRatio(0.8), target=TokenRatio(0.5))
    return Pipeline((strategy,), fallback=False, carry_user_share=share)


def summarized(text: str) -> Msg:
    return u(wrap_summary(text))


def run_event(msgs: list[Msg], window: int, summarizer: FakeSummarizer) -> Any:
    request = CompactionRequest(
        msgs,
        model="m",
        pipeline=event_pipeline(),
        tokenizer=TOK,
        facts=ModelFacts(window, 0),
        reserve_ratio=0,
    )
    return asyncio.run(compact_async(request, summarizer=summarizer))


def carried_questions(count: int = 6) -> list[Msg]:
    """User messages standing alone: what is left of turns an earlier summary folded."""
    return [u(f"rule {n}: " + "r" * 300) for n in range(count)]


def test_carried_messages_are_released_before_a_summary_is_paid_for_them() -> None:
    """The request is over the trigger only because of what the carry keeps: the oldest carried
    messages go (their turns are in the summary), no summarizer call is made, and the newest
    stay, verbatim. A summary paid for here would come again as soon as they filled the room."""
    carried = carried_questions()
    msgs = [s(), summarized("older turns"), *carried, u("q"), a("a " + "a" * 1_500), u("newest")]
    window = int(TOK.count_messages(msgs) / 0.85)
    summarizer = FakeSummarizer()
    result = run_event(msgs, window, summarizer)
    (report,) = result.report.strategies
    assert report.changed and not summarizer.calls
    assert any("released" in n and "carried user message(s)" in n for n in report.notes)
    assert result.report.tokens_after <= 0.5 * window
    kept = [m for m in result.messages if m in carried]
    assert kept and kept == carried[-len(kept) :]  # the newest, in order
    assert all(any(m is o for o in result.messages) for m in kept)  # the client's own dicts
    assert result.messages[1] is msgs[1]  # the summary stays
    # without a summary in the request, what they said is nowhere else: none is released
    bare = [s(), *carried, u("q"), a("a " + "a" * 1_500), u("newest")]
    unsummarized = run_event(bare, int(TOK.count_messages(bare) / 0.85), FakeSummarizer())
    assert not any("released" in n for r in unsummarized.report.strategies for n in r.notes)


def test_a_summary_event_folds_the_oldest_carried_messages_when_they_keep_it_over_target() -> None:
    """The turns a summary folds leave too little room beside what the carry keeps: the oldest
    carried messages are folded into the summary too (the summarizer sees them), until the
    event lands on its target, and the newest stay verbatim."""
    carried = carried_questions()
    turns_after = [m for n in range(3) for m in (u(f"q{n}"), a(f"a{n} " + "a" * 800))]
    msgs = [s(), summarized("older turns"), *carried, *turns_after, u("newest")]
    window = int(TOK.count_messages(msgs) / 1.2)
    summarizer = FakeSummarizer()
    result = run_event(msgs, window, summarizer)
    (report,) = result.report.strategies
    assert report.changed and len(summarizer.calls) == 1
    assert any("carried user message(s) folded in too" in n for n in report.notes)
    assert result.report.tokens_after <= 0.5 * window
    shown = summarizer.calls[0].messages
    kept = [m for m in result.messages if m in carried]
    folded = [m for m in carried if m not in kept]
    assert folded and kept and folded + kept == carried  # the oldest went, the newest stay
    assert all(m in shown for m in folded)
    # with room for them all beside the summary (the target: what stays and its estimate), none is
    # folded
    longer = [m for n in range(3) for m in (u(f"q{n}"), a(f"a{n} " + "a" * 2_000))]
    msgs = [s(), summarized("older turns"), *carried, *longer, u("newest")]
    stays = TOK.count_messages([msgs[0], *carried, msgs[-1]]) + 600  # the summary estimate
    roomy = run_event(msgs, 2 * stays, FakeSummarizer())
    assert roomy.report.tokens_before >= 0.8 * 2 * stays  # over the trigger all the same
    assert len(roomy.report.strategies[0].notes) == 1  # a summary, nothing else
    assert all(m in roomy.messages for m in carried)


# ------------------------------------------------------------------ the minimum saving


def test_a_strategy_saving_too_little_leaves_the_prefix_alone() -> None:
    msgs = [s(), u("go"), call("c1"), tool("c1", "x" * 80), a("done"), u("next"), a("ok")]
    window = TOK.count_messages(msgs) * 2  # well within budget
    collapse = ToolResultCompactionStrategy(keep_last_tool_call_groups=0)
    small = run(msgs, Pipeline((collapse,), min_saving=0.05), window)
    assert not small.changed and small.messages == msgs
    (report,) = small.report.strategies
    assert report.fired and not report.changed
    assert any("under the minimum" in n for n in report.notes)
    big = [s(), u("go"), call("c1"), tool("c1", "x" * 8000), a("done"), u("next"), a("ok")]
    assert run(big, Pipeline((collapse,), min_saving=0.05), window).changed
    # over budget, every saving counts
    tight = run(msgs, Pipeline((collapse,), min_saving=0.05, fallback=False), 60)
    assert tight.report.strategies[0].changed


def chit_chat(count: int) -> list[Msg]:
    """``count`` turns of a few tokens each: dropping some saves next to nothing."""
    msgs: list[Msg] = [s()]
    for n in range(count):
        msgs += [u(f"q{n}"), a(f"a{n}")]
    return msgs


def user_texts(messages: list[Msg]) -> list[str]:
    return [str(m["content"]) for m in messages if m["role"] == "user"]


def test_a_window_the_turn_count_demands_takes_effect_however_little_it_saves() -> None:
    """On main the 2 % minimum undid "keep the last 4 turns" whenever the old turns were small."""
    msgs = chit_chat(10)
    window = TOK.count_messages(msgs) * 50  # far from the budget: 2 % of it is the whole chat
    for strategy in (
        SlidingWindowStrategy(trigger=TurnsExceed(4)),
        SlidingWindowStrategy(keep_last_turns=4),
        SlidingWindowStrategy(trigger=AnyOf((TokensExceed(10**6), TurnsExceed(4)))),
        SlidingWindowStrategy(trigger=AllOf((TokensExceed(1), TurnsExceed(4)))),
    ):
        result = run(msgs, Pipeline((strategy,), min_saving=0.02), window)
        assert result.changed and result.report.strategies[0].changed, strategy.trigger
        assert user_texts(result.messages) == ["q6", "q7", "q8", "q9"], strategy.trigger
    groups = run(
        msgs, Pipeline((SlidingWindowStrategy(keep_last_groups=4),), min_saving=0.02), window
    )
    assert user_texts(groups.messages) == ["q8", "q9"]
    by_messages = TruncationStrategy(trigger=MessagesExceed(5))
    truncated = run(msgs, Pipeline((by_messages,), min_saving=0.02), window)
    assert truncated.changed and len(truncated.messages) == 5


def test_a_count_in_the_target_alone_is_held_to_the_minimum() -> None:
    """The trigger decides: a token trigger with a turn target is ordinary, undoable work."""
    msgs = chit_chat(10)
    window = TOK.count_messages(msgs) * 50
    strategy = SlidingWindowStrategy(trigger=TokensExceed(1), target=TurnsExceed(4))
    result = run(msgs, Pipeline((strategy,), min_saving=0.02), window)
    assert not result.changed and result.messages == msgs
    assert any("under the minimum" in n for n in result.report.strategies[0].notes)


def test_count_demands_reads_which_part_of_a_trigger_fired() -> None:
    metrics = Metrics(tokens=100, messages=9, groups=9, turns=5, tool_call_groups=0, budget=1000)
    assert count_demands(TurnsExceed(4), metrics)
    assert count_demands(MessagesExceed(8), metrics) and count_demands(GroupsExceed(8), metrics)
    assert not count_demands(TurnsExceed(5), metrics)  # the count does not fire
    assert not count_demands(TokensExceed(10), metrics)  # fires, but not by a count
    assert count_demands(AnyOf((TokensExceed(10**6), TurnsExceed(4))), metrics)
    assert not count_demands(AnyOf((TokensExceed(10), TurnsExceed(5))), metrics)
    assert count_demands(AllOf((TokensExceed(10), TurnsExceed(4))), metrics)
    assert not count_demands(AllOf((TokensExceed(10**6), TurnsExceed(4))), metrics)


def test_work_over_a_nested_entrys_own_budget_is_not_held_to_the_minimum() -> None:
    """A token-budget entry's N is its composition's budget: over it, a change is due."""
    msgs = [s(), u("go"), call("c1"), tool("c1", "x" * 400), a("done"), u("next"), a("ok")]
    total = TOK.count_messages(msgs) + TOK.reply_priming
    window = total * 50  # 2 % of it is more than the collapse saves
    collapse = ToolResultCompactionStrategy(keep_last_tool_call_groups=0)
    budgeted = PipelineStrategy([collapse], token_budget=total - 5)
    result = run(msgs, Pipeline((budgeted,), min_saving=0.02), window)
    (child,) = result.report.strategies[0].children
    assert child.changed and result.changed
    assert child.tokens_before - child.tokens_after < math.ceil(0.02 * window)
    # the same collapse in a plain entry, under every budget: undone
    plain = run(msgs, Pipeline((PipelineStrategy([collapse]),), min_saving=0.02), window)
    assert not plain.changed


class PaidNote(Strategy):
    """Pays for a note (as a summarizer call would) that saves nothing: adds tokens."""

    name = "paid_note"

    def default_trigger(self) -> Condition:
        return Always()

    def apply(self, draft: Draft, ctx: StrategyContext) -> StrategyOutcome:
        draft.insert_after_system([summary("a paid note")], paid_by=self.name)
        return StrategyOutcome(changed=True)


def test_a_run_that_paid_for_a_message_is_never_undone() -> None:
    msgs = chit_chat(3)
    result = run(msgs, Pipeline((PaidNote(),), min_saving=0.02), TOK.count_messages(msgs) * 50)
    assert result.changed and result.messages[1] == summary("a paid note")
    assert result.report.strategies[0].changed


def test_rollback_returns_the_draft_to_its_savepoint() -> None:
    msgs = turns(5)
    view = build_view(msgs, TOK)
    draft = Draft(view, tokenizer=TOK, budget=compute_budget(ModelFacts(10_000, 0)))
    point = draft.savepoint()
    before = (draft.prompt_tokens, draft.metrics(), draft.project())
    draft.drop(draft.groups[1])
    draft.commit()
    draft.insert_after_system([summary("x")], paid_by="summarization")
    draft.commit()
    assert draft.prompt_tokens != before[0] and draft.paid
    draft.rollback(point)
    assert (draft.prompt_tokens, draft.metrics(), draft.project()) == before
    assert not draft.changed and draft.paid == []
    assert [g.kind for g in draft.groups][:2] == [GroupKind.SYSTEM, GroupKind.USER]


# ------------------------------------------------------------------ properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    strategies(),
    st.integers(30, 3000),
    st.booleans(),
    st.sampled_from([Mode.NORMAL, Mode.FORCE]),
    st.sampled_from([0.1, 0.2, 0.5]),
    st.sampled_from([0.0, 0.02, 0.2]),
)
def test_carrying_and_the_minimum_keep_the_invariants(
    msgs: list[Msg],
    strategy: Any,
    window: int,
    fallback: bool,
    mode: Mode,
    share: float,
    minimum: float,
) -> None:
    pipeline = Pipeline((strategy,), fallback=fallback, carry_user_share=share, min_saving=minimum)
    snapshot = orjson.dumps(msgs)
    result = run(msgs, pipeline, window, mode)
    assert orjson.dumps(msgs) == snapshot
    check_invariants(msgs, result.messages)  # 1-4, every output message an original
    # the carried user messages are there, unless the budget needed them released
    released = result.report.fallback is not None and any(
        "carried user messages released" in n for n in result.report.fallback.notes
    )
    if not released:
        for message in expected_carried(msgs, share, window):
            assert any(o is message for o in result.messages)
    again = run(msgs, pipeline, window, mode)  # 6
    assert orjson.dumps(again.messages) == orjson.dumps(result.messages)
    second = run(result.messages, pipeline, window, mode)  # 7
    assert not second.changed, (second.report.to_dict(), result.report.to_dict())
    report = result.report  # 8
    if fallback and report.tokens_after > report.budget:
        assert report.warnings


def expected_carried(msgs: list[Msg], share: float, window: int) -> list[Msg]:
    """The carried set, computed without the draft: user groups but the newest, newest first,
    while their tokens fit ``share`` of the budget."""
    view = build_view(msgs, TOK)
    users = [g for g in view.groups if g.kind is GroupKind.USER and not view.is_protected(g)]
    limit, total, out = math.floor(share * window), 0, []
    for group in reversed(users):  # a group: the message and any orphan result it took in
        total += group.token_count
        if total > limit:
            break
        out.append(msgs[group.first])
    return out
