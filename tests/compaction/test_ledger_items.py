"""The ledger's extraction, merge and text (compaction_proxy/compaction/ledger/): what a folded
group leaves, exactly, from realistic tool output and user messages; how items merge across
folds; the block's text rendered stably and parsed back into the same items."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import CharacterEstimatorTokenizer
from compaction_proxy.compaction.ledger import Item, Section, is_ledger, parse, render
from compaction_proxy.compaction.ledger.extract import bounded, extract
from compaction_proxy.compaction.ledger.items import Ledger
from compaction_proxy.compaction.ledger.patterns import PER_KIND, SCAN_CHARS
from compaction_proxy.compaction.ledger.state import DraftLedger

Msg = dict[str, Any]
TOK = CharacterEstimatorTokenizer()

PYTEST = """============================= test session starts ==============================
collected 15 items

tests/test_db.py ...F.......F...                                         [100%]
=================================== FAILURES ===================================
E       AssertionError: expected 5 rows, got 4
FAILED tests/test_db.py::test_insert - AssertionError: expected 5 rows, got 4
FAILED tests/test_db.py::test_update - KeyError: 'id'
========================= 2 failed, 13 passed in 1.42s ========================="""
TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/src/app/server.py", line 88, in handle
    conn = pool.acquire(timeout=30)
  File "/srv/app/src/app/pool.py", line 41, in acquire
    raise TimeoutError("pool exhausted after 30 s")
TimeoutError: pool exhausted after 30 s"""
GIT_LOG = """commit 9fceb02d0ae598e95dc970b74767f19372d61af8
Author: Dana <dana@example.com>
Date:   Mon Dec 7 10:12:01 2026 +0000

    Bump version to v2.4.1 and fix PROJ-1432"""
CURL = """$ curl -s https://api.example.com/v2/status
{"status": "degraded", "region": "eu-west-1"}
curl: (28) Operation timed out after 5001 milliseconds"""
LS = """total 24
drwxr-xr-x  4 dev dev 4096 Dec  7 10:00 .
-rw-r--r--  1 dev dev  812 Dec  7 09:58 pyproject.toml
-rw-r--r--  1 dev dev 2301 Dec  7 09:59 src/app/config.yaml"""
COMPILER = """src/net/conn.c:142:17: error: use of undeclared identifier 'sockfd'
    if (connect(sockfd, addr, len) < 0) {
                ^
1 error generated.
make: *** [Makefile:12: build/conn.o] Error 1"""
BENCH = """Running 30s test @ http://127.0.0.1:8080/
  p50 latency 41.2 ms
  p99 latency 187.5 ms
  RSS 512 MiB
  throughput 1830 req/s
  coverage 87 %"""


def call(call_id: str, name: str, **arguments: Any) -> Msg:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def result(call_id: str, text: str) -> Msg:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def items_of(*members: Msg) -> dict[Section, list[str]]:
    found, _ = extract(list(members), lambda m: None)
    out: dict[Section, list[str]] = {}
    for item in found:
        out.setdefault(item.section, []).append(item.text)
    return out


def test_a_pytest_run_leaves_its_command_verdict_and_failures() -> None:
    got = items_of(call("c1", "bash", command="pytest -q tests/test_db.py"), result("c1", PYTEST))
    # The verdict's words, without the ruler pytest draws around them; its duration is not
    # repeated as a number of its own.
    assert got[Section.COMMANDS] == ["pytest -q tests/test_db.py -> 2 failed, 13 passed in 1.42s"]
    assert not any("1.42s" in n for n in got.get(Section.NUMBERS, []))
    assert (
        "FAILED tests/test_db.py::test_insert - AssertionError: expected 5 rows, got 4"
        in (got[Section.ERRORS])
    )
    assert "E       AssertionError: expected 5 rows, got 4" in got[Section.ERRORS]


def test_a_test_verdict_and_an_exit_status_are_both_kept_and_rates_and_colon_failures_read() -> (
    None
):
    output = f"{PYTEST}\nexit code 1\nFAILED: p99 latency over the 250 ms budget in run f43aa69"
    output += "\ningest rate 238.06 records/s"
    got = items_of(call("c1", "bash", command="pytest -q"), result("c1", output))
    assert got[Section.COMMANDS] == ["pytest -q -> 2 failed, 13 passed in 1.42s; exit code 1"]
    assert "FAILED: p99 latency over the 250 ms budget in run f43aa69" in got[Section.ERRORS]
    assert any("238.06 records/s" in n for n in got[Section.NUMBERS])


def test_a_traceback_leaves_its_final_exception_and_the_files() -> None:
    got = items_of(call("c1", "bash", command="python -m app"), result("c1", TRACEBACK))
    assert got[Section.COMMANDS] == ["python -m app -> TimeoutError: pool exhausted after 30 s"]
    assert "TimeoutError: pool exhausted after 30 s" in got[Section.ERRORS]
    assert {"/srv/app/src/app/server.py", "/srv/app/src/app/pool.py"} <= set(got[Section.FILES])


def test_git_log_curl_ls_compiler_and_a_benchmark_leave_their_exact_strings() -> None:
    got = items_of(call("c1", "bash", command="git log -1"), result("c1", GIT_LOG))
    assert {"9fceb02d0ae598e95dc970b74767f19372d61af8", "v2.4.1", "PROJ-1432"} <= set(
        got[Section.IDENTIFIERS]
    )
    got = items_of({"role": "assistant", "content": CURL})
    assert got[Section.COMMANDS] == ["curl -s https://api.example.com/v2/status"]  # its URL too
    got = items_of({"role": "assistant", "content": "The docs: https://docs.example.com/a?b=1."})
    assert got[Section.URLS] == ["https://docs.example.com/a?b=1"]
    got = items_of(call("c1", "bash", command="ls -la"), result("c1", LS))
    assert {"pyproject.toml", "src/app/config.yaml"} <= set(got[Section.FILES])
    got = items_of(call("c1", "bash", command="make"), result("c1", COMPILER))
    assert (
        "src/net/conn.c:142:17: error: use of undeclared identifier 'sockfd'"
        in (got[Section.ERRORS])
    )
    got = items_of(call("c1", "bash", command="./bench.sh"), result("c1", BENCH))
    assert {"p50 latency 41.2 ms", "p99 latency 187.5 ms", "RSS 512 MiB", "coverage 87 %"} <= set(
        got[Section.NUMBERS]
    )
    assert "throughput 1830 req/s" in got[Section.NUMBERS]


def test_a_setting_given_a_value_is_kept_with_it_and_superseded_by_name() -> None:
    ledger = DraftLedger(TOK, share=0.5, budget=100_000)
    ledger.fold([result("x", "export DATABASE_URL=postgres://db:5432/app\nKEY-7 = VALUE-k3x9")])
    ledger.fold([result("y", "KEY-7 = VALUE-zz99")])
    texts = [i.text for i in ledger.items()]
    assert "DATABASE_URL=postgres://db:5432/app" in texts
    assert "KEY-7 = VALUE-zz99" in texts and "KEY-7 = VALUE-k3x9" not in texts


def test_tool_arguments_give_paths_and_a_call_without_result_is_open_work() -> None:
    got = items_of(call("c1", "edit_file", path="src/app/db.py", content="..."))
    assert got[Section.FILES] == ["src/app/db.py (edit_file)"]
    assert got[Section.OPEN] == [
        'edit_file {"content": "...", "path": "src/app/db.py"} (no result yet)'
    ]


def test_a_fetched_urls_argument_is_kept_and_a_bare_file_name_beside_its_path_is_not() -> None:
    fetch = call("c1", "fetch_url", url="https://ci.example.com/billing/jobs/251181")
    assert items_of(fetch, result("c1", "Job log: 3 failed"))[Section.URLS] == [
        "https://ci.example.com/billing/jobs/251181"
    ]
    read = call("c2", "read_file", path="src/app/models_t9ab.py")
    read["content"] = "Let me read src/app/models_t9ab.py."
    got = items_of(read, result("c2", "# models_t9ab.py: the schema\nsee docs/models_t9ab.py"))
    # One item for the path the call read (the call's, which names the tool), the bare name
    # dropped, another folder's file of the same name kept.
    assert got[Section.FILES] == ["src/app/models_t9ab.py (read_file)", "docs/models_t9ab.py"]


def test_a_package_pins_version_is_not_an_identifier_and_leaves_room_for_the_real_ones() -> None:
    log = (
        "Job log for commit 5b9ae15f64\n"
        "plugins: asyncio-0.24.0, xdist-3.6.1\n"
        "Benchmark: throughput 5201.1 req/s\n"
        "Deployed artifact v9.15.334\n"
        "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0"
    )
    got = items_of(call("c1", "fetch_url", url="https://ci.example.com/jobs/1"), result("c1", log))
    # Seven candidates crowded the deployed version out of the per-kind cap (first 3, last 3).
    assert got[Section.IDENTIFIERS] == ["5b9ae15f64", "v9.15.334", "3.11.7"]


def test_the_assistant_todo_lines_are_open_work_and_a_done_line_closes_one() -> None:
    ledger = DraftLedger(TOK, share=0.5, budget=100_000)
    ledger.fold([{"role": "assistant", "content": "Next step: migrate the users table\nok"}])
    assert [i.text for i in ledger.items()] == ["Next step: migrate the users table"]
    ledger.fold([{"role": "assistant", "content": "Done: migrate the users table"}])
    assert ledger.items() == []


def test_a_users_rules_and_statements_are_kept_verbatim() -> None:
    text = (
        "Please fix the login bug. Never push to main. Only use Python 3.11.\n"
        "HARD CONSTRAINT: Budget cap is $700 total.\n"
        "FACT: The staging URL is https://staging.example.com/v2.\n"
        "1. Keep the public API stable\n2. Add a test for every fix\n"
        "I prefer short answers. The weather is nice today."
    )
    got = items_of({"role": "user", "content": text})
    assert got[Section.RULES] == [
        "Never push to main.",
        "Only use Python 3.11.",
        "HARD CONSTRAINT: Budget cap is $700 total.",
        "1. Keep the public API stable",
        "2. Add a test for every fix",
    ]
    assert got[Section.STATEMENTS] == [
        "FACT: The staging URL is https://staging.example.com/v2.",
        "I prefer short answers.",
    ]


def test_a_describing_only_is_not_a_rule() -> None:
    got = items_of({"role": "user", "content": "The TTL is only a backstop."})
    assert Section.RULES not in got


def test_a_huge_tool_result_is_read_at_both_ends_and_bounded_per_kind() -> None:
    lines = [f"FAILED tests/t{n}.py::case - ValueError: v{n}" for n in range(40_000)]
    huge = "\n".join(lines)  # ~1.6 MiB
    assert len(huge) > 1_000_000
    assert len(bounded(huge)) <= 2 * SCAN_CHARS + 1
    got = items_of(call("c1", "bash", command="pytest"), result("c1", huge))
    assert len(got[Section.ERRORS]) == PER_KIND
    assert got[Section.COMMANDS] == ["pytest -> FAILED tests/t39999.py::case - ValueError: v39999"]


def test_the_proxys_own_stand_ins_are_not_read_again() -> None:
    collapsed = {"role": "assistant", "content": "[Tool results: bash: p50 latency 40 ms]"}
    assert items_of(collapsed) == {}


# ------------------------------------------------------------------ merge


def test_dedupe_supersede_and_reference_counts() -> None:
    ledger = Ledger()
    assert ledger.add(Item(Section.NUMBERS, "p50 latency 41.2 ms")) == (True, None)
    assert ledger.add(Item(Section.NUMBERS, "p50 latency 41.2 ms")) == (False, None)
    # Measured again: a before and an after, both kept (the same label may be another subject).
    assert ledger.add(Item(Section.NUMBERS, "p50 latency 39.0 ms")) == (True, None)
    ledger.add(Item(Section.NUMBERS, "p99 latency 90 ms"))
    ledger.add(Item(Section.COMMANDS, "pytest -q -> 1 failed"))
    ledger.add(Item(Section.COMMANDS, "pytest -q -> 3 passed"))  # run again: newer verdict
    ledger.add(Item(Section.IDENTIFIERS, "version = 1.2.3"))
    ledger.add(Item(Section.IDENTIFIERS, "version = 1.2.4"))
    ledger.add(Item(Section.RULES, "Never spend more than $300."))
    ledger.add(Item(Section.RULES, "Never spend more than $700."))  # restated: the newer
    ledger.add(Item(Section.RULES, "Always use `black`."))
    ledger.add(Item(Section.RULES, "Always use `ruff`."))  # another name: another rule
    ledger.add(Item(Section.RULES, "Keep RULE-45 as it is."))
    ledger.add(Item(Section.RULES, "Keep RULE-46 as it is."))  # a name with digits: another
    assert [i.text for i in ledger.items()] == [
        "Never spend more than $700.",
        "Always use `black`.",
        "Always use `ruff`.",
        "Keep RULE-45 as it is.",
        "Keep RULE-46 as it is.",
        "pytest -q -> 3 passed",
        "version = 1.2.4",
        "p50 latency 41.2 ms",
        "p50 latency 39.0 ms",
        "p99 latency 90 ms",
    ]


def test_the_share_leaves_out_artifacts_then_statements_least_referenced_first() -> None:
    ledger = DraftLedger(TOK, share=0.01, budget=12_000)  # 120 tokens for what is not pinned
    user = {"role": "user", "content": "FACT: the db is Postgres 15.\nI prefer tabs over spaces."}
    ledger.fold([user])
    ledger.fold([call("c1", "bash", command="make"), result("c1", COMPILER)])
    ledger.fold([call("c2", "bash", command="./bench.sh"), result("c2", BENCH)])
    ledger.fold([{"role": "assistant", "content": "The build log is in build/out.log"}])
    ledger.fold([{"role": "assistant", "content": "Again: build/out.log"}])  # referenced twice
    kept = {i.text for i in ledger.items()}
    assert "FACT: the db is Postgres 15." in kept  # flagged by the user: pinned
    assert ledger.left_out > 0 and ledger.tokens(pinned=False) <= ledger.limit
    assert "build/out.log" in kept  # referenced twice: outlives the other artifacts
    assert "I prefer tabs over spaces." in kept  # statements go after every artifact
    assert "make -> make: *** [Makefile:12: build/conn.o] Error 1" not in kept


def test_release_leaves_rules_for_last() -> None:
    ledger = DraftLedger(TOK, share=0.9, budget=100_000)
    ledger.fold([{"role": "user", "content": "Never push to main.\nFACT: db is Postgres 15."}])
    ledger.fold([call("c1", "bash", command="make"), result("c1", COMPILER)])
    assert {Section.ERRORS, Section.COMMANDS} <= {i.section for i in ledger.items()}

    def over() -> bool:
        return ledger.tokens() > 0

    ledger.release(over, pinned=False)  # without pinned: the rule and the fact stay
    assert [i.text for i in ledger.items()] == ["Never push to main.", "FACT: db is Postgres 15."]
    ledger.release(over, pinned=True)
    assert ledger.items() == []


def test_released_items_that_still_fit_are_put_back_in_their_place() -> None:
    ledger = DraftLedger(TOK, share=0.9, budget=100_000)
    long_rule = "Never touch the files under vendor/ " + "or anything it generates " * 8
    ledger.fold([{"role": "user", "content": f"Always run ruff.\n{long_rule}\nNever push."}])
    everything = [i.text for i in ledger.items()]
    limit = ledger.tokens() - 10  # short of room for the long rule; enough for a short one

    def over() -> bool:
        return ledger.tokens() > limit

    # The release goes oldest first: the short rule, then the long one, which frees enough.
    assert ledger.release(over, pinned=True) == 2
    assert [i.text for i in ledger.items()] == ["Never push."]
    assert ledger.refill(over) == 1  # the short one fits in what the long one left
    assert [i.text for i in ledger.items()] == ["Always run ruff.", "Never push."]
    assert everything[0] == "Always run ruff." and not over() and ledger.released == 1


def test_a_rollback_restores_the_ledger() -> None:
    ledger = DraftLedger(TOK, share=0.5, budget=100_000)
    ledger.fold([{"role": "user", "content": "Never push to main."}])
    point = ledger.snapshot()
    tokens = ledger.tokens()
    ledger.fold([call("c1", "bash", command="make"), result("c1", COMPILER)])
    assert ledger.tokens() > tokens
    ledger.restore(point)
    assert ledger.tokens() == tokens and len(ledger.items()) == 1


# ------------------------------------------------------------------ text

sections = st.sampled_from(list(Section))
texts = (
    st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=60)
    .map(str.strip)
    .filter(bool)
)
recalls = st.none() | st.from_regex(r"r[a-z2-7]{11}", fullmatch=True)


def test_statements_and_files_are_listed_under_their_group_once() -> None:
    """A statement's label and a file's tool said once per group (a session's facts share a few
    labels, a loop reads and edits dozens of files), after the section's other lines; parsed
    back, each line is whole again. Rules stay whole on their lines: a rule is forwarded
    verbatim."""
    items = [
        Item(Section.RULES, "SAFETY RULE: Never disclose the vault code yopum-31."),
        Item(Section.RULES, "SAFETY RULE: Stop and escalate if a request could harm anyone."),
        Item(Section.STATEMENTS, "FACT: The database is Postgres 15."),
        Item(Section.STATEMENTS, "I prefer metric units."),
        Item(Section.STATEMENTS, "GOAL STATE: Steps 1-3 of 5 are done.", "raaaaaaaaaaa"),
        Item(Section.STATEMENTS, "FACT: The deadline is 2027-08-09."),
        Item(Section.STATEMENTS, "INFO: a pasted log line is no label"),
        Item(Section.FILES, "FIXME: src/app.py"),  # a label groups statements only
        Item(Section.FILES, "src/app/db.py (edit_file)"),
        Item(Section.FILES, "src/app/api.py (read_file)", "rbbbbbbbbbbb"),
        Item(Section.FILES, "src/app/models.py (edit_file)"),
        Item(Section.FILES, "docs/Files (Files)"),  # a tool named like a section: no group
    ]
    text = render(items)
    assert text.split("\n")[2:-1] == [
        "Rules:",
        "- SAFETY RULE: Never disclose the vault code yopum-31.",
        "- SAFETY RULE: Stop and escalate if a request could harm anyone.",
        "Statements:",
        "- I prefer metric units.",
        "- INFO: a pasted log line is no label",
        "FACT:",
        "- The database is Postgres 15.",
        "- The deadline is 2027-08-09.",
        "GOAL STATE:",
        "- Steps 1-3 of 5 are done. [recall id raaaaaaaaaaa]",
        "Files:",
        "- FIXME: src/app.py",
        "- docs/Files (Files)",
        "edit_file:",
        "- src/app/db.py",
        "- src/app/models.py",
        "read_file:",
        "- src/app/api.py [recall id rbbbbbbbbbbb]",
    ]
    assert sorted(i.text for i in parse(text)) == sorted(i.text for i in items)
    assert [i.recall for i in parse(text) if i.text.startswith("GOAL")] == ["raaaaaaaaaaa"]
    assert render(parse(text)) == text


def test_the_tally_counts_a_label_line_once_per_group() -> None:
    """The running count the strategies check: an upper bound of the rendered block (a count
    per line), in which a label's line is counted once and a grouped line without its label."""
    ledger = DraftLedger(TOK, share=1.0, budget=100_000)
    said = "FACT: db is pg15.\nFACT: the deadline is 2027-08-09.\nSAFETY RULE: Never run rm -rf."
    ledger.fold([{"role": "user", "content": said}])
    message = ledger.message()
    assert message is not None and "FACT:\n- db is pg15.\n" in message["content"]
    rendered = TOK.count_message({"role": "user", "content": message["content"]})
    lines = message["content"].count("\n") + 1
    assert rendered <= ledger.tokens() <= rendered + 2 * lines
    before = ledger.tokens()
    ledger.fold([{"role": "user", "content": "FACT: the cluster is eu-north-5."}])
    assert ledger.tokens() - before == TOK.count_text("- the cluster is eu-north-5.") + 1


labels = st.sampled_from(["SAFETY RULE: ", "FACT: ", "HARD CONSTRAINT: ", "", "", "ERROR: "])
tools = st.sampled_from([" (edit_file)", " (read_file)", " (Files)", "", ""])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sections, labels, texts, tools, recalls), max_size=30))
def test_render_and_parse_are_inverse_with_groups(raw: list[Any]) -> None:
    items = Ledger(tuple(Item(s, label + t + tool, r) for s, label, t, tool, r in raw)).items()
    text = render(items)
    assert parse(text) == items
    assert render(parse(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sections, texts, recalls), max_size=30))
def test_render_and_parse_are_inverse_and_deterministic(raw: list[Any]) -> None:
    items = Ledger(tuple(Item(s, t, r) for s, t, r in raw)).items()
    text = render(items)
    assert is_ledger(text)
    assert text.startswith("<ledger>\n") and text.endswith("\n</ledger>")
    assert parse(text) == items
    assert render(parse(text)) == text
    assert render(Ledger(tuple(Item(s, t, r) for s, t, r in raw)).items()) == text


def test_a_ledger_an_earlier_version_wrote_is_still_parsed() -> None:
    earlier = (
        "<ledger>\nKept verbatim from the compacted part of this conversation (a summary may "
        "omit it):\nRules:\n- Never push to main.\n</ledger>"
    )
    assert is_ledger(earlier)
    assert parse(earlier) == [Item(Section.RULES, "Never push to main.")]


def test_a_clients_pasted_tag_is_not_a_ledger() -> None:
    assert not is_ledger("<ledger>\nmy own notes\n</ledger>")
    assert parse("<ledger>\nmy own notes\n</ledger>") == []


def test_span_strings_gives_a_summary_check_its_exact_strings_and_rules() -> None:
    from compaction_proxy.compaction.ledger.span import span_strings

    span = [
        {"role": "user", "content": "Never push to main. FACT: the db is Postgres 15."},
        call("c1", "edit_file", path="src/app/db.py"),
        result("c1", "ok"),
        call("c2", "bash", command="pytest -q"),
        result("c2", PYTEST),
    ]
    items, rules = span_strings(span)
    assert rules == ["Never push to main."]
    assert ("statements", "FACT: the db is Postgres 15.") in items
    assert ("files", "src/app/db.py") in items
    assert ("commands", "pytest -q") in items  # without its verdict
    assert ("errors", "FAILED tests/test_db.py::test_update - KeyError: 'id'") in items
    assert len(items) == len(set(items))


def test_a_pasted_log_is_not_the_users_rules() -> None:
    log = "\n".join(f"WARNING: deprecated call {n} in module_{n}.py" for n in range(300))
    got = items_of({"role": "user", "content": f"Never push to main.\n{log}"})
    assert "Never push to main." in got[Section.RULES]
    assert not any(r.startswith("WARNING:") for r in got.get(Section.RULES, []))
    taken = sum(len(texts) for texts in got.values())
    assert 0 < taken <= 64  # the first and the last of a paste, never all of it
