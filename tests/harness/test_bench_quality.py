"""The quality benchmark's own parts that need no model: the transcript generator's must-keep
lists and the exact-match scorer (bench/quality/). If these were wrong, every figure the bench
reports would be wrong with them, and no run with the model would show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.quality import scoring, transcripts, variants
from bench.quality.relay import LOOP_HEAD, LOOP_LINES, PROSE, stub_reply
from bench.quality.transcripts import ITEM_TYPES, Item


def test_a_transcript_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    first, again, other = (
        transcripts.build(7, 25),
        transcripts.build(7, 25),
        transcripts.build(8, 25),
    )
    assert json.dumps(first.messages) == json.dumps(again.messages)
    assert first.items == again.items
    assert json.dumps(first.messages) != json.dumps(other.messages)


def test_every_must_keep_string_is_in_its_own_message_and_nowhere_else() -> None:
    for seed, steps in ((1, 10), (30, 70), (32, 150)):
        t = transcripts.build(seed, steps)
        assert scoring.check_unique(t.items, t.messages) == []
        kinds = t.by_kind()
        assert all(kinds[kind] for kind in ITEM_TYPES), {k: len(v) for k, v in kinds.items()}


def test_each_step_is_a_call_and_its_result_and_a_request_ends_on_a_result() -> None:
    t = transcripts.build(3, 12)
    assert [m["role"] for m in t.request_at(0)] == ["system", "user"]
    for step in range(1, t.steps + 1):
        request = t.request_at(step)
        call, result = request[-2], request[-1]
        assert call["role"] == "assistant" and result["role"] == "tool"
        assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert t.request_at(t.steps) == t.messages


def test_a_tool_calls_arguments_are_matched_as_decoded_text() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"function": {"name": "run_shell", "arguments": json.dumps({"command": 'grep "x" a'})}}
        ],
    }
    assert 'grep "x" a' in scoring.message_text(message)


def test_the_folded_part_is_what_was_not_forwarded_unchanged() -> None:
    original = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "task"},
        {"role": "tool", "tool_call_id": "a", "content": "src/x.py and 12.5 ms"},
        {"role": "tool", "tool_call_id": "b", "content": "kept v1.2.3"},
    ]
    items = [
        Item("path", "src/x.py", 2),
        Item("number", "12.5 ms", 2),
        Item("identifier", "v1.2.3", 3),
    ]
    forwarded = [
        original[0],
        original[1],
        {"role": "user", "content": "<summary>\nsaw src/x.py\n</summary>"},
        original[3],
    ]
    folded = scoring.folded_items(items, original, forwarded)
    assert [i.text for i in folded] == ["src/x.py", "12.5 ms"]
    kept = scoring.Tally().add(folded, scoring.request_text(forwarded))
    assert (kept.kept["path"], kept.kept["number"], kept.all_total) == (1, 0, 2)
    assert kept.share() == 0.5
    assert [i.text for i in kept.missing] == ["12.5 ms"]
    assert scoring.summary_text(forwarded).strip() == "saw src/x.py"


def test_an_exact_match_is_exact() -> None:
    tally = scoring.Tally().add([Item("number", "412.5 ms", 0)], "p99 412.5ms and 412 ms")
    assert tally.all_kept == 0


def test_a_variant_overlay_merges_mappings_and_replaces_lists() -> None:
    base = {"compaction": {"pipeline": [1, 2], "min_saving": 0.02}, "store": {"path": "a"}}
    merged = variants.merge(base, {"compaction": {"pipeline": [3]}})
    assert merged == {"compaction": {"pipeline": [3], "min_saving": 0.02}, "store": {"path": "a"}}
    assert base["compaction"]["pipeline"] == [1, 2]
    assert variants.needs_summarizer({})
    assert not variants.needs_summarizer({"summarization": {"enabled": False}})
    assert not variants.needs_summarizer({"compaction": {"pipeline": [{"strategy": "truncation"}]}})


@pytest.mark.e2e
def test_a_variant_with_a_key_this_checkout_does_not_know_is_unavailable(tmp_path: Path) -> None:
    config = {
        "upstreams": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "keyless": True}],
        "compaction": {"no_such_switch": {"enabled": True}},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    reason = variants.unavailable(path)
    assert reason is not None and "no_such_switch" in reason
    del config["compaction"]
    path.write_text(json.dumps(config), encoding="utf-8")
    assert variants.unavailable(path) is None


def test_every_shipped_variant_file_loads() -> None:
    loaded = {v.name: v for v in variants.load()}
    assert {"default", "truncation", "ledger-on", "ledger-off"} <= set(loaded)
    assert loaded["default"].overlay == {}


def test_the_looping_stub_answers_as_the_small_model_did() -> None:
    """`--summarizer looping`: the same few lines over and over up to the call's limit, cut
    mid-line and reported as cut (``length``), as Qwen2.5-Coder-1.5B answered on the 6k run."""
    reply = stub_reply({"max_tokens": 200, "messages": [{"content": "x" * 400}]}, "looping")
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    assert choice["finish_reason"] == "length" and len(text) == 4 * 200
    assert text.startswith(LOOP_HEAD) and text.count(LOOP_LINES[0]) >= 3
    assert not text.endswith("\n")  # the last line is cut
    prose = stub_reply({"messages": []}, "prose")["choices"][0]
    assert prose["finish_reason"] == "stop" and prose["message"]["content"] == PROSE
