"""``X-Compaction: force`` asks for the event a normal run makes, never a weaker one.

Force treats every trigger as fired. Summarization then folds as a normal run does: towards
its target (a target left implicit is its trigger's, not the ``always`` a forced strategy
compacts to), so on a request over the trigger a forced run is the normal run, summary of the
older steps of an agent loop included. Whenever a forced run still makes no summary while it
drops groups, a warning says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionResult,
    CompactionSettings,
    Mode,
    ModelFacts,
    Pipeline,
    build_pipeline,
    compact,
    compact_async,
)

from .helpers import a, call, s, tool, u
from .summarizer_fakes import FakeSummarizer

TOK = CharacterEstimatorTokenizer()
FORCED_WITHOUT_SUMMARY = "X-Compaction: force made no summary"


def two_turn_loop(steps: int = 21) -> list[dict[str, Any]]:
    """An agent's task and its tool steps, the answer, then a follow-up: two user turns, the
    older one holding every step."""
    msgs = [s(), u("fix the failing tests")]
    for n in range(steps):
        msgs += [call(f"c{n}", name="run"), tool(f"c{n}", f"step {n} " + "y" * 400)]
    return [*msgs, a("all green now"), u("now commit it")]


def run(
    msgs: list[dict[str, Any]],
    pipeline: Pipeline,
    window: int,
    mode: Mode,
    summarizer: FakeSummarizer | None,
) -> CompactionResult:
    request = CompactionRequest(
        msgs,
        model="m",
        pipeline=pipeline,
        tokenizer=TOK,
        facts=ModelFacts(window, 0),
        reserve_ratio=0,
        mode=mode,
    )
    if summarizer is None:
        return compact(request)
    return asyncio.run(compact_async(request, summarizer=summarizer))


def changed_by(result: CompactionResult) -> list[str]:
    return list(result.report.changed_by)


def test_force_on_a_two_turn_agent_loop_summarizes_as_the_trigger_does() -> None:
    """Over the trigger the forced run is the normal one: the task's steps are summarized, not
    truncated. Before, force folded only what ``retainRecent`` (2 turns) left, which here is
    nothing ("nothing to summarize before the kept turns"), and truncation dropped the steps
    without a summary or a word."""
    msgs = two_turn_loop()
    pipeline = build_pipeline(CompactionSettings())
    window = int(TOK.count_messages(msgs) / 1.3)  # the request is at 130% of its budget
    normal_summarizer, forced_summarizer = FakeSummarizer(), FakeSummarizer()
    normal = run(msgs, pipeline, window, Mode.NORMAL, normal_summarizer)
    forced = run(msgs, pipeline, window, Mode.FORCE, forced_summarizer)
    assert "summarization" in changed_by(normal) and len(normal_summarizer.calls) == 1
    assert "summarization" in changed_by(forced), forced.report.to_dict()
    assert "truncation" not in changed_by(forced)
    assert len(forced_summarizer.calls) == 1
    assert forced.messages == normal.messages
    assert forced.report.tokens_after == normal.report.tokens_after
    assert not any(FORCED_WITHOUT_SUMMARY in w for w in forced.report.warnings)
    # under the trigger, force compacts towards the target as the event would from there
    # (here the collapse reaches it), and drops nothing unsummarized
    between = run(msgs, pipeline, int(TOK.count_messages(msgs) / 0.7), Mode.FORCE, FakeSummarizer())
    assert between.changed and between.report.tokens_after <= 0.5 * between.report.budget
    assert not {"truncation", "fallback_truncation"} & set(changed_by(between))
    assert not any(FORCED_WITHOUT_SUMMARY in w for w in between.report.warnings)


def test_force_keeps_an_implicit_target_at_the_triggers_for_the_fold() -> None:
    """The Agent Framework's .NET pipeline (each entry by its own trigger, targets implicit):
    forced, summarization folds what its trigger asks (the request back under 0x500 tokens),
    as the normal run over that trigger does."""
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {"strategy": "summarization", "trigger": {"tokens_exceed": 0x500}},
                {"strategy": "truncation", "trigger": {"tokens_exceed": 0x8000}},
            ]
        }
    )
    pipeline = build_pipeline(settings)
    msgs = two_turn_loop(30)
    window = 10 * TOK.count_messages(msgs)
    normal = run(msgs, pipeline, window, Mode.NORMAL, FakeSummarizer())
    forced = run(msgs, pipeline, window, Mode.FORCE, FakeSummarizer())
    assert "summarization" in changed_by(normal)
    assert forced.messages == normal.messages


def test_a_forced_run_that_drops_groups_without_a_summary_says_so() -> None:
    """Force can still end up with less than a summary: a forced sliding window before
    summarization keeps only the newest turn (its implicit target becomes ``always``), so there
    is nothing left to fold; or there is no summarizer. The groups dropped unsummarized are
    named in a warning; a normal run of the same pipeline says nothing of the kind."""
    settings = CompactionSettings.model_validate(
        {
            "pipeline": [
                {"strategy": "sliding_window", "trigger": {"turns_exceed": 4}},
                {"strategy": "summarization", "trigger": {"tokens_exceed": 100_000}},
            ]
        }
    )
    window_first = build_pipeline(settings)
    msgs = two_turn_loop()
    big = 10 * TOK.count_messages(msgs)
    forced = run(msgs, window_first, big, Mode.FORCE, FakeSummarizer())
    assert "sliding_window" in changed_by(forced)
    assert "summarization" not in changed_by(forced)
    (warning,) = [w for w in forced.report.warnings if FORCED_WITHOUT_SUMMARY in w]
    assert "nothing to summarize" in warning and "group(s) were dropped without one" in warning
    normal = run(msgs, window_first, big, Mode.NORMAL, FakeSummarizer())
    assert not any(FORCED_WITHOUT_SUMMARY in w for w in normal.report.warnings)
    # the default pipeline with no summarizer at hand (the synchronous core, a CLI offline)
    window = int(TOK.count_messages(msgs) / 1.3)
    offline = run(msgs, build_pipeline(CompactionSettings()), window, Mode.FORCE, None)
    assert {"truncation", "fallback_truncation"} & set(changed_by(offline))
    (warning,) = [w for w in offline.report.warnings if FORCED_WITHOUT_SUMMARY in w]
    assert "summarizer not available" in warning
    # a forced run whose summary was made drops nothing unsummarized: no warning
    made = run(msgs, build_pipeline(CompactionSettings()), window, Mode.FORCE, FakeSummarizer())
    assert not any(FORCED_WITHOUT_SUMMARY in w for w in made.report.warnings)
