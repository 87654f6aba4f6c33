"""Tool-result compaction: the Agent Framework's vectors (research/msaf.md section 5)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.strategies import ToolResultCompactionStrategy
from compaction_proxy.compaction.strategies.tool_result_compaction import summary_text
from compaction_proxy.compaction.triggers import TokensExceed

from .helpers import Msg, a, call, contents, fcall, fresult, s, tool, u
from .strategy_helpers import run


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


def test_large_payload_is_capped_with_truncated_marker() -> None:
    msgs = [u("q"), call("c1", name="dump"), tool("c1", "x" * 10_000), u("last")]
    result = run(ToolResultCompactionStrategy(keep_last_tool_call_groups=0), msgs)
    text = result.messages[1]["content"]
    assert len(text) <= 4096
    assert text.startswith("[Tool results: dump: xxx") and text.endswith("... [truncated]]")
    small = run(
        ToolResultCompactionStrategy(keep_last_tool_call_groups=0, max_summary_chars=40), msgs
    )
    assert len(small.messages[1]["content"]) == 40


def test_summary_text_rules() -> None:
    assert summary_text([]) == "[Tool results: no results]"
    assert summary_text(["a: 1", "b: 2"]) == "[Tool results: a: 1; b: 2]"
    capped = summary_text(["y" * 100 + "   " + "z" * 100], max_chars=120)
    assert capped == "[Tool results: " + "y" * 89 + "... [truncated]]"
    assert len(capped) <= 120
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
    assert head.endswith("... [truncated]")
    # the first result gets everything the second one left over
    assert len(text) >= 4096 - 1


def test_two_large_results_each_keep_their_head_in_equal_shares() -> None:
    first = "FACT-A " + "a" * 9_000
    second = "FACT-B " + "b" * 9_000
    text = collapsed(first, second)
    assert len(text) <= 4096
    body = text[len("[Tool results: ") : -1]
    left, right = body.split("; ")
    assert left.startswith("t0: FACT-A aaa") and right.startswith("t1: FACT-B bbb")
    assert left.endswith("... [truncated]") and right.endswith("... [truncated]")
    assert abs(len(left) - len(right)) <= 1


def test_short_results_give_their_unused_share_to_the_long_ones() -> None:
    text = collapsed("s" * 100, "L" * 5_000, "M" * 5_000, "t" * 10)
    body = text[len("[Tool results: ") : -1].split("; ")
    assert body[0] == "t0: " + "s" * 100 and body[3] == "t3: " + "t" * 10
    assert body[1].endswith("... [truncated]") and body[2].endswith("... [truncated]")
    assert abs(len(body[1]) - len(body[2])) <= 1
    assert 4096 - 2 <= len(text) <= 4096  # the room is used (right-stripping aside)


def test_a_single_result_is_cut_as_the_agent_framework_cuts_it() -> None:
    label = "dump: " + "y" * 100 + "   " + "z" * 100
    af_rule = "[Tool results: " + label[: 120 - 31].rstrip() + "... [truncated]]"
    assert summary_text([label], max_chars=120) == af_rule


def test_too_many_results_for_the_cap_fall_back_to_one_cut_at_the_end() -> None:
    labels = [f"r{n}: " + "v" * 40 for n in range(10)]
    text = summary_text(labels, max_chars=100)
    assert len(text) <= 100
    assert text.endswith("... [truncated]]") and text.count("[truncated]") == 1


def test_fair_shares_are_max_min_fair_and_deterministic() -> None:
    from compaction_proxy.compaction.strategies.tool_result_compaction import fair_shares

    assert fair_shares([10, 10], 100) == [10, 10]
    assert fair_shares([90, 5], 50) == [45, 5]
    assert fair_shares([30, 30, 30], 31) == [11, 10, 10]
    assert fair_shares([0, 50, 3], 20) == [0, 17, 3]
    assert fair_shares([5, 5], -3) == [0, 0]
