"""Recall marks and what one run archives (``compaction.recall``; "Recall marks" in
docs/compaction.md).

With recall on, the draft marks and archives at its decision points, whatever the strategy: an
edited message names the original it replaced (`` [recall id r…]``), a summary or a collapsed
group names the span of what it stands for, and :attr:`CompactionResult.archived` holds every
original the output lacks.  With recall off nothing of this happens (the rest of
tests/compaction runs with it off and is unchanged).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    Calibration,
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    Mode,
    ModelFacts,
    Pipeline,
    SummarizationSettings,
    build_pipeline,
    build_view,
    compact_async,
)
from compaction_proxy.compaction.archive import ID_PATTERN, Archived, RecallIds
from compaction_proxy.compaction.budget import Budget
from compaction_proxy.compaction.chat_messages import text_only
from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.ledger import is_ledger
from compaction_proxy.compaction.marks import (
    marked,
    message_mark,
    original_mark,
    span_mark,
    strip_mark,
)
from compaction_proxy.compaction.pipeline import unchanged_result
from compaction_proxy.compaction.strategies import (
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    SelectiveToolCallsStrategy,
    SlidingWindowStrategy,
    Strategy,
    SummarizationStrategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.strategies.summarization import unwrap_summary
from compaction_proxy.compaction.triggers import Always
from compaction_proxy.compaction.validation import validate_messages
from compaction_proxy.compaction.view import DEFAULT_SUMMARY_MARKER
from compaction_proxy.wire import messages as messages_wire
from compaction_proxy.wire import responses as responses_wire
from tests.messages import test_properties as messages_properties
from tests.responses import test_properties as responses_properties
from tests.support.trust_session import LIBRECHAT_BLOCK

from .helpers import Msg, a, call, s, tool, u
from .summarizer_fakes import FakeSummarizer
from .test_compositions import DOTNET_PIPELINE_YAML
from .test_properties import check_invariants_phase2, phase2_strategies, rich_conversations

Message = Mapping[str, Any]
IDS = RecallIds(b"test-archive-namespace-key")
"""The ids of the namespace these runs archive in (the edge derives the key)."""
original_id = IDS.original
span_id = IDS.span
TOK = CharacterEstimatorTokenizer()
BIG = ModelFacts(context_window=1_000_000, max_output_tokens=0)
CLEARED = "[Old tool result content cleared]"
STUB_ID = "rabcdefghijk"


def run(
    messages: Sequence[Message],
    *strategies: Strategy,
    pipeline: Pipeline | None = None,
    recall: bool = True,
    facts: ModelFacts = BIG,
    summarizer: FakeSummarizer | None = None,
    mode: Mode = Mode.NORMAL,
) -> CompactionResult:
    """``strategies`` in a plain pipeline (each by its own trigger, no fallback), or a whole
    ``pipeline``, with recall on."""
    request = CompactionRequest(
        messages,
        model="m",
        pipeline=pipeline or Pipeline(strategies, fallback=False, early_stop=False),
        tokenizer=TOK,
        facts=facts,
        reserve_ratio=0,
        mode=mode,
        recall=IDS if recall else None,
    )
    return asyncio.run(compact_async(request, summarizer=summarizer))


def agent(steps: int, size: int = 400) -> list[Msg]:
    """A task, then ``steps`` tool steps whose results are ``size`` characters and more."""
    msgs: list[Msg] = [s("You are an agent."), u("fix the build")]
    for n in range(steps):
        msgs += [call(f"c{n}", name="read"), tool(f"c{n}", f"result {n} " + "x" * size)]
    return msgs


def marks(messages: Sequence[Message]) -> list[str]:
    return [m for m in map(message_mark, messages) if m is not None]


def draft_over(messages: list[Msg], *, recall: bool = True) -> Draft:
    view = build_view(messages, TOK)
    return Draft(
        view, tokenizer=TOK, budget=Budget(1_000_000, 0, 0), recall=IDS if recall else None
    )


# ------------------------------------------------------------------ where a mark goes


def test_a_string_gets_the_mark_appended_once() -> None:
    result = {**tool("c1", CLEARED), "x-extra": 1}
    once = marked(result, original_mark(STUB_ID))
    assert once == {**result, "content": f"{CLEARED} [recall id {STUB_ID}]"}
    assert marked(once, original_mark(STUB_ID)) == once  # the same mark: the same bytes
    other = marked(once, original_mark("rzzzzzzzzzzz"))
    assert other["content"] == f"{CLEARED} [recall id rzzzzzzzzzzz]"  # replaced, not doubled
    assert message_mark(other) == "rzzzzzzzzzzz"
    assert strip_mark(other["content"]) == CLEARED


def test_list_content_takes_it_on_its_last_text_part_or_a_new_one() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    parts = [
        {"type": "text", "text": "head"},
        {"type": "text", "text": "tail", "cache_control": {"type": "ephemeral"}},
        image,
    ]
    done = marked({"role": "tool", "tool_call_id": "c", "content": parts}, original_mark(STUB_ID))
    assert done["content"][:2] == [
        {"type": "text", "text": "head"},
        {
            "type": "text",
            "text": f"tail [recall id {STUB_ID}]",
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert done["content"][2] is image
    assert message_mark(done) == STUB_ID
    only_image = marked(
        {"role": "tool", "tool_call_id": "c", "content": [image]}, original_mark(STUB_ID)
    )
    assert only_image["content"] == [image, {"type": "text", "text": f"[recall id {STUB_ID}]"}]
    assert marked(only_image, original_mark(STUB_ID)) == only_image
    empty = marked({"role": "tool", "tool_call_id": "c", "content": None}, original_mark(STUB_ID))
    assert empty["content"] == f"[recall id {STUB_ID}]"
    assert marked(empty, original_mark(STUB_ID)) == empty


def test_only_results_and_messages_with_text_carry_a_mark() -> None:
    calls = call("c1")
    assert marked(calls, original_mark(STUB_ID)) is calls  # content None: only tool calls
    system = s("rules")
    assert marked(system, original_mark(STUB_ID)) is system
    assert marked(a("done"), span_mark("sabcdefghijk"))["content"] == (
        "done\n\n[Originals of what this summary covers: recall id sabcdefghijk]"
    )


def test_a_marked_summary_is_still_the_proxys_checkpoint() -> None:
    strategy = SummarizationStrategy()
    summary = marked(strategy.summary_message("the gist"), span_mark("sabcdefghijk"))
    assert DEFAULT_SUMMARY_MARKER.is_ours(summary)
    assert unwrap_summary(summary["content"]) == "the gist"


# ------------------------------------------------------------------ the draft's decisions


def test_an_edit_archives_the_original_under_its_id() -> None:
    msgs = agent(3)
    draft = draft_over(msgs)
    assert draft.edit(3, {**msgs[3], "content": CLEARED})
    assert draft.message(3)["content"] == f"{CLEARED} [recall id {original_id(msgs[3])}]"
    # the budget sees the mark
    assert draft.message_stats(3).token_count == draft.measure(draft.message(3)).token_count
    archived = draft.archived()
    assert archived == Archived(
        originals={original_id(msgs[3]): msgs[3]}, order=(original_id(msgs[3]),)
    )
    assert archived.originals[original_id(msgs[3])] is msgs[3]


def test_editing_a_stub_keeps_its_id_and_archives_nothing_new() -> None:
    msgs = agent(3)
    stub = {**msgs[3], "content": "result 0 " + "x" * 300 + original_mark(STUB_ID)}
    msgs[3] = stub
    draft = draft_over(msgs)
    assert draft.edit(3, {**stub, "content": CLEARED})
    assert draft.message(3)["content"] == f"{CLEARED} [recall id {STUB_ID}]"
    assert draft.archived() is None  # its original was archived by the run that made the stub


def test_an_edit_that_gives_the_message_again_is_no_edit() -> None:
    msgs = agent(3)
    msgs[3] = {**msgs[3], "content": CLEARED + original_mark(STUB_ID)}
    draft = draft_over(msgs)
    assert not draft.edit(3, {**msgs[3], "content": CLEARED})
    assert not draft.changed and draft.counters.messages_edited == 0
    assert draft.preview_edit(3, {**msgs[3], "content": CLEARED}) is None


def test_an_edit_whose_mark_frees_nothing_is_not_made() -> None:
    msgs = [s(), u("go"), call("c1"), tool("c1", "ok"), call("c2"), tool("c2", "fine")]
    draft = draft_over(msgs)
    assert not draft.edit(3, {**msgs[3], "content": CLEARED})  # longer once marked
    assert draft.message(3) is msgs[3] and draft.archived() is None
    plain = draft_over(msgs, recall=False)
    assert plain.edit(3, {**msgs[3], "content": CLEARED})  # without recall: made, as ever
    assert plain.message(3)["content"] == CLEARED


def test_a_call_whose_arguments_are_cleared_is_archived_without_a_mark() -> None:
    msgs = agent(4)
    msgs[2] = call("c0", name="read", args='{"path": "' + "p" * 200 + '"}')
    strategy = ClearToolUsesStrategy(keep=1, clear_tool_inputs=True, trigger=Always())
    result = run(msgs, strategy)
    out = result.messages
    assert out[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "recall id" not in orjson.dumps(out[2]).decode()
    assert result.archived is not None
    assert result.archived.originals[original_id(msgs[2])] is msgs[2]
    assert out[3]["content"] == f"{CLEARED} [recall id {original_id(msgs[3])}]"


# ------------------------------------------------------------------ each strategy


def test_clear_tool_uses_marks_what_it_clears_and_counts_it_honestly() -> None:
    msgs = agent(6)
    strategy = ClearToolUsesStrategy(keep=2, trigger=Always())
    result = run(msgs, strategy)
    out = result.messages
    ids = [original_id(msgs[i]) for i in (3, 5, 7, 9)]
    assert [out[i]["content"] for i in (3, 5, 7, 9)] == [f"{CLEARED} [recall id {i}]" for i in ids]
    assert out[11] is msgs[11] and out[13] is msgs[13]
    assert result.archived is not None
    assert result.archived.order == tuple(ids)
    assert all(
        result.archived.originals[i] is msgs[index]
        for i, index in zip(ids, (3, 5, 7, 9), strict=True)
    )
    (report,) = result.report.strategies
    saved = result.report.tokens_before - result.report.tokens_after
    assert report.notes == (f"cleared 4 tool result(s), {saved} token(s)",)
    assert report.messages_affected == 4
    again = run(out, strategy)  # a second run over marked output: nothing to do
    assert not again.changed and again.archived is None


def test_a_soft_trimmed_result_keeps_its_id_when_it_is_cleared_later() -> None:
    msgs = agent(6, size=600)
    trim = ContextPruningStrategy(
        keep_last_assistants=1,
        soft_trim_ratio=0.0,
        hard_clear_ratio=1.0,
        min_prunable_tool_chars=100,
        soft_trim_max_chars=100,
        soft_trim_head_chars=20,
        soft_trim_tail_chars=20,
        trigger=Always(),
    )
    first = run(msgs, trim)
    trimmed = first.messages[3]
    assert "[soft-trimmed: 609 chars → 40 chars, middle removed]" in trimmed["content"]
    assert message_mark(trimmed) == original_id(msgs[3])
    clear = ContextPruningStrategy(
        keep_last_assistants=1, hard_clear_ratio=0.0, min_prunable_tool_chars=100, trigger=Always()
    )
    second = run(first.messages, clear)
    assert second.messages[3]["content"] == f"{CLEARED} [recall id {original_id(msgs[3])}]"
    assert second.archived is None  # the original went into the first run's archive
    assert not run(second.messages, clear).changed


def test_a_collapsed_group_names_the_span_of_its_messages() -> None:
    msgs = agent(3)
    msgs[3] = {**msgs[3], "content": CLEARED + original_mark(STUB_ID)}  # cleared before
    result = run(msgs, ToolResultCompactionStrategy())
    out = result.messages
    first, second = out[2], out[3]
    members_first = (original_id(msgs[2]), STUB_ID)
    sid = span_id(members_first, strip_mark(first["content"]))
    assert first["content"] == (
        f"[Tool results: read: {CLEARED} [recall id {STUB_ID}]]"
        f"\n\n[Originals of what this summary covers: recall id {sid}]"
    )
    assert result.archived is not None
    assert result.archived.spans[sid] == members_first
    assert STUB_ID not in result.archived.originals  # a stub archives nothing new
    assert result.archived.originals[original_id(msgs[4])] is msgs[4]
    assert message_mark(second) in result.archived.spans
    # the same originals, the same bytes: on the next request or another replica
    assert orjson.dumps(run(copy.deepcopy(msgs), ToolResultCompactionStrategy()).messages) == (
        orjson.dumps(out)
    )


def test_what_the_run_made_and_then_dropped_is_not_archived_again() -> None:
    """A collapse, then a window that drops the oldest collapsed groups: the originals are
    archived once; the collapsed messages (made from them) are not."""
    msgs = agent(6)
    result = run(msgs, ToolResultCompactionStrategy(), SlidingWindowStrategy(keep_last_groups=3))
    out = result.messages
    collapsed = [m for m in out if str(m.get("content")).startswith("[Tool results")]
    assert 0 < len(collapsed) < 5  # five were made, the oldest of them dropped
    assert result.archived is not None
    gone = [m for m in msgs if not any(o is m for o in out)]
    assert set(result.archived.originals) == {original_id(m) for m in gone}
    assert all(m["role"] in ("assistant", "tool") for m in result.archived.originals.values())
    assert not any(
        str(m.get("content")).startswith("[Tool results")
        for m in result.archived.originals.values()
    )
    # the spans still reachable are those whose message was forwarded
    assert set(result.archived.spans) == set(marks(out))


@pytest.mark.parametrize(
    "strategy",
    [
        SelectiveToolCallsStrategy(keep_last_tool_call_groups=1),
        SlidingWindowStrategy(keep_last_groups=3),
        TruncationStrategy(max_n=3, metric="messages", compact_to=3),
    ],
    ids=["selective_tool_calls", "sliding_window", "truncation"],
)
def test_dropped_groups_are_archived_oldest_first_without_marks(strategy: Strategy) -> None:
    msgs = agent(5)
    result = run(msgs, strategy)
    out = result.messages
    gone = [m for m in msgs if not any(o is m for o in out)]
    assert gone and not marks(out)
    assert result.archived is not None
    assert result.archived.order == tuple(original_id(m) for m in gone)
    assert all(result.archived.originals[original_id(m)] is m for m in gone)
    assert result.archived.spans == {}


def test_a_summary_names_the_span_of_what_it_folded() -> None:
    msgs: list[Msg] = [s()]
    for n in range(6):
        msgs += [u(f"question {n} " + "q" * 200), a(f"answer {n} " + "a" * 200)]
    summarizer = FakeSummarizer()
    result = run(
        msgs, SummarizationStrategy(retain_turns=2, trigger=Always()), summarizer=summarizer
    )
    out = result.messages
    summary = out[1]
    assert DEFAULT_SUMMARY_MARKER.is_ours(summary)
    folded = msgs[1:9]
    members = tuple(original_id(m) for m in folded)
    sid = span_id(members, strip_mark(summary["content"]))
    assert summary["content"].endswith(span_mark(sid))
    assert result.archived is not None
    assert result.archived.spans == {sid: members}
    assert result.archived.order == (*members, sid)
    # the next summary folds this one: it is archived, and its span joins the new one
    longer = [*out, u("question 6 " + "q" * 200), a("answer 6 " + "a" * 200), u("and now?")]
    later = run(
        longer, SummarizationStrategy(retain_turns=1, trigger=Always()), summarizer=summarizer
    )
    assert later.archived is not None
    assert later.archived.originals[original_id(summary)] is summary
    new_summary = later.messages[1]
    new_sid = message_mark(new_summary)
    assert new_sid is not None and new_sid != sid
    new_members = later.archived.spans[new_sid]
    assert new_members[:2] == (original_id(summary), sid)
    # the summarizer was given the old summary's text, not its mark
    previous = summarizer.calls[-1].previous_summary
    assert previous is not None and "recall id" not in previous


def test_progress_so_far_with_a_mark_leaves_the_task_protected() -> None:
    msgs = agent(8)
    summary = SummarizationStrategy(retain_turns=2, trigger=Always())
    out = run(msgs, summary, summarizer=FakeSummarizer()).messages
    assert out[1] is msgs[1] and DEFAULT_SUMMARY_MARKER.is_ours(out[2])
    assert str(message_mark(out[2])).startswith("s")
    view = build_view(out, TOK)
    assert view.tail_start == 1  # the task, not the marked summary, is the newest user message


def test_the_last_resort_trim_is_marked_and_archived() -> None:
    msgs = [s(), u("read the log"), call("c1", name="cat"), tool("c1", "line\n" * 4000)]
    facts = ModelFacts(context_window=2000, max_output_tokens=0)
    result = run(msgs, pipeline=Pipeline(()), facts=facts)
    assert result.report.last_resort is not None and result.report.last_resort.changed
    trimmed = result.messages[3]
    assert "soft-trimmed" in trimmed["content"]
    assert message_mark(trimmed) == original_id(msgs[3])
    assert (
        result.archived is not None and result.archived.originals[original_id(msgs[3])] is msgs[3]
    )
    assert result.report.tokens_after <= result.report.budget


def test_work_the_churn_rule_undoes_is_not_archived() -> None:
    msgs = agent(6)
    msgs += [call("c6", name="ping"), tool("c6", "tiny result 6 " * 3)]
    msgs += [call("c7", name="ping"), tool("c7", "tiny result 7 " * 3)]
    big_clear = ClearToolUsesStrategy(keep=3, trigger=Always())
    small_clear = ClearToolUsesStrategy(
        keep=1, trigger=Always(), placeholder="[gone]", exclude_tools=("read",)
    )
    pipeline = Pipeline(
        (big_clear, small_clear), fallback=False, early_stop=False, min_saving=0.001
    )
    facts = ModelFacts(context_window=60_000, max_output_tokens=0)  # a minimum of 60 tokens
    result = run(msgs, pipeline=pipeline, facts=facts)
    kept, undone = result.report.strategies
    assert kept.changed and not undone.changed
    assert any("not applied" in note for note in undone.notes)  # it cleared c6, then undone
    assert result.messages[15] is msgs[15]
    assert result.archived is not None
    assert set(result.archived.originals) == {original_id(msgs[i]) for i in (3, 5, 7, 9, 11)}
    assert original_id(msgs[15]) not in result.archived.order


def test_recall_off_leaves_no_mark_and_archives_nothing() -> None:
    msgs = agent(6)
    for strategy in (
        ClearToolUsesStrategy(keep=2, trigger=Always()),
        ToolResultCompactionStrategy(),
        SelectiveToolCallsStrategy(),
    ):
        result = run(msgs, strategy, recall=False)
        assert result.changed and result.archived is None
        assert "recall id" not in orjson.dumps(result.messages).decode()


def test_an_unchanged_request_archives_nothing() -> None:
    msgs = agent(2)
    result = run(msgs, ClearToolUsesStrategy(keep=5, trigger=Always()))
    assert not result.changed and result.archived is None
    request = CompactionRequest(msgs, model="m", pipeline=Pipeline(()), tokenizer=TOK, recall=IDS)
    quiet = unchanged_result(request, "estimator", Budget(1000, 0, 0), Calibration(), 10)
    assert quiet.archived is None


# ------------------------------------------------------------------ over a checkpoint


def test_stubs_from_a_checkpoint_go_through_later_runs_byte_for_byte() -> None:
    """A checkpoint hands back the compacted view; the next request's run over it (plus a new
    step) must not touch the stubs: the forwarded prefix stays the same bytes."""
    for strategy in (
        ClearToolUsesStrategy(keep=2, trigger=Always()),
        ToolResultCompactionStrategy(),
    ):
        first = run(agent(6), strategy)
        stored = orjson.loads(orjson.dumps(first.messages))  # read back from the store
        step = [call("c6", name="read"), tool("c6", "result 6 " + "x" * 400)]
        second = run([*stored, *step], strategy)
        stubs = [m for m in first.messages if message_mark(m) is not None]
        assert stubs
        for stub in stubs:
            assert orjson.dumps(stub) in {orjson.dumps(m) for m in second.messages}
        assert second.changed  # the step before the new one was compacted in its turn
        assert second.archived is not None
        assert set(second.archived.originals) <= {original_id(m) for m in stored}


# ------------------------------------------------------------------ the seeds' pipelines


def shopping(turns: int, result_chars: int = 900) -> list[Msg]:
    msgs: list[Msg] = [s("You are a helpful shopping assistant.")]
    for i in range(turns):
        msgs += [
            u(f"turn {i}: what's the price of item {i}?"),
            call(f"c{i}", name="LookupPrice"),
            tool(f"c{i}", f"item {i} costs {i} USD " + "x" * result_chars),
            a(f"Item {i} costs {i} USD."),
        ]
    return msgs


SEED_PIPELINES = {
    "agent_framework": lambda: build_pipeline(
        CompactionSettings.model_validate(yaml.safe_load(DOTNET_PIPELINE_YAML))
    ),
    "librechat": lambda: build_pipeline(
        CompactionSettings(), SummarizationSettings.model_validate(LIBRECHAT_BLOCK)
    ),
}


@pytest.mark.parametrize("seed", sorted(SEED_PIPELINES))
def test_the_seeds_pipelines_archive_what_they_remove(seed: str) -> None:
    pipeline = SEED_PIPELINES[seed]()
    facts = ModelFacts(context_window=8_000, max_output_tokens=1_000)
    msgs = shopping(24)
    summarizer = FakeSummarizer()
    result = run(msgs, pipeline=pipeline, facts=facts, summarizer=summarizer)
    assert result.changed and summarizer.calls
    check_archive(msgs, result)
    out = result.messages
    assert any(str(m["content"]).startswith("<summary>") and message_mark(m) for m in out)
    assert result.report.tokens_after <= result.report.budget
    again = run(out, pipeline=pipeline, facts=facts, summarizer=summarizer)
    assert not again.changed, again.report.to_dict()
    # the next turns over the stored view (a checkpoint hit): compacted again, and no earlier
    # stub changes
    stored = orjson.loads(orjson.dumps(out))
    later = [*stored, *shopping(50)[1 + 4 * 24 :]]
    after = run(later, pipeline=pipeline, facts=facts, summarizer=summarizer)
    assert after.changed and len(summarizer.calls) == 2
    check_archive(later, after)
    check_stubs_stable(stored, after)
    # the earlier summary was folded into the new one: archived, its span in the new span
    (summary,) = (m for m in stored if DEFAULT_SUMMARY_MARKER.is_ours(m))
    assert after.archived is not None
    assert after.archived.originals[original_id(summary)] is summary
    (new_span,) = (message_mark(m) for m in after.messages if DEFAULT_SUMMARY_MARKER.is_ours(m))
    assert new_span is not None and message_mark(summary) in after.archived.spans[new_span]


# ------------------------------------------------------------------ properties


def check_archive(inputs: Sequence[Message], result: CompactionResult) -> None:
    """Every input message the output lacks is archived (or a stub whose id stays reachable);
    every mark in the output names what this run archived or what the input already named, and
    no text ends with two; the output is a valid request."""
    out = result.messages
    archived = result.archived
    if inputs:
        assert validate_messages(list(out)) is None
    present = {id(m) for m in out}
    named = set(marks(out))
    before = set(marks(inputs))
    for message in out:  # one closing mark at most: never doubled
        text = text_only(message)
        assert message_mark({"content": strip_mark(text)}) is None, text
    if not result.changed:
        assert archived is None
        return
    known = set(archived.order) if archived is not None else set()
    for message in inputs:
        if id(message) in present or is_ledger(message.get("content")):
            continue  # (a ledger rewritten: what it held was archived when it was folded)
        stub = message_mark(message)
        if stub is not None and stub.startswith("r"):  # edited again, or dropped
            assert stub in known or stub in named, stub
        else:
            assert archived is not None, message
            assert archived.originals[original_id(message)] is message
            if stub is not None:  # a span folded into a new summary or dropped
                assert stub in known or stub in before
    for recall_id in named:
        assert recall_id in known or recall_id in before, recall_id
    if archived is not None:
        assert set(archived.originals) | set(archived.spans) <= known
        for members in archived.spans.values():
            assert members and all(m in known or m in before for m in members)
        for recall_id in known:
            assert ID_PATTERN.fullmatch(recall_id)


def check_stubs_stable(first: Sequence[Message], later: CompactionResult) -> None:
    """A stub of ``first`` is in ``later``'s output byte for byte, or gone (archived), or, a
    soft-trimmed result aged into a hard clear, still under its own id."""
    now = {orjson.dumps(m) for m in later.messages}
    by_id: dict[str, list[Message]] = {}
    for message in later.messages:
        mark = message_mark(message)
        if mark is not None:
            by_id.setdefault(mark, []).append(message)
    for stub in first:
        mark = message_mark(stub)
        if mark is None or orjson.dumps(stub) in now:
            continue
        for other in by_id.get(mark, []):
            assert "[soft-trimmed: " in text_only(stub), (stub, other)


def run_sync_shape(
    msgs: Sequence[Message], strategy: Strategy | Pipeline, window: int, fallback: bool, mode: Mode
) -> CompactionResult:
    pipeline = (
        dataclasses.replace(strategy, fallback=fallback)
        if isinstance(strategy, Pipeline)
        else Pipeline((strategy,), fallback=fallback)
    )
    return run(
        msgs, pipeline=pipeline, facts=ModelFacts(window, 0), mode=mode, summarizer=FakeSummarizer()
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rich_conversations(),
    phase2_strategies(),
    st.integers(50, 20_000),
    st.booleans(),
    st.sampled_from([Mode.NORMAL, Mode.FORCE]),
)
def test_every_removed_message_is_archived_and_every_mark_resolves(
    msgs: list[Msg],
    chosen: tuple[str, Strategy | Pipeline],
    window: int,
    fallback: bool,
    mode: Mode,
) -> None:
    """Random agent conversations through every strategy and the seeds' pipelines (the
    summarizer answers), with recall on: the invariants of test_properties.py hold, the archive
    covers the output's losses, and a second run over the output, or over it plus a new step,
    keeps every stub."""
    name, strategy = chosen
    result = run_sync_shape(msgs, strategy, window, fallback, mode)
    last_resort = bool(result.report.last_resort and result.report.last_resort.changed)
    # (test_properties.py runs these without a summarizer: summaries are set aside here)
    unsummarized = [cast(Msg, m) for m in result.messages if not DEFAULT_SUMMARY_MARKER.is_ours(m)]
    check_invariants_phase2(msgs, unsummarized, media_kept=name != "clear", last_resort=last_resort)
    check_archive(msgs, result)
    out = result.messages
    again = run_sync_shape(copy.deepcopy(msgs), strategy, window, fallback, mode)
    assert orjson.dumps(again.messages) == orjson.dumps(out)  # deterministic, ids included
    second = run_sync_shape(out, strategy, window, fallback, mode)
    assert not second.changed, (name, second.report.to_dict())
    step = [
        {**call("new", name="read"), "x-id": 10_000},
        {**tool("new", "new " * 300), "x-id": 10_001},
    ]
    later = run_sync_shape([*out, *step], strategy, window, fallback, mode)
    check_archive([*out, *step], later)
    check_stubs_stable(out, later)
    spans = bool(result.archived and result.archived.spans)
    event(f"{name}: marks={bool(marks(out))}, spans={spans}")


# ------------------------------------------------------------------ the lifted wire formats


def messages_run_with_recall(
    body: dict[str, Any], strategies: tuple[Strategy, ...], window: int
) -> tuple[CompactionResult, Any]:
    """tests/messages/test_properties.py's run, with recall on; the marks a result got reach
    the lowered ``tool_result`` blocks."""
    lifted = messages_wire.lift(body)
    chat = lifted.chat_body(body)
    request = CompactionRequest(
        chat["messages"],
        model=chat["model"],
        pipeline=Pipeline(strategies),
        tokenizer=TOK,
        facts=ModelFacts(context_window=window, max_output_tokens=64),
        tools=chat.get("tools"),
        max_completion_tokens=chat.get("max_completion_tokens"),
        reserve_ratio=0.0,
        recall=IDS,
    )
    result = asyncio.run(compact_async(request, summarizer=FakeSummarizer()))
    lowered = messages_wire.lower(lifted, result.messages, body)
    lowered_text = orjson.dumps(lowered.items).decode()
    for message in result.messages:
        mark = message_mark(message)
        if mark is not None and message.get("role") == "tool":
            assert f"recall id {mark}]" in lowered_text
    return result, lowered


def responses_run_with_recall(
    items: list[Any], strategies: tuple[Strategy, ...], window: int
) -> tuple[CompactionResult, Any]:
    """tests/responses/test_properties.py's run, with recall on (and the same check)."""
    lifted = responses_wire.lift({"model": "m", "instructions": "be brief", "input": items})
    request = CompactionRequest(
        lifted.messages,
        model="m",
        pipeline=Pipeline(strategies),
        tokenizer=TOK,
        facts=ModelFacts(context_window=window, max_output_tokens=64),
        reserve_ratio=0.0,
        recall=IDS,
    )
    result = asyncio.run(compact_async(request))
    lowered = responses_wire.lower(lifted, result.messages)
    lowered_text = orjson.dumps(lowered.items).decode()
    for message in result.messages:
        mark = message_mark(message)
        if mark is not None and message.get("role") == "tool":
            assert f"recall id {mark}]" in lowered_text or "was kept as sent" in str(lowered.notes)
    return result, lowered


@pytest.mark.parametrize("name", messages_properties.KINDS)
def test_the_messages_properties_hold_with_recall(name: str, monkeypatch: Any) -> None:
    """Every property of the Messages adapter's compaction (API-valid, pairing, thinking,
    breakpoints, the proxy's own messages one text block...) with marks in the messages."""
    monkeypatch.setattr(messages_properties, "run", messages_run_with_recall)
    messages_properties.test_compacted_messages_are_ones_the_api_takes(name=name)


def test_the_responses_properties_hold_with_recall(monkeypatch: Any) -> None:
    monkeypatch.setattr(responses_properties, "run", responses_run_with_recall)
    responses_properties.test_compacted_items_keep_the_invariants()
