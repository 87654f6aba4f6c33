"""A recall answer's text: one original rendered, the keyword search, pages."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from compaction_proxy.compaction.archive import RecallIds
from compaction_proxy.compaction.recall_text import (
    PageOutOfRange,
    message_text,
    page,
    render,
    search,
)
from compaction_proxy.compaction.tokens import CharacterEstimatorTokenizer
from compaction_proxy.summarizer._transcript import render_message

IDS = RecallIds(b"test-archive-namespace-key")
original_id = IDS.original

COUNT = CharacterEstimatorTokenizer().count_text


# ------------------------------------------------------------------ render


def test_tool_result_header_names_role_and_tool() -> None:
    message = {"role": "tool", "tool_call_id": "c1", "content": "exit code 0\nall 12 passed"}
    text = render("rq72amlvh4xx", message, tool="run_tests")
    assert text == "[recall id rq72amlvh4xx: tool, tool run_tests]\nexit code 0\nall 12 passed"
    # Without a known name the header says only the role.
    assert render("rq72amlvh4xx", message).splitlines()[0] == "[recall id rq72amlvh4xx: tool]"


def test_legacy_function_result_names_itself() -> None:
    message = {"role": "function", "name": "lookup", "content": "42"}
    assert render("raaaaaaaaaaa", message).startswith(
        "[recall id raaaaaaaaaaa: function, tool lookup]"
    )


def test_assistant_tool_calls_render_as_name_and_arguments() -> None:
    arguments = '{"path": "src/app.py", "pattern": "' + "x" * 5000 + '"}'
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": arguments}},
            {"id": "c2", "type": "custom", "custom": {"name": "shell", "input": "ls -la"}},
        ],
    }
    lines = render("rbbbbbbbbbbb", message).splitlines()
    assert lines == [
        "[recall id rbbbbbbbbbbb: assistant]",
        "Let me look.",
        f"grep({arguments})",  # whole: a recall answer is paged, never elided
        "shell(ls -la)",
    ]


def test_parts_that_are_not_text_are_named() -> None:
    data = base64.b64encode(os.urandom(3000)).decode()
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this screenshot?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": "x"}},
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        ],
    }
    body = message_text(message)
    assert body.splitlines() == [
        "What is in this screenshot?",
        "[image]",
        "[audio]",
        "[file: report.pdf]",
        "[reasoning]",
    ]
    assert data[:50] not in body


def test_riding_fields_show_their_text_and_name_the_rest() -> None:
    """Lifted Messages / Responses messages carry blocks and items beside the content."""
    messages_result = {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "file written",
        "blocks": [{"type": "text", "text": "<system-reminder>tests are red</system-reminder>"}],
    }
    responses_unit = {
        "role": "assistant",
        "content": "Searching.",
        "items": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}],
    }
    assert message_text(messages_result).splitlines() == [
        "file written",
        "<system-reminder>tests are red</system-reminder>",
    ]
    assert message_text(responses_unit).splitlines() == [
        "Searching.",
        "[web_search_call content]",
    ]


def test_render_shares_the_transcripts_vocabulary() -> None:
    """One vocabulary for both: what the summarizer saw of a message, the recall shows (the
    transcript only adds its elision and its own header)."""
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Plan:"}, {"type": "image", "source": {}}],
        "tool_calls": [{"id": "c", "function": {"name": "read", "arguments": '{"p": 1}'}}],
    }
    transcript = render_message(message).splitlines()[1:]
    recalled = render("rccccccccccc", message).splitlines()[1:]
    assert [line.removeprefix("-> ") for line in transcript] == recalled


# ------------------------------------------------------------------ search


def _entries(*texts: str) -> dict[str, dict[str, Any]]:
    """Oldest first, as the desk hands them in."""
    messages = [
        {"role": "tool", "tool_call_id": f"c{i}", "content": t} for i, t in enumerate(texts)
    ]
    return {original_id(m): m for m in messages}


def test_search_ranks_by_idf_weighted_frequency() -> None:
    entries = _entries(
        "the build log: compiling the parser, the lexer and the tests",
        "deploy key is FACT-ORANGE-7 for the staging cluster",
        "the the the the the the the",
    )
    ids = list(entries)
    # "staging" and "key" are in one entry, "the" in all: the rare words decide, and seven
    # repeats of "the" outweigh three only a little (the frequency counts as 1 + log tf).
    assert search("the staging key", entries) == [ids[1], ids[2], ids[0]]
    assert search("staging", entries) == [ids[1]]
    assert search("nothing matches this", entries) == []


def test_search_is_case_insensitive_on_word_tokens() -> None:
    entries = _entries("Error: ECONNREFUSED at 127.0.0.1:6379", "all good")
    assert search("econnrefused", entries) == [next(iter(entries))]
    # Words, not substrings: "conn" is not a word of the text.
    assert search("conn", entries) == []


def test_an_exact_id_ranks_first() -> None:
    entries = _entries("alpha alpha alpha beta", "gamma")
    _, second = list(entries)
    assert search(f"alpha {second}", entries)[0] == second


def test_a_phrase_match_ranks_before_a_higher_score() -> None:
    entries = _entries(
        "connection reset by peer",
        "peer peer peer connection connection reset reset",
    )
    phrase, scattered = list(entries)
    assert search("connection reset by peer", entries) == [phrase, scattered]


def test_ties_go_to_the_newest() -> None:
    entries = _entries("timeout in step one", "timeout in step one again", "unrelated")
    older, newer, _ = list(entries)
    assert search("timeout", entries) == [newer, older]


def test_limit() -> None:
    entries = _entries(*(f"retry attempt {i}" for i in range(20)))
    assert len(search("retry", entries, limit=5)) == 5


# ------------------------------------------------------------------ pages


def test_a_text_that_fits_is_one_page_without_a_footer() -> None:
    assert page("short answer", 100, 1, COUNT) == ("short answer", 1)
    with pytest.raises(PageOutOfRange, match="page 2 is past the last page"):
        page("short answer", 100, 2, COUNT)


def test_pages_cut_at_line_boundaries_and_say_how_to_go_on() -> None:
    lines = [f"line {i:03d}: " + "word " * 10 for i in range(60)]
    text = "\n".join(lines)
    first, count = page(text, 200, 1, COUNT)
    assert count > 2
    assert first.endswith(f"(page 1 of {count}: call compaction_recall again with page=2)")
    seen: list[str] = []
    for number in range(1, count + 1):
        body, total = page(text, 200, number, COUNT)
        assert total == count
        assert COUNT(body) <= 200
        content, footer = body.rsplit("\n\n", 1)
        if number < count:
            again = f"call compaction_recall again with page={number + 1}"
            assert footer == f"(page {number} of {count}: {again})"
        else:
            assert footer == f"(page {count} of {count})"
        seen.extend(content.split("\n"))
    assert seen == lines  # every line once, whole, in order
    with pytest.raises(PageOutOfRange):
        page(text, 200, count + 1, COUNT)


def test_a_line_longer_than_a_page_is_cut_where_it_must_be() -> None:
    text = "header\n" + "x" * 5000
    _, count = page(text, 150, 1, COUNT)
    pieces = [page(text, 150, n, COUNT)[0].rsplit("\n\n", 1)[0] for n in range(1, count + 1)]
    assert all(COUNT(p) <= 150 for p in pieces)
    assert "\n".join(pieces).replace("\n", "") == text.replace("\n", "")


def test_pages_are_stable_across_calls() -> None:
    text = "\n".join(f"entry {i}" * 7 for i in range(100))
    assert page(text, 120, 3, COUNT) == page(text, 120, 3, COUNT)
