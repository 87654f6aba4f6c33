"""Tool-result compaction: the Agent Framework's vectors (research/msaf.md section 5)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction import (
    CompactionRequest,
    CompactionSettings,
    Mode,
    ModelFacts,
    build_pipeline,
    compact_async,
)
from compaction_proxy.compaction.strategies import ToolResultCompactionStrategy
from compaction_proxy.compaction.strategies.tool_result_compaction import (
    MIDDLE_MARKER,
    Label,
    summary_text,
)
from compaction_proxy.compaction.triggers import TokensExceed

from .helpers import Msg, a, call, contents, fcall, fresult, s, tool, u
from .strategy_helpers import run
from .summarizer_fakes import TOK, FakeSummarizer


def weather_and_hotels() -> list[Msg]:
    return [
        s(),
        u("weather in Paris?"),
        call("c1", name="get_weather"),
        tool("c1", '{"temp":12,"condition":"cloudy","wind":"NW 15km/h"}'),
        a("cloudy"),
        u("and Nice, with hotels?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Nice"}'},
                },
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "search_hotels", "arguments": '{"city":"Nice"}'},
                },
            ],
        },
        tool("c2", '{"temp":18,"condition":"sunny"}'),
        tool("c3", "Grand Hotel (€120), Le Petit (€85)"),
        a("sunny; two hotels"),
        u("book Le Petit"),
        call("c4", name="book"),
        tool("c4", "booked"),
        a("done"),
        u("thanks"),
    ]


def test_multiple_groups_combined_exact_strings() -> None:
    msgs = weather_and_hotels()
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=1), msgs)
    assert result.changed
    assert contents(result.messages) == [
        "sys",
        "weather in Paris?",
        '[Tool results: get_weather: {"temp":12,"condition":"cloudy","wind":"NW 15km/h"}]',
        "cloudy",
        "and Nice, with hotels?",
        '[Tool results: get_weather: {"temp":18,"condition":"sunny"}; '
        "search_hotels: Grand Hotel (€120), Le Petit (€85)]",
        "sunny; two hotels",
        "book Le Petit",
        None,
        "booked",
        "done",
        "thanks",
    ]
    summary = result.messages[2]
    assert summary == {"role": "assistant", "content": summary["content"]}  # valid, no tool_calls
    assert result.messages[8] is msgs[11]  # the newest group is kept verbatim


def test_idempotent() -> None:
    strategy = ToolResultCompactionStrategy(keep_last_tool_call_groups=1)
    first = run(strategy, weather_and_hotels())
    assert not run(strategy, first.messages).changed


def test_keep_zero_collapses_all_but_the_newest_step() -> None:
    strategy = ToolResultCompactionStrategy(keep_last_tool_call_groups=0)
    msgs = weather_and_hotels()[:-2]  # the c4 group is now the newest step
    result = run(strategy, msgs)
    assert [m["tool_calls"][0]["id"] for m in result.messages if "tool_calls" in m] == ["c4"]
    assert sum(1 for m in result.messages if str(m.get("content")).startswith("[Tool")) == 2
    # one step later ("done" is the newest step) the c4 group is an older step of the turn
    result = run(strategy, weather_and_hotels()[:-1])
    assert not any("tool_calls" in m for m in result.messages)
    assert sum(1 for m in result.messages if str(m.get("content")).startswith("[Tool")) == 3


def test_no_results_and_unknown_names() -> None:
    msgs = [
        u("q"),
        call("c1"),
        u("q2"),
        call("c2", name="lookup"),
        tool("c2", "x"),
        tool("ghost", "  orphan text "),
        u("last"),
    ]
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    assert contents(result.messages) == [
        "q",
        "[Tool results: no results]",
        "q2",
        "[Tool results: lookup: x; orphan text]",
        "last",
    ]


def test_text_parts_are_joined_by_newlines_and_legacy_calls_are_named() -> None:
    msgs = [
        u("q"),
        call("c1", name="search"),
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "text", "text": "found 10"}, {"type": "text", "text": "cats"}],
        },
        fcall("calc"),
        fresult("calc", "42"),
        u("last"),
    ]
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    assert contents(result.messages) == [
        "q",
        "[Tool results: search: found 10\ncats]",
        "[Tool results: calc: 42]",
        "last",
    ]


def test_large_payload_is_capped_keeping_its_head_and_tail() -> None:
    msgs = [u("q"), call("c1", name="dump"), tool("c1", "x" * 10_000 + "\nEND"), u("last")]
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    text = result.messages[1]["content"]
    assert 4096 - 1 <= len(text) <= 4096
    assert text.startswith("[Tool results: dump: xxx") and text.endswith("xxx\nEND]")
    assert text.count(MIDDLE_MARKER) == 1
    head, tail = text.split(MIDDLE_MARKER)  # 3/5 of what is kept at the head, 2/5 at the tail
    assert len(head) - len("[Tool results: ") == (4096 - 16 - len(MIDDLE_MARKER)) * 3 // 5
    assert len(tail) - len("]") == (4096 - 16 - len(MIDDLE_MARKER)) - len(head) + 15
    # a cap too small for the name, the marker and a tail: the head alone (the AF's cut)
    small = run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, max_summary_chars=40), msgs
    )
    assert small.messages[1]["content"] == "[Tool results: dump: xxx... [truncated]]"


def test_summary_text_rules() -> None:
    assert summary_text([]) == "[Tool results: no results]"
    assert summary_text(["a: 1", "b: 2"]) == "[Tool results: a: 1; b: 2]"
    # 120 - 16 = 104 for the label, 37 of them the marker: 40 head, 27 tail
    capped = summary_text(["y" * 100 + "   " + "z" * 100], max_chars=120)
    assert capped == "[Tool results: " + "y" * 40 + MIDDLE_MARKER + "z" * 27 + "]"
    assert len(capped) == 120
    # the cut lands in whitespace: the head is right-stripped, the tail left-stripped
    spaced = summary_text(["y" * 38 + " " * 30 + "z" * 100], max_chars=120)
    assert spaced == "[Tool results: " + "y" * 38 + MIDDLE_MARKER + "z" * 27 + "]"
    # the tool's name always stays in the head, even where 3/5 of the room is shorter
    named = summary_text([Label("a_long_tool_name: " + "q" * 200, 18)], max_chars=80)
    assert named == "[Tool results: a_long_tool_name:" + MIDDLE_MARKER + "q" * 9 + "]"
    assert summary_text(["abc"], max_chars=5) == "[Tool results: ... [truncated]]"


def test_nonadjacent_result_collapses_at_the_call_position() -> None:
    msgs = [
        u("q"),
        call("c1", name="approve"),
        a("waiting for approval"),
        tool("c1", "ok"),
        u("last"),
    ]
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    assert contents(result.messages) == [
        "q",
        "[Tool results: approve: ok]",
        "waiting for approval",
        "last",
    ]


def test_configured_trigger_stops_once_it_no_longer_fires() -> None:
    msgs = [u("q")]
    for i in range(6):
        msgs += [call(f"c{i}"), tool(f"c{i}", "r" * 400)]
    msgs.append(u("last"))
    full = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    limit = (full.report.tokens_before + full.report.tokens_after) // 2
    result = run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, trigger=TokensExceed(limit)),
        msgs,
    )
    assert result.report.tokens_after <= limit
    collapsed = sum(1 for m in result.messages if str(m.get("content")).startswith("[Tool"))
    assert 0 < collapsed < 6
    assert not run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, trigger=TokensExceed(limit)),
        result.messages,
    ).changed
    forced = run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, trigger=TokensExceed(10**9)),
        msgs,
        mode=Mode.FORCE,
    )
    assert sum(1 for m in forced.messages if "tool_calls" in m) == 0


def test_minimum_preserved_keeps_the_newest_groups_of_any_kind() -> None:
    msgs = [u("q"), call("c1"), tool("c1"), call("c2"), tool("c2"), a("x"), u("last")]
    result = run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, minimum_preserved=3), msgs
    )
    assert contents(result.messages) == [
        "q",
        "[Tool results: get_weather: sunny]",
        None,
        "sunny",
        "x",
        "last",
    ]


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        ToolResultCompactionStrategy(keep_last_tool_call_groups=-1)
    with pytest.raises(ValueError):
        ToolResultCompactionStrategy(max_summary_chars=0)


# ------------------------------------------------------- the cap is shared between results


def parallel(*results: str) -> list[Msg]:
    ids = [f"c{i}" for i in range(len(results))]
    return [
        u("q"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": f"t{n}", "arguments": "{}"}}
                for n, i in enumerate(ids)
            ],
        },
        *(tool(i, r) for i, r in zip(ids, results, strict=True)),
        u("last"),
    ]


def collapsed(*results: str, max_chars: int = 4096) -> str:
    strategy = ToolResultCompactionStrategy(
        keep_last_tool_call_groups=0, max_summary_chars=max_chars
    )
    text = run(strategy, parallel(*results)).messages[1]["content"]
    assert isinstance(text, str)
    return text


def test_a_large_first_result_leaves_a_short_second_one_whole() -> None:
    second = "FACT-P2: the second result, short and to the point"
    text = collapsed("x" * 10_000, second)
    assert len(text) <= 4096
    assert text.endswith(f"; t1: {second}]")
    assert text.startswith("[Tool results: t0: xxx")
    head = text[len("[Tool results: ") : text.index("; t1: ")]
    kept_head, kept_tail = head.split(MIDDLE_MARKER)
    assert kept_tail == "x" * len(kept_tail) and len(kept_head) > len(kept_tail) > 1_000
    # the first result gets everything the second one left over
    assert len(text) >= 4096 - 1


def test_two_large_results_each_keep_their_head_and_tail_in_equal_shares() -> None:
    first = "FACT-A " + "a" * 9_000 + "\nEND-A"
    second = "FACT-B " + "b" * 9_000 + "\nEND-B"
    text = collapsed(first, second)
    assert len(text) <= 4096
    body = text[len("[Tool results: ") : -1]
    left, right = body.split("; ")
    assert left.startswith("t0: FACT-A aaa") and right.startswith("t1: FACT-B bbb")
    assert left.endswith("aaa\nEND-A") and right.endswith("bbb\nEND-B")
    assert left.count(MIDDLE_MARKER) == 1 and right.count(MIDDLE_MARKER) == 1
    assert abs(len(left) - len(right)) <= 1


def test_short_results_give_their_unused_share_to_the_long_ones() -> None:
    text = collapsed("s" * 100, "L" * 5_000, "M" * 5_000, "t" * 10)
    body = text[len("[Tool results: ") : -1].split("; ")
    assert body[0] == "t0: " + "s" * 100 and body[3] == "t3: " + "t" * 10
    assert MIDDLE_MARKER in body[1] and MIDDLE_MARKER in body[2]
    assert body[1].endswith("LLL") and body[2].endswith("MMM")
    assert abs(len(body[1]) - len(body[2])) <= 1
    assert 4096 - 2 <= len(text) <= 4096  # the room is used


def test_a_single_result_keeps_the_tail_the_agent_framework_cuts_away() -> None:
    """The documented difference: the Agent Framework keeps the head alone."""
    label = Label("dump: " + "y" * 100 + "   " + "z" * 100, len("dump: "))
    af_rule = "[Tool results: " + label.text[: 120 - 31].rstrip() + "... [truncated]]"
    ours = summary_text([label], max_chars=120)
    assert ours != af_rule and len(ours) == len(af_rule) == 120
    assert ours == "[Tool results: dump: " + "y" * 34 + MIDDLE_MARKER + "z" * 27 + "]"
    # below the name, the marker and one character of tail, the AF's cut exactly
    tiny = "[Tool results: " + label.text[: 59 - 31].rstrip() + "... [truncated]]"
    assert summary_text([label], max_chars=59) == tiny


def test_too_many_results_for_the_cap_fall_back_to_one_cut_of_the_joined_text() -> None:
    labels = [Label(f"r{n}: " + "v" * 40 + f" end-{n}", 4) for n in range(10)]
    text = summary_text(labels, max_chars=100)
    assert len(text) <= 100
    assert text.count("[truncated") == 1 and MIDDLE_MARKER in text
    assert text.startswith("[Tool results: r0: vvv") and text.endswith("vvv end-9]")
    # too small even for that: the joined text's head alone
    text = summary_text(labels, max_chars=50)
    assert text == "[Tool results: r0: " + "v" * 15 + "... [truncated]]"


# --------------------------------------------- the verdict at the end of a result survives


def build_log(step: int, lines: int = 300) -> str:
    """Shell output whose verdict is its last line, as a test runner or ``echo`` prints it."""
    body = "".join(f"collecting tests/test_mod_{step}.py::case_{n} PASSED\n" for n in range(lines))
    return body + f"FACT-{step}: 3 failed, 41 passed in 2.10s"


def test_the_last_line_of_a_collapsed_result_is_kept() -> None:
    msgs = [u("q"), call("c1", name="bash"), tool("c1", build_log(7)), u("last")]
    text = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs).messages[1][
        "content"
    ]
    assert len(text) <= 4096 < len(build_log(7))
    assert text.startswith("[Tool results: bash: collecting tests/test_mod_7.py::case_0 PASSED")
    assert text.endswith("\nFACT-7: 3 failed, 41 passed in 2.10s]")
    # and so is each parallel result's, in its fair share
    text = collapsed(build_log(1), build_log(2), "FACT-3: short", build_log(4))
    assert len(text) <= 4096
    for step in (1, 2, 4):
        assert f"\nFACT-{step}: 3 failed, 41 passed in 2.10s; " in text[:-1] + "; "
    assert "; t2: FACT-3: short; " in text


def test_fair_shares_are_max_min_fair_and_deterministic() -> None:
    from compaction_proxy.compaction.strategies.tool_result_compaction import fair_shares

    assert fair_shares([10, 10], 100) == [10, 10]
    assert fair_shares([90, 5], 50) == [45, 5]
    assert fair_shares([30, 30, 30], 31) == [11, 10, 10]
    assert fair_shares([0, 50, 3], 20) == [0, 17, 3]
    assert fair_shares([5, 5], -3) == [0, 0]


async def test_the_summarizer_is_shown_the_last_line_of_every_collapsed_result() -> None:
    """The default pipeline collapses old steps before it summarizes them, so what the
    collapse cuts no summary can carry: each step's verdict must survive the collapse."""
    steps = 30
    msgs: list[Msg] = [s(), u("fix the failing tests")]
    for n in range(steps):
        msgs += [call(f"c{n}", name="bash"), tool(f"c{n}", build_log(n, lines=60))]
    facts = ModelFacts(context_window=int(TOK.count_messages(msgs) / 0.9), max_output_tokens=0)
    fake = FakeSummarizer()
    result = await compact_async(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=build_pipeline(CompactionSettings()),
            tokenizer=TOK,
            facts=facts,
            reserve_ratio=0,
        ),
        summarizer=fake,
    )
    changed = result.report.changed_by
    assert "tool_result_compaction" in changed and "summarization" in changed
    shown = [m for call in fake.calls for m in call.messages]
    stubs = [str(m["content"]) for m in shown if str(m.get("content")).startswith("[Tool res")]
    assert len(stubs) >= steps // 2, "the summarizer was not shown the collapsed steps"
    for stub in stubs:
        step = int(stub.split("test_mod_", 1)[1].split(".py", 1)[0])
        assert len(stub) < len(build_log(step, lines=60))  # the result was cut
        assert stub.endswith(f"\nFACT-{step}: 3 failed, 41 passed in 2.10s]")
