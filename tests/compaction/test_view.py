from __future__ import annotations

import copy

from compaction_proxy.compaction import CharacterEstimatorTokenizer, build_view
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.view import GroupKind, SummaryMarker

from .helpers import a, call, dev, fcall, fresult, s, tool, u

TOK = CharacterEstimatorTokenizer()


def kinds(view):
    return [(g.kind.value, g.members) for g in view.groups]


def test_basic_groups_and_turns() -> None:
    view = build_view([s(), u("q1"), a("a1"), u("q2"), a("a2"), u("q3")], TOK)
    assert kinds(view) == [
        ("system", (0,)),
        ("user", (1,)),
        ("assistant_text", (2,)),
        ("user", (3,)),
        ("assistant_text", (4,)),
        ("user", (5,)),
    ]
    # .NET vector: turns for [S,Q1,A1,Q2,A2,Q3] -> null,1,1,2,2,3
    assert [g.turn for g in view.groups] == [None, 1, 1, 2, 2, 3]
    assert view.turn_count == 3
    assert view.tail_start == 5


def test_groups_before_first_user_are_turn_zero_and_developer_is_system() -> None:
    view = build_view([dev(), a("Welcome"), u("q"), a("r")], TOK)
    assert [g.kind for g in view.groups] == [
        GroupKind.SYSTEM,
        GroupKind.ASSISTANT_TEXT,
        GroupKind.USER,
        GroupKind.ASSISTANT_TEXT,
    ]
    assert [g.turn for g in view.groups] == [None, 0, 1, 1]


def test_tool_call_and_result_are_atomic() -> None:
    # AF: [u, call c1, tool c1, a] -> messages 1 and 2 share a group
    view = build_view([u(), call("c1"), tool("c1"), a()], TOK)
    assert kinds(view) == [("user", (0,)), ("tool_call", (1, 2)), ("assistant_text", (3,))]


def test_parallel_calls_form_one_group() -> None:
    view = build_view([u(), call("c1", "c2"), tool("c1"), tool("c2"), u("next")], TOK)
    assert kinds(view)[1] == ("tool_call", (1, 2, 3))


def test_non_adjacent_result_joins_its_call_group() -> None:
    # AF: [u, call c1, asst "approval", tool c1]: the tool joins c1, "approval" separate.
    view = build_view([u(), call("c1"), a("approval"), tool("c1")], TOK)
    assert kinds(view) == [("user", (0,)), ("tool_call", (1, 3)), ("assistant_text", (2,))]
    assert view.group_of == (0, 1, 2, 1)


def test_result_before_declaration_is_an_orphan() -> None:
    view = build_view([u(), tool("c1"), call("c1"), tool("c1")], TOK)
    assert kinds(view) == [("user", (0, 1)), ("tool_call", (2, 3))]


def test_orphans_attach_to_previous_group_or_stand_alone_after_system() -> None:
    view = build_view([s(), tool("x"), tool("y"), u(), a(), tool("z")], TOK)
    assert kinds(view) == [
        ("system", (0,)),
        ("assistant_text", (1, 2)),
        ("user", (3,)),
        ("assistant_text", (4, 5)),
    ]
    first = build_view([tool("x"), u()], TOK)
    assert kinds(first) == [("assistant_text", (0,)), ("user", (1,))]


def test_reused_call_id_after_answer_pairs_with_the_new_call() -> None:
    view = build_view([u(), call("c1"), tool("c1"), u(), call("c1"), tool("c1")], TOK)
    assert kinds(view)[1] == ("tool_call", (1, 2))
    assert kinds(view)[3] == ("tool_call", (4, 5))


def test_duplicate_result_is_orphan() -> None:
    view = build_view([u(), call("c1"), tool("c1"), tool("c1")], TOK)
    assert kinds(view)[1] == ("tool_call", (1, 2, 3))  # orphan attached to the previous group


def test_legacy_function_call_answered_by_name_latest_first() -> None:
    msgs = [
        u(),
        fcall("f"),
        fcall("f"),
        fresult("f", "second"),
        fresult("f", "first"),
        fresult("g", "orphan"),
    ]
    view = build_view(msgs, TOK)
    # the unanswered "g" result is an orphan: it joins the group of the message before it
    assert kinds(view) == [("user", (0,)), ("tool_call", (1, 4, 5)), ("tool_call", (2, 3))]


def test_empty_tool_calls_list_is_assistant_text() -> None:
    view = build_view([u(), {"role": "assistant", "content": "x", "tool_calls": []}], TOK)
    assert view.groups[1].kind is GroupKind.ASSISTANT_TEXT


def test_unknown_role_is_assistant_text() -> None:
    view = build_view([u(), {"role": "critic", "content": "x"}], TOK)
    assert view.groups[1].kind is GroupKind.ASSISTANT_TEXT


def test_summary_marker_recognised_but_never_for_newest_user() -> None:
    summary = {"role": "user", "content": "<summary>\nearlier\n</summary>"}
    view = build_view([s(), summary, u("q"), a()], TOK)
    assert view.groups[1].kind is GroupKind.SUMMARY
    assert view.groups[1].turn == 0
    last = build_view([s(), {"role": "user", "content": "<summary> pasted"}], TOK)
    assert last.groups[1].kind is GroupKind.USER
    sys_summary = {"role": "system", "content": "<summary>x"}
    assert build_view([sys_summary, u()], TOK).groups[0].kind is GroupKind.SYSTEM
    marker = SummaryMarker(roles=frozenset({"system"}))
    assert (
        build_view([sys_summary, u()], TOK, summary_marker=marker).groups[0].kind
        is GroupKind.SUMMARY
    )


def test_stats_bytes_tokens_and_no_mutation() -> None:
    msgs = [
        s(),
        u("hello"),
        call("c1"),
        tool("c1", "r" * 40),
        {"role": "user", "content": "x", "extra": {"k": 1}},
    ]
    before = copy.deepcopy(msgs)
    view = build_view(msgs, TOK)
    assert msgs == before
    assert all(view.messages[i] is msgs[i] for i in range(len(msgs)))
    group = view.groups[2]
    assert group.message_count == 2
    assert group.byte_count == len(canonical_bytes(msgs[2])) + len(canonical_bytes(msgs[3]))
    assert group.token_count == TOK.count_message(msgs[2]) + TOK.count_message(msgs[3])


def test_protection_covers_system_and_groups_reaching_the_newest_turn() -> None:
    # call before the last user message, its result after it: the group is protected
    view = build_view([s(), u(), call("c1"), u("last"), tool("c1")], TOK)
    assert [view.is_protected(g) for g in view.groups] == [True, False, True, True]
    no_user = build_view([s(), a("1"), a("2")], TOK)
    assert [no_user.is_protected(g) for g in no_user.groups] == [True, False, True]
