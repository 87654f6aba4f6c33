from __future__ import annotations

import pytest

from compaction_proxy.compaction import CharacterEstimatorTokenizer, build_view
from compaction_proxy.compaction.budget import Budget
from compaction_proxy.compaction.draft import Draft, GroupState, ProtectedGroupError
from compaction_proxy.compaction.strategies.summarization import wrap_summary
from compaction_proxy.compaction.view import GroupKind

from .helpers import a, call, contents, s, tool, u

TOK = CharacterEstimatorTokenizer()


def make(messages: list[dict[str, object]], tools_tokens: int = 0) -> Draft:
    return Draft(
        build_view(messages, TOK),
        tokenizer=TOK,
        budget=Budget(10_000, 0, 0),
        tools_tokens=tools_tokens,
    )


def recount(draft: Draft) -> int:
    return sum(TOK.count_message(m) for m in draft.project())


def test_totals_track_every_operation() -> None:
    msgs = [s(), u("q1"), call("c1"), a("between"), tool("c1", "x" * 100), u("q2"), a("r")]
    draft = make(msgs, tools_tokens=7)
    assert draft.prompt_tokens == recount(draft) + 7 + 3
    m = draft.metrics()
    assert (m.messages, m.groups, m.turns, m.tool_call_groups) == (7, 6, 2, 1)

    draft.edit(4, {**draft.message(4), "content": "short"})
    assert draft.message_tokens == recount(draft)
    assert draft.project()[4]["tool_call_id"] == "c1"

    call_group = draft.groups[draft.view.group_of[2]]
    draft.replace(call_group, [a("[Tool results: get_weather: short]")])
    assert draft.message_tokens == recount(draft)
    m = draft.metrics()
    assert (m.messages, m.groups, m.tool_call_groups) == (6, 6, 0)
    # the replacement sits at the group's first position, before "between"
    assert contents(draft.project()) == [
        "sys",
        "q1",
        "[Tool results: get_weather: short]",
        "between",
        "q2",
        "r",
    ]

    draft.drop(draft.groups[1])
    draft.drop(draft.groups[3])
    assert draft.metrics().turns == 2  # the replacement still lives in turn 1
    draft.insert_after_system([u("<summary>\nearlier\n</summary>")])
    assert draft.message_tokens == recount(draft)
    assert contents(draft.project())[:2] == ["sys", "<summary>\nearlier\n</summary>"]
    assert draft.metrics().groups == 5
    assert draft.changed


def test_protected_groups_cannot_be_touched() -> None:
    draft = make([s(), u("q1"), a("a1"), u("q2"), a("a2")])
    with pytest.raises(ProtectedGroupError):
        draft.drop(0)  # system
    with pytest.raises(ProtectedGroupError):
        draft.drop(3)  # newest user
    with pytest.raises(ProtectedGroupError):
        draft.edit(4, a("changed"))  # the newest step
    with pytest.raises(ProtectedGroupError):
        draft.insert(5, [a("x")])  # after the newest step
    draft.drop(1)
    with pytest.raises(ProtectedGroupError):
        draft.drop(1)  # already dropped
    assert draft.state(1) is GroupState.DROPPED
    assert [g.index for g in draft.removable()] == [2]


def test_older_steps_of_the_newest_turn_are_fair_game() -> None:
    msgs = [s(), u("task"), call("c1"), tool("c1"), call("c2"), tool("c2"), call("c3"), tool("c3")]
    draft = make(msgs)
    assert [g.index for g in draft.removable()] == [2, 3]  # the two older steps
    assert draft.view.protected == frozenset({1, 4})  # the task and the newest step
    with pytest.raises(ProtectedGroupError):
        draft.drop(4)
    with pytest.raises(ProtectedGroupError):
        draft.insert(7, [a("x")])  # inside the newest step
    draft.drop(2)
    draft.insert_after_task([u("<summary>\nprogress\n</summary>")])
    assert contents(draft.project()) == [
        "sys",
        "task",
        "<summary>\nprogress\n</summary>",
        None,
        "sunny",
        None,
        "sunny",
    ]


def test_a_progress_summary_after_the_task_is_not_the_newest_user_message() -> None:
    summary = u(wrap_summary("steps 1-40"))
    draft = make([s(), u("task"), summary, call("c1"), tool("c1"), call("c2"), tool("c2")])
    assert draft.view.tail_start == 1
    assert draft.view.groups[2].kind is GroupKind.SUMMARY
    assert [g.index for g in draft.removable()] == [2, 3]


def test_a_client_message_that_only_looks_like_a_summary_stays_the_newest_user_message() -> None:
    pasted = u("<summary>\nnotes I pasted\n</summary>")  # not the proxy's exact wrapper
    draft = make([s(), u("task"), a("ok"), pasted, call("c1"), tool("c1")])
    assert draft.view.tail_start == 3
    assert draft.view.groups[3].kind is GroupKind.USER and draft.is_protected(3)


def test_with_no_user_message_a_summary_is_never_taken_for_one() -> None:
    draft = make([u(wrap_summary("old work")), call("c1"), tool("c1"), call("c2"), tool("c2")])
    assert draft.view.groups[0].kind is GroupKind.SUMMARY
    assert [g.index for g in draft.removable()] == [0, 1]  # the summary and the older step


def test_trim_newest_only_cuts_tool_results() -> None:
    draft = make([s(), u("task"), call("c1"), tool("c1", "x" * 500)])
    with pytest.raises(ProtectedGroupError):
        draft.trim_newest(1, u("shorter"))
    draft.trim_newest(3, {**tool("c1"), "content": "x" * 10})
    assert draft.project()[3]["content"] == "x" * 10


def test_non_contiguous_group_drop_and_project_order() -> None:
    msgs = [u("q"), call("c1"), a("approval"), tool("c1"), u("q2")]
    draft = make(msgs)
    draft.drop(draft.view.group_of[1])
    assert contents(draft.project()) == ["q", "approval", "q2"]


def test_unchanged_projection_returns_the_same_dicts() -> None:
    msgs = [s(), u(), a()]
    draft = make(msgs)
    out = draft.project()
    assert out == msgs and all(x is y for x, y in zip(out, msgs, strict=True))
    assert not draft.changed


def test_commit_regroups_and_keeps_counts() -> None:
    msgs = [s(), u("q1"), call("c1"), tool("c1"), u("q2"), a("r")]
    draft = make(msgs)
    draft.replace(2, [a("[Tool results: sunny]")])
    before = draft.prompt_tokens
    draft.commit()
    assert draft.prompt_tokens == before
    assert [g.kind.value for g in draft.groups] == [
        "system",
        "user",
        "assistant_text",
        "user",
        "assistant_text",
    ]
    assert draft.changed
    assert draft.counters.groups_replaced == 1


def test_overflow_messages_counts_what_must_go() -> None:
    msgs = [s(), u("x" * 400), a("y" * 400), u("q"), a("r")]
    view = build_view(msgs, TOK)
    total = sum(st.token_count for st in view.stats) + 3
    first = view.stats[1].token_count
    draft = Draft(view, tokenizer=TOK, budget=Budget(total - first + 1, 0, 0))
    assert draft.overflow_messages() == 1
    draft_all = Draft(view, tokenizer=TOK, budget=Budget(1, 0, 0))
    assert draft_all.overflow_messages() == 2


@pytest.mark.parametrize("new_role", ["tool", "assistant"])
def test_commit_after_edits_only_matches_a_full_rebuild(new_role: str) -> None:
    msgs = [
        s(),
        u("q1"),
        call("c1", "c2"),
        a("between"),
        tool("c1", "x" * 100),
        tool("c2", "y" * 50),
        u("q2"),
        a("r"),
    ]
    draft = make(msgs)
    edited = {**draft.message(4), "content": "short"}
    if new_role == "assistant":  # an edit that changes grouping takes the full path
        edited = {"role": "assistant", "content": "now text"}
    draft.edit(4, edited)
    draft.commit()
    rebuilt = build_view(draft.project(), TOK)
    assert draft.view.groups == rebuilt.groups
    assert draft.view.group_of == rebuilt.group_of
    assert draft.view.stats == rebuilt.stats
    assert draft.message_tokens == rebuilt.token_count
