"""Summaries checked before they are stored (issue 30, item 3): what a summary kept of its folded
span's exact strings and rules on its own, the prohibitions it may contradict, and the path from
the summarization strategy to the report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import ModelFacts
from compaction_proxy.compaction.draft import Draft
from compaction_proxy.compaction.strategies import PipelineStrategy, SummarizationStrategy
from compaction_proxy.compaction.strategies._support.summary_record import (
    CheckItems,
    contradiction_warning,
    record_summary_check,
)
from compaction_proxy.compaction.strategies.base import StrategyOutcome
from compaction_proxy.compaction.summary_check import (
    RULES_SECTION,
    SectionCount,
    SummaryCheck,
    check_from_dict,
    check_summary,
    merge_checks,
)
from compaction_proxy.compaction.triggers import Always
from compaction_proxy.compaction.view import Group

from .helpers import a, s, u
from .summarizer_fakes import FakeSummarizer, run_async

STRINGS = (
    ("files", "src/app/config.py"),
    ("files", "tests/test_config.py"),
    ("commands", "pytest -q tests/"),
    ("errors", "KeyError: 'timeout'"),
    ("numbers", "412 ms"),
    ("urls", "https://example.test/issues/7"),
)


def counts(check: SummaryCheck) -> dict[str, tuple[int, int]]:
    return {c.section: (c.kept, c.total) for c in check.sections}


# ------------------------------------------------------------------ artifacts


def test_an_artifact_is_kept_only_as_its_exact_case_sensitive_string() -> None:
    summary = (
        "Edited src/app/config.py and ran pytest -q tests/, which failed with "
        "keyerror: 'timeout'; the call took 412ms."
    )
    check = check_summary(summary, STRINGS, ())
    assert counts(check) == {
        "files": (1, 2),
        "commands": (1, 1),
        "errors": (0, 1),  # another case
        "urls": (0, 1),
        "numbers": (0, 1),  # "412ms" is not "412 ms"
    }
    assert (check.kept, check.total) == (2, 6)
    assert check.section("files") == SectionCount("files", 1, 2)
    assert check.section("open") is None
    assert check.contradictions == ()


def test_sections_are_listed_in_the_ledger_order_and_duplicates_count_once() -> None:
    strings = [
        ("custom", "x"),
        ("numbers", "3 s"),
        ("files", "a.py"),
        ("files", "a.py"),
        ("errors", ""),
    ]
    check = check_summary("a.py took 3 s", strings, ["Always run the tests."])
    assert [c.section for c in check.sections] == ["files", "numbers", RULES_SECTION, "custom"]
    assert counts(check)["files"] == (1, 1)
    assert "errors" not in counts(check)  # an empty string is not counted


def test_a_summary_that_copies_nothing_keeps_nothing() -> None:
    check = check_summary("Made progress on the configuration bug.", STRINGS, ())
    assert (check.kept, check.total) == (0, len(STRINGS))


# ------------------------------------------------------------------ rules kept


def test_a_rule_is_kept_verbatim() -> None:
    rule = "Never edit files under vendor/."
    check = check_summary(f"Rules: {rule} Progress: fixed the parser.", (), [rule])
    assert counts(check) == {RULES_SECTION: (1, 1)}
    assert check.contradictions == ()


def test_a_rule_is_kept_by_its_key_words_in_one_sentence() -> None:
    rules = ["Always run pytest before committing.", "Update the changelog for every change."]
    summary = "The agent runs pytest before committing. Every change updates the changelog."
    assert counts(check_summary(summary, (), rules)) == {RULES_SECTION: (2, 2)}
    # the key words spread over two sentences do not keep it
    apart = "Ran pytest. Committing came later, before lunch."
    assert counts(check_summary(apart, (), rules[:1])) == {RULES_SECTION: (0, 1)}


def test_a_prohibition_is_kept_by_key_words_only_with_its_negation() -> None:
    rule = "Don't modify the tests."
    assert counts(check_summary("Tests were not modified.", (), [rule]))[RULES_SECTION] == (1, 1)
    assert counts(check_summary("Modified the tests.", (), [rule]))[RULES_SECTION] == (0, 1)


# ------------------------------------------------------------------ contradictions


def test_a_summary_that_drops_the_never_contradicts_the_rule() -> None:
    rules = [
        "Never force-push to main.",
        "Do not modify the tests.",
        "No emojis in commit messages",
        "You must not delete the production database",
    ]
    summary = (
        "I force-pushed the fix to main and modified the tests so they pass.\n"
        "- Commit messages now carry emojis\n"
        "Deleted the production database to start fresh"
    )
    check = check_summary(summary, (), rules)
    assert check.contradictions == tuple(rules)
    assert counts(check) == {RULES_SECTION: (0, 4)}


def test_a_summary_restating_or_keeping_the_rule_is_no_contradiction() -> None:
    rules = [
        "Never force-push to main.",
        "Do not modify the tests.",
        "don\u2019t run migrations in production",
    ]
    guards = [
        "Never force-push to main.",  # restated verbatim
        "The user said never to force-push to main; the tests must not be modified.",
        "Force-pushing to main is forbidden, so the fix went to a branch.",
        "Did not modify the tests. Migrations were not run in production.",
        "We avoided modifying the tests and pushed to a branch instead of main.",
        "Main was not touched. Tests: left as they were.",
        "Ran migrations against the staging database.",  # not every act: no "production"
    ]
    for summary in guards:
        assert check_summary(summary, (), rules).contradictions == (), summary


def test_only_a_prohibition_can_be_contradicted() -> None:
    rules = ["Always run the tests.", "Make sure there are no failing tests"]
    check = check_summary("Fixed the failing tests, running the tests again.", (), rules)
    assert check.contradictions == ()
    assert counts(check) == {RULES_SECTION: (2, 2)}


def test_the_acts_of_a_prohibition_are_the_words_after_it() -> None:
    rule = "When you refactor, never touch the vendor directory."
    # "refactor" is the rule's condition, not what it forbids
    assert check_summary("Touched the vendor directory.", (), [rule]).contradictions == (rule,)


def test_a_rule_without_key_words_is_kept_only_verbatim_and_never_contradicted() -> None:
    rule = "Never do that."
    check = check_summary("Did that again.", (), [rule])
    assert check.contradictions == ()
    assert counts(check) == {RULES_SECTION: (0, 1)}


# ------------------------------------------------------------------ merged, properties


def test_merged_checks_add_per_section_and_list_each_contradiction_once() -> None:
    one = SummaryCheck(
        (SectionCount("files", 1, 2), SectionCount(RULES_SECTION, 0, 1)), ("Never X y.",)
    )
    two = SummaryCheck(
        (SectionCount("files", 2, 2), SectionCount("commands", 0, 3)), ("Never X y.",)
    )
    merged = merge_checks([one, two])
    assert counts(merged) == {"files": (3, 4), "commands": (0, 3), RULES_SECTION: (0, 1)}
    assert merged.contradictions == ("Never X y.",)
    assert merge_checks([]) == SummaryCheck()
    assert merged.to_dict()["sections"]["files"] == {"kept": 3, "total": 4}


def test_a_check_reads_back_from_its_dict_and_nothing_else_reads_as_one() -> None:
    check = check_summary("Force-pushed a.py to main.", STRINGS[:2], ["Never force-push."])
    assert check_from_dict(check.to_dict()) == check
    assert check_from_dict(SummaryCheck().to_dict()) == SummaryCheck()
    bad_values: list[object] = [
        None,
        [],
        {"sections": []},
        {"sections": {"files": {"kept": 3, "total": 2}}},
        {"sections": {"files": {"kept": "1", "total": 2}}},
        {"sections": {}, "contradictions": [1]},
        {"sections": {}, "contradictions": "Never"},
    ]
    for bad in bad_values:
        assert check_from_dict(bad) is None, bad


_TEXT = st.text(alphabet=st.sampled_from("ab .;\nnever not Don't x/y.py"), max_size=60)


@settings(max_examples=150, deadline=None)
@given(
    summary=_TEXT,
    strings=st.lists(
        st.tuples(st.sampled_from(["files", "commands", "numbers", "odd"]), _TEXT), max_size=8
    ),
    rules=st.lists(_TEXT, max_size=5),
)
def test_the_check_is_deterministic_and_bounded(
    summary: str, strings: list[tuple[str, str]], rules: list[str]
) -> None:
    check = check_summary(summary, strings, rules)
    assert check == check_summary(summary, list(strings), list(rules))
    assert all(0 <= c.kept <= c.total for c in check.sections)
    assert check.total <= len(strings) + len(rules)
    assert set(check.contradictions) <= set(rules)
    assert 0 <= check.kept <= check.total
    # a summary that copies everything keeps everything
    everything = "\n".join([*(text for _, text in strings), *rules])
    copied = check_summary(everything, strings, rules)
    assert copied.kept == copied.total == check.total


# ------------------------------------------------------------------ recorded on the report


def test_the_record_helper_attaches_the_check_and_one_warning_per_contradiction() -> None:
    outcome = StrategyOutcome(changed=True, notes=("summarized",))
    assert record_summary_check(outcome, "anything", CheckItems()) is outcome
    rule = "Never force-push to main. " + "Really, " * 40
    recorded = record_summary_check(
        outcome, "Force-pushed to main.", CheckItems([("files", "a.py")], [rule])
    )
    (check,) = recorded.summary_checks
    assert counts(check) == {"files": (0, 1), RULES_SECTION: (0, 1)}
    assert recorded.warnings == (contradiction_warning(rule),)
    warning = recorded.warnings[0]
    assert warning.startswith('summary may contradict a rule: "Never force-push to main.')
    assert warning.endswith('..."') and len(warning) < 170


class _Checked(SummarizationStrategy):
    """A summarization strategy given its span's strings and rules by hand (the ledger's
    place)."""

    def __init__(self, items: CheckItems, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items = items
        self.seen: list[Sequence[Group]] = []

    def check_items(self, draft: Draft, folded: Sequence[Group]) -> CheckItems:
        self.seen.append(folded)
        return self.items


def _conversation() -> list[dict[str, Any]]:
    work = "Opened src/app/config.py; pytest -q failed with KeyError: 'timeout'. " * 20
    return [
        s(),
        u("Fix the config bug. Never force-push to main."),
        a(work),
        u("go on"),
        a(work),
        u("u3"),
        a("a3"),
        u("u4"),
    ]


ITEMS = CheckItems(
    [("files", "src/app/config.py"), ("commands", "pytest -q"), ("errors", "KeyError: 'timeout'")],
    ["Never force-push to main."],
)


async def test_a_stored_summary_carries_its_check_to_the_compaction_report() -> None:
    strategy = _Checked(ITEMS, trigger=Always())
    summary = "Fixing src/app/config.py. Force-pushed the work to main."
    result = await run_async(strategy, _conversation(), FakeSummarizer(summary))
    assert result.changed and len(strategy.seen) == 1
    report = result.report
    (check,) = report.summary_checks
    assert counts(check) == {"files": (1, 1), "commands": (0, 1), "errors": (0, 1), "rules": (0, 1)}
    assert report.summary_kept == check
    assert report.strategies[0].summary_checks == (check,)
    assert contradiction_warning("Never force-push to main.") in report.warnings
    as_json = report.to_dict()
    assert as_json["summary_checks"] == [check.to_dict()]
    assert as_json["strategies"][0]["summary_checks"] == [check.to_dict()]


async def test_a_nested_summary_is_checked_and_its_warning_reported_too() -> None:
    nested = PipelineStrategy([_Checked(ITEMS, trigger=Always())])
    result = await run_async(nested, _conversation(), FakeSummarizer("Force-pushed to main."))
    (check,) = result.report.summary_checks
    assert check.kept == 0 and check.total == 4
    assert contradiction_warning("Never force-push to main.") in result.report.warnings


async def test_no_check_without_items_or_when_the_summary_is_not_stored() -> None:
    plain = await run_async(
        _Checked(CheckItems(), trigger=Always()), _conversation(), FakeSummarizer("the gist")
    )
    assert plain.changed and plain.report.summary_checks == ()
    assert plain.report.summary_kept is None
    # the built-in strategy checks its span's ledger strings (here a path and a rule)
    builtin = await run_async(
        SummarizationStrategy(trigger=Always()), _conversation(), FakeSummarizer("the gist")
    )
    (check,) = builtin.report.summary_checks
    assert counts(check) == {"files": (0, 1), "rules": (0, 1)}
    # a summary that is not shorter than its span is not stored, so not checked
    strategy = _Checked(ITEMS, trigger=Always())
    long = await run_async(
        strategy, _conversation(), FakeSummarizer("x " * 2000), facts=ModelFacts(10**6, 0)
    )
    assert long.report.failures and long.report.summary_checks == ()
