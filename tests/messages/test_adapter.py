"""The Messages adapter, rule by rule: what the core is shown, and what comes back.

Each test pins one rule of the module docstrings of compaction_proxy/wire/messages/_lift.py
(the pieces a client message becomes) and _lower.py (the way back: the client's own objects,
edited blocks, made-up messages, the thinking-first and opening-user rules, the breakpoint on
the checkpoint), then the rest of the format: the chat body the flow compacts, the usage it
calibrates from, Anthropic's error shape, which bodies are Messages bodies, and parse errors.
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import orjson
import pytest

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    EncodingLoader,
    Mode,
    ModelFacts,
    Pipeline,
    TokenizerProvider,
    compact,
)
from compaction_proxy.compaction.strategies import (
    ClearToolUsesStrategy,
    ContextPruningStrategy,
    SlidingWindowStrategy,
    ToolResultCompactionStrategy,
)
from compaction_proxy.compaction.triggers import Always
from compaction_proxy.http import ProxyError
from compaction_proxy.wire import registry
from compaction_proxy.wire.chat import CHAT
from compaction_proxy.wire.messages import (
    MESSAGES,
    LowerError,
    Owner,
    Piece,
    anthropic_error_body,
    is_messages_body,
    lift,
    lower,
    parse_messages_body,
    usage_tokens,
)
from compaction_proxy.wire.messages._blocks import breakpoints, marked_blocks
from compaction_proxy.wire.messages._lift import thinking_blocks
from compaction_proxy.wire.messages._lower import OMITTED_NOTE
from compaction_proxy.wire.responses import RESPONSES

Block = dict[str, Any]
Message = dict[str, Any]


def text(value: str, **extra: Any) -> Block:
    return {"type": "text", "text": value, **extra}


def thinking(n: int) -> Block:
    return {"type": "thinking", "thinking": f"plan {n}", "signature": f"sig{n}=="}


def use(use_id: str, command: str = "ls") -> Block:
    return {"type": "tool_use", "id": use_id, "name": "Bash", "input": {"command": command}}


def result(use_id: str, content: Any = "ok", **extra: Any) -> Block:
    return {"type": "tool_result", "tool_use_id": use_id, "content": content, **extra}


def image(data: str = "AAAA") -> Block:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def user(*content: Block | str) -> Message:
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "user", "content": content[0]}
    return {"role": "user", "content": list(content)}


def assistant(*content: Block) -> Message:
    return {"role": "assistant", "content": list(content)}


def body_of(*messages: Message, **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": list(messages), **extra}


SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}}
FOUND = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [{"type": "web_search_result", "url": "https://e.x", "encrypted_content": "E"}],
}


# ------------------------------------------------------------------ lift: the pieces


def test_the_top_level_system_is_one_system_message_outside_the_messages() -> None:
    blocks = [text("You are Claude Code."), text("Rules.", cache_control={"type": "ephemeral"})]
    lifted = lift(body_of(user("hi"), system=blocks))
    assert lifted.messages[0] == {
        "role": "system",
        "content": [text("You are Claude Code."), text("Rules.")],  # no breakpoint
    }
    assert lifted.owners[0] is None and lifted.pieces == {0: [1]}
    assert lift(body_of(user("hi"), system="Be brief.")).messages[0] == {
        "role": "system",
        "content": "Be brief.",
    }
    for empty in ("", []):
        assert lift(body_of(user("hi"), system=empty)).messages == [
            {"role": "user", "content": "hi"}
        ]


def test_a_system_note_inside_messages_is_a_system_message_in_its_place() -> None:
    note = {"role": "system", "content": "<system-reminder>cwd changed</system-reminder>"}
    lifted = lift(body_of(user("a"), note, user("b")))
    assert [m["role"] for m in lifted.messages] == ["user", "system", "user"]
    assert lifted.messages[1]["content"] == note["content"]
    assert lifted.owners[1] == Owner(Piece.SYSTEM, 1)


def test_a_user_message_shows_its_blocks_as_chat_parts() -> None:
    url_image = {"type": "image", "source": {"type": "url", "url": "https://e.x/a.png"}}
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
        "cache_control": {"type": "ephemeral"},
    }
    unknown = {"type": "future_block", "payload": 1}
    message = user(text("look", cache_control={"type": "ephemeral"}), image("QUJD"), url_image)
    message["content"] += [document, unknown]
    lifted = lift(body_of(message, user("plain")))
    assert lifted.messages[0] == {
        "role": "user",
        "content": [
            text("look"),
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
            {"type": "image_url", "image_url": {"url": "https://e.x/a.png"}},
            {k: v for k, v in document.items() if k != "cache_control"},
            unknown,  # as it is, counted as its JSON
        ],
    }
    assert lifted.messages[0]["content"][4] is unknown
    assert lifted.messages[1] == {"role": "user", "content": "plain"}  # a string stays one
    assert lifted.owners[0] == Owner(Piece.USER, 0)


def test_results_are_one_tool_message_each_and_the_blocks_after_them_ride_on_the_last() -> None:
    reminder = text("<system-reminder>todo list</system-reminder>")
    answers = user(
        result("toolu_1", "file a"),
        result("toolu_2", [text("line"), image()], is_error=True),
        reminder,
    )
    lifted = lift(body_of(user("go"), assistant(use("toolu_1"), use("toolu_2")), answers))
    assert lifted.messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "file a"}
    assert lifted.messages[3] == {
        "role": "tool",
        "tool_call_id": "toolu_2",
        "content": [
            text("line"),
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
        "is_error": True,
        "blocks": [reminder],
    }
    # not a user message of their own: that would be a new turn, and the step unprotected
    assert [m["role"] for m in lifted.messages] == ["user", "assistant", "tool", "tool"]
    assert lifted.owners[2] == Owner(Piece.RESULT, 2, (0,), "toolu_1")
    assert lifted.owners[3] == Owner(Piece.RESULT, 2, (1, 2), "toolu_2")
    assert lifted.pieces[2] == [2, 3]
    assert lifted.results == {"toolu_1": [2], "toolu_2": [3]}
    # a result without content is an empty one
    bare = lift(
        body_of(user("go"), assistant(use("t")), user({"type": "tool_result", "tool_use_id": "t"}))
    )
    assert bare.messages[2]["content"] == ""


def test_an_assistant_turn_is_one_message_with_its_thinking_and_other_blocks_riding() -> None:
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    unknown = {"type": "future_block", "n": 1}
    turn = assistant(
        thinking(1), redacted, text("Let me look."), SEARCH, FOUND, unknown, use("toolu_1")
    )
    lifted = lift(body_of(user("go"), turn, user(result("toolu_1"))))
    message = lifted.messages[1]
    assert message == {
        "role": "assistant",
        "content": [text("Let me look.")],
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command":"ls"}'},
            }
        ],
        # what the model reads of its thinking: the text, not the signature
        "thinking": [{"type": "thinking", "thinking": "plan 1"}, redacted],
        "blocks": [SEARCH, FOUND, unknown],
    }
    assert thinking_blocks(lifted, 1) == [turn["content"][0], redacted]
    assert thinking_blocks(lifted, 1)[0] is turn["content"][0]  # the signed block itself
    assert lifted.calls == {"toolu_1": 1}
    # a turn of calls only has no text; a string answer stays a string
    only = lift(body_of(user("go"), assistant(use("t")), user(result("t")))).messages[1]
    assert only["content"] is None
    answer = lift(body_of(user("go"), {"role": "assistant", "content": "done"})).messages[1]
    assert answer == {"role": "assistant", "content": "done"}


def test_chat_body_has_tools_in_chat_shape_the_user_and_the_output_limit() -> None:
    tools = [
        {
            "name": "Bash",
            "description": "run",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
        {"name": "Plain", "input_schema": {"type": "object"}},
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "cache_control": {"type": "ephemeral"},
        },
    ]
    body = body_of(user("x"), tools=tools, metadata={"user_id": "u-1"}, max_tokens=32000)
    chat = lift(body).chat_body(body)
    assert chat == {
        "model": "claude-sonnet-4-5",
        "messages": lift(body).messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": "run",
                    "parameters": {"type": "object"},
                },
            },
            {"type": "function", "function": {"name": "Plain", "parameters": {"type": "object"}}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "user": "u-1",
        "max_completion_tokens": 32000,
    }
    for limit in (True, 0, -5, "100"):
        assert "max_completion_tokens" not in lift(body).chat_body({**body, "max_tokens": limit})
    for metadata in ({}, {"user_id": ""}, {"user_id": 7}, "u-1"):
        assert "user" not in lift(body).chat_body({**body, "metadata": metadata})
    assert "tools" not in lift(body).chat_body({**body, "tools": []})


# ------------------------------------------------------------------ counting


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return TokenizerProvider(EncodingLoader()).get("o200k_base")


def png(width: int, height: int, padding: int) -> str:
    """A base64 PNG whose header says ``width`` x ``height``, ``padding`` bytes long."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + ihdr + b"\0" * padding).decode()


def test_an_image_is_counted_by_its_tiles_not_its_base64(tokenizer: Any) -> None:
    data = png(512, 512, 60_000)
    looked = lift(body_of(user(text("see"), image(data))))
    plain = lift(body_of(user(text("see"))))
    cost = tokenizer.count_messages(looked.messages) - tokenizer.count_messages(plain.messages)
    assert 0 < cost < 1_000 < len(data) // 4  # tiles, not 80,000 characters of text


def test_thinking_and_riding_blocks_are_counted(tokenizer: Any) -> None:
    quiet = lift(body_of(user("go"), assistant(text("a"))))
    loud = lift(body_of(user("go"), assistant({**thinking(1), "thinking": "t " * 2000}, text("a"))))
    assert tokenizer.count_messages(loud.messages) > tokenizer.count_messages(quiet.messages) + 1000
    found = {**FOUND, "content": [{"type": "web_search_result", "encrypted_content": "e " * 2000}]}
    searched = lift(body_of(user("go"), assistant(SEARCH, found, text("a"))))
    assert (
        tokenizer.count_messages(searched.messages)
        > tokenizer.count_messages(quiet.messages) + 1000
    )


# ------------------------------------------------------------------ lower: the way back


def session() -> dict[str, Any]:
    """A Claude Code request: system blocks with breakpoints, a note, parallel calls with
    thinking, results with an image and a reminder, the newest result with a breakpoint."""
    return body_of(
        user(text("fix the parser"), text("<system-reminder>ctx</system-reminder>")),
        assistant(thinking(1), text("Reading both."), use("toolu_1", "cat a"), use("toolu_2")),
        user(
            result("toolu_1", "A" * 300),
            result("toolu_2", [text("B" * 300), image()]),
            text("<system-reminder>todo</system-reminder>"),
        ),
        {"role": "system", "content": "<system-reminder>mode: plan</system-reminder>"},
        assistant(thinking(2), SEARCH, FOUND, use("toolu_3")),
        user(result("toolu_3", "C", cache_control={"type": "ephemeral"})),
        system=[
            text("You are Claude Code.", cache_control={"type": "ephemeral", "ttl": "1h"}),
            text("Env.", cache_control={"type": "ephemeral"}),
        ],
    )


def test_nothing_changed_gives_back_the_clients_own_objects() -> None:
    body = session()
    lifted = lift(body)
    lowered = lower(lifted, lifted.messages, body)
    assert lowered.notes == ()
    assert all(a is b for a, b in zip(lowered.items, body["messages"], strict=True))
    assert len(lowered.items) == len(body["messages"])


def test_messages_read_back_from_a_checkpoint_map_to_the_same_objects() -> None:
    body = session()
    lifted = lift(body)
    stored = orjson.loads(orjson.dumps(lifted.messages))  # what a store hands back
    lowered = lower(lifted, stored, body)
    assert all(a is b for a, b in zip(lowered.items, body["messages"], strict=True))
    # the next turn moved its breakpoint: the same chat bytes, so the checkpoint still maps
    moved = session()
    del moved["messages"][5]["content"][0]["cache_control"]
    moved["messages"][2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    relifted = lift(moved)
    again = lower(relifted, stored, moved)
    assert all(a is b for a, b in zip(again.items, moved["messages"], strict=True))


def test_results_split_for_the_core_go_back_as_one_message_in_the_clients_order() -> None:
    body = session()
    lifted = lift(body)
    first, second = lifted.messages[3], lifted.messages[4]
    cleared = {**first, "content": "[cleared]"}
    # whatever order the pieces come in, they go back in the client's block order
    messages = [*lifted.messages[:3], second, cleared, *lifted.messages[5:]]
    lowered = lower(lifted, messages, body)
    source = body["messages"][2]
    merged = lowered.items[2]
    assert merged == {
        **source,
        "content": [{**source["content"][0], "content": "[cleared]"}, *source["content"][1:]],
    }
    assert merged["content"][1] is source["content"][1]
    assert merged["content"][2] is source["content"][2]  # the reminder rides along
    assert len(lowered.items) == len(body["messages"])
    # unchanged but reordered: still the client's own object
    swapped = [*lifted.messages[:3], second, first, *lifted.messages[5:]]
    assert lower(lifted, swapped, body).items[2] is source


def test_an_edited_result_goes_back_as_blocks_with_the_clients_images() -> None:
    body = session()
    lifted = lift(body)
    piece = lifted.messages[4]  # toolu_2: text and an image
    trimmed = {**piece, "content": [{"type": "text", "text": "B…"}, piece["content"][1]]}
    lowered = lower(lifted, [*lifted.messages[:4], trimmed, *lifted.messages[5:]], body)
    block = lowered.items[2]["content"][1]
    original = body["messages"][2]["content"][1]
    assert block == {**original, "content": [text("B…"), image()]}
    assert block["content"][1] is original["content"][1]
    assert lowered.items[2]["content"][0] is body["messages"][2]["content"][0]
    # a string stays a string, and nothing at all is an empty result
    for content, expected in (("short", "short"), (None, "")):
        edited = {**piece, "content": content}
        out = lower(lifted, [*lifted.messages[:4], edited, *lifted.messages[5:]], body)
        assert out.items[2]["content"][1]["content"] == expected


def test_a_result_edited_back_to_what_it_was_is_the_clients_own_message() -> None:
    body = session()
    lifted = lift(body)
    copy = orjson.loads(orjson.dumps(lifted.messages[3]))
    copy["is_error"] = False  # not a byte match, but the same content
    lowered = lower(lifted, [*lifted.messages[:3], copy, *lifted.messages[4:]], body)
    assert lowered.items[2] is body["messages"][2]


def test_cleared_arguments_become_the_tool_use_input_and_nothing_else_changes() -> None:
    body = session()
    lifted = lift(body)
    step = lifted.messages[2]
    calls = [
        {**step["tool_calls"][0], "function": {"name": "Bash", "arguments": "{}"}},
        step["tool_calls"][1],
    ]
    lowered = lower(
        lifted, [*lifted.messages[:2], {**step, "tool_calls": calls}, *lifted.messages[3:]], body
    )
    source = body["messages"][1]
    out = lowered.items[1]
    assert out["content"][2] == {**source["content"][2], "input": {}}
    assert all(out["content"][i] is source["content"][i] for i in (0, 1, 3))  # thinking first
    assert lowered.items[2] is body["messages"][2]
    # arguments that are not an object still make one (the API wants an object)
    for arguments, expected in (("[1]", {"value": [1]}), ("not json", {"note": "not json"})):
        odd = [{**calls[0], "function": {"name": "Bash", "arguments": arguments}}, calls[1]]
        edited = lower(
            lifted, [*lifted.messages[:2], {**step, "tool_calls": odd}, *lifted.messages[3:]], body
        )
        assert edited.items[1]["content"][2]["input"] == expected


def test_made_up_messages_are_one_text_block_and_a_system_one_is_user_text() -> None:
    body = body_of(
        user("task"),
        assistant(use("a")),
        user(result("a")),
        user("next"),
        assistant(text("done")),
    )
    lifted = lift(body)
    summary = {"role": "system", "content": "<summary>\nthe story\n</summary>"}
    collapsed = {"role": "assistant", "content": [text("[Tool results: "), text("Bash: ok]")]}
    messages = [lifted.messages[0], summary, collapsed, *lifted.messages[3:]]
    lowered = lower(lifted, messages, body)
    assert lowered.items[0] is body["messages"][0]
    # a system note inside `messages` is a beta some upstreams refuse: the summary is user text
    assert lowered.items[1]["role"] == "user"
    assert [b["text"] for b in lowered.items[1]["content"]] == [summary["content"]]
    assert lowered.items[2] == {
        "role": "assistant",
        "content": [text("[Tool results: \nBash: ok]")],
    }
    assert lowered.items[3] is body["messages"][3] and lowered.items[4] is body["messages"][4]


def test_a_made_up_assistant_message_before_a_thinking_turn_becomes_user_text() -> None:
    body = body_of(
        user("task"),
        assistant(use("a")),
        user(result("a")),
        assistant(thinking(1), use("b")),
        user(result("b")),
    )
    lifted = lift(body)
    collapsed = {"role": "assistant", "content": "[Tool results: Bash: ok]"}
    lowered = lower(lifted, [lifted.messages[0], collapsed, *lifted.messages[3:]], body)
    # the API would merge it into the model's turn, which must open with its thinking
    assert lowered.items[1]["role"] == "user"
    assert [b["text"] for b in lowered.items[1]["content"]] == ["[Tool results: Bash: ok]"]
    assert lowered.items[2] is body["messages"][3]
    # before a user message it stays the model's
    body = body_of(user("task"), assistant(use("a")), user(result("a")), user("next"))
    lifted = lift(body)
    lowered = lower(lifted, [lifted.messages[0], collapsed, lifted.messages[3]], body)
    assert lowered.items[1]["role"] == "assistant"


def test_the_conversation_opens_with_a_user_message_when_the_clients_did() -> None:
    body = body_of(user("task"), assistant(text("a1")), user("u2"), assistant(text("a2")))
    lifted = lift(body)
    lowered = lower(lifted, lifted.messages[3:], body)
    assert lowered.items[0]["content"][0]["text"] == OMITTED_NOTE
    assert lowered.items[1] is body["messages"][3]
    assert lowered.notes and "user message was put first" in lowered.notes[0]
    # a client whose conversation opens with the model's turn keeps it so
    prefill = body_of(assistant(text("a1")), user("u2"), assistant(text("a2")))
    lifted = lift(prefill)
    assert lower(lifted, lifted.messages[2:], prefill).items[0] is prefill["messages"][2]


def test_the_opening_user_message_rule_looks_past_system_notes() -> None:
    note = {"role": "system", "content": "<system-reminder>x</system-reminder>"}
    body = body_of(note, user("task"), note, assistant(text("a1")), user("u2"))
    lifted = lift(body)
    lowered = lower(lifted, [lifted.messages[0], lifted.messages[2], *lifted.messages[3:]], body)
    assert lowered.items[0] is note and lowered.items[1] is note
    assert lowered.items[2]["content"][0]["text"] == OMITTED_NOTE
    assert lowered.items[3] is body["messages"][3]


# ------------------------------------------------------------------ a breakpoint on the checkpoint


def checkpointed(body: dict[str, Any]) -> list[Any]:
    """``body`` lowered with a summary in place of its first two messages."""
    lifted = lift(body)
    start = 1 if lifted.owners[0] is None else 0
    summary = {"role": "user", "content": "<summary>\nso far\n</summary>"}
    return list(
        lower(
            lifted, [*lifted.messages[:start], summary, *lifted.messages[start + 2 :]], body
        ).items
    )


def long_body(**extra: Any) -> dict[str, Any]:
    return body_of(
        user("task"), assistant(text("a1")), user("u2"), assistant(text("a2")), user("u3"), **extra
    )


def test_the_checkpoint_gets_a_breakpoint_when_the_request_holds_fewer_than_four() -> None:
    items = checkpointed(long_body())
    assert items[0]["content"] == [
        {
            "type": "text",
            "text": "<summary>\nso far\n</summary>",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    five = {"type": "ephemeral"}
    three = long_body(
        system=[text("s1", cache_control=five), text("s2", cache_control=five)],
        tools=[{"name": "t", "input_schema": {}, "cache_control": five}],
    )
    assert "cache_control" in checkpointed(three)[0]["content"][0]


def test_no_breakpoint_is_added_to_a_request_that_holds_four() -> None:
    five = {"type": "ephemeral"}
    body = long_body(
        system=[text("s1", cache_control=five), text("s2", cache_control=five)],
        tools=[{"name": "t", "input_schema": {}, "cache_control": five}],
    )
    body["messages"][4] = user(text("u3", cache_control=five))
    items = checkpointed(body)
    assert "cache_control" not in items[0]["content"][0]
    # one inside a tool_result counts too
    nested = long_body(
        system=[text("s1", cache_control=five), text("s2", cache_control=five)],
        tools=[{"name": "t", "input_schema": {}, "cache_control": five}],
    )
    nested["messages"][3] = assistant(use("x"))
    nested["messages"][4] = user(result("x", [text("r", cache_control=five)]))
    assert "cache_control" not in checkpointed(nested)[0]["content"][0]


def test_the_checkpoints_ttl_is_one_the_api_accepts() -> None:
    hour = {"type": "ephemeral", "ttl": "1h"}
    five = {"type": "ephemeral"}
    # a 1h breakpoint after it: the checkpoint's must be 1h too (a 5m one may not precede it)
    later_hour = long_body()
    later_hour["messages"][4] = user(text("u3", cache_control=hour))
    assert checkpointed(later_hour)[0]["content"][0]["cache_control"] == hour
    # only 1h breakpoints before it, none after: 1h
    before_hour = long_body(system=[text("s", cache_control=hour)])
    assert checkpointed(before_hour)[0]["content"][0]["cache_control"] == hour
    # 1h before, 5m after: 5m fits between them
    between = long_body(system=[text("s", cache_control=hour)])
    between["messages"][4] = user(text("u3", cache_control=five))
    assert checkpointed(between)[0]["content"][0]["cache_control"] == five
    # 5m before, 1h after: no TTL fits there, so none is added
    boxed = long_body(system=[text("s", cache_control=five)])
    boxed["messages"][4] = user(text("u3", cache_control=hour))
    assert "cache_control" not in checkpointed(boxed)[0]["content"][0]


def test_the_breakpoint_goes_on_the_first_made_up_message_only() -> None:
    body = long_body()
    lifted = lift(body)
    summary = {"role": "user", "content": "<summary>\nso far\n</summary>"}
    collapsed = {"role": "assistant", "content": "[Tool results: x]"}
    items = lower(lifted, [summary, lifted.messages[2], collapsed, lifted.messages[4]], body).items
    assert "cache_control" in items[0]["content"][0]
    assert "cache_control" not in items[2]["content"][0]


def test_the_note_opening_a_headless_conversation_is_no_checkpoint() -> None:
    body = long_body()
    lifted = lift(body)
    summary = {"role": "assistant", "content": "<summary>\nso far\n</summary>"}
    items = lower(lifted, [summary, lifted.messages[4]], body).items
    assert items[0]["content"] == [text(OMITTED_NOTE)]  # no breakpoint on the note
    assert items[1]["content"][0]["cache_control"] == {"type": "ephemeral"}  # the summary's
    # a compaction that wrote no checkpoint (truncation) adds no breakpoint at all
    truncated = lower(lifted, lifted.messages[3:], body).items
    assert truncated[0]["content"] == [text(OMITTED_NOTE)]


def test_the_lowering_and_the_summary_call_count_breakpoints_each_their_own_way() -> None:
    """Two counts, named apart (wire/messages/_blocks.py): the lowering's counts every
    ``cache_control`` set anywhere the API might read one; the summary call's counts the
    blocks carrying one it could move."""
    block = {"type": "search_result", "content": [text("r", cache_control={"type": "ephemeral"})]}
    messages = [
        {"role": "user", "content": [text("a")], "cache_control": {"type": "ephemeral"}},
        user(text("b", cache_control=True), block),
    ]
    # the lowering's: the message's own and the non-object one, not inside a search result
    assert breakpoints(messages) == 2
    # the summary call's: only the block one level inside the search result
    assert marked_blocks(None, None, messages) == 1


# ------------------------------------------------------------------ what maps back to nothing


def test_a_message_that_maps_back_to_nothing_is_an_error() -> None:
    body = body_of(user("x"))
    lifted = lift(body)
    with pytest.raises(LowerError):
        lower(lifted, [{"role": "tool", "tool_call_id": "nobody", "content": "?"}], body)
    made_call = {
        "role": "assistant",
        "content": "x",
        "tool_calls": [{"id": "new", "type": "function"}],
    }
    with pytest.raises(LowerError):
        lower(lifted, [made_call], body)
    with pytest.raises(LowerError):
        lower(lifted, [{"role": "developer", "content": "x"}], body)
    with pytest.raises(LowerError):
        lower(lifted, [{"role": "user", "content": [{"type": "image_url"}]}], body)


# ------------------------------------------------------------------ with the real strategies


def run(body: dict[str, Any], *strategies: Any) -> tuple[Any, Any]:
    view = MESSAGES.lift(body)
    result = compact(
        CompactionRequest(
            view.chat["messages"],
            model=body["model"],
            pipeline=Pipeline(tuple(strategies)),
            tokenizer=TokenizerProvider(EncodingLoader()),
            facts=ModelFacts(context_window=100_000, max_output_tokens=1_000),
            tools=view.chat.get("tools"),
            mode=Mode.NORMAL,
        )
    )
    return result, view.lower(result.messages)


def agent_loop(steps: int) -> dict[str, Any]:
    messages: list[Message] = [user("fix the parser")]
    for n in range(steps):
        messages.append(assistant(thinking(n), use(f"t{n}", f"cat f{n}")))
        messages.append(
            user(
                result(f"t{n}", f"result {n} " * 400), text("<system-reminder>r</system-reminder>")
            )
        )
    return body_of(*messages)


def test_the_task_and_the_newest_step_are_kept_when_results_carry_a_reminder() -> None:
    body = agent_loop(6)
    result, lowered = run(body, SlidingWindowStrategy(keep_last_groups=1, trigger=Always()))
    assert result.changed
    sources = body["messages"]
    assert len(lowered.items) == 3
    assert all(a is b for a, b in zip(lowered.items, [sources[0], *sources[-2:]], strict=True))


def test_clear_tool_uses_clears_results_and_inputs_in_place() -> None:
    body = agent_loop(6)
    result, lowered = run(
        body, ClearToolUsesStrategy(keep=2, clear_tool_inputs=True, trigger=Always())
    )
    assert result.changed and len(lowered.items) == len(body["messages"])
    for n in range(4):
        step, answer = lowered.items[1 + 2 * n], lowered.items[2 + 2 * n]
        source = body["messages"][1 + 2 * n]
        assert step["content"][0] is source["content"][0]  # the signed thinking, first
        assert step["content"][1] == {**source["content"][1], "input": {}}
        assert answer["content"][0]["content"] == "[Old tool result content cleared]"
        assert answer["content"][1] is body["messages"][2 + 2 * n]["content"][1]
    assert lowered.items[-2:] == body["messages"][-2:]
    assert lowered.items[-1] is body["messages"][-1]


def test_context_pruning_trims_old_results_in_place() -> None:
    body = agent_loop(8)
    strategy = ContextPruningStrategy(
        keep_last_assistants=1,
        min_prunable_tool_chars=1_000,
        soft_trim_max_chars=1_000,
        soft_trim_head_chars=200,
        soft_trim_tail_chars=200,
        hard_clear_enabled=False,
        trigger=Always(),
    )
    result, lowered = run(body, strategy)
    assert result.changed
    first = lowered.items[2]["content"][0]
    assert first["tool_use_id"] == "t0" and "soft-trimmed" in first["content"]
    assert lowered.items[1] is body["messages"][1]


def test_tool_result_compaction_collapses_whole_steps_with_their_thinking() -> None:
    body = agent_loop(4)
    result, lowered = run(body, ToolResultCompactionStrategy(keep_last_tool_call_groups=1))
    assert result.changed
    roles = [m["role"] for m in lowered.items]
    # the collapsed steps are text, the model's; the last, right before a turn of the model's
    # that opens with thinking (the API would merge the two), goes as user text
    assert roles == ["user", "assistant", "assistant", "user", "assistant", "user"]
    assert lowered.items[0] is body["messages"][0]
    assert all(
        len(m["content"]) == 1 and m["content"][0]["type"] == "text" for m in lowered.items[1:4]
    )
    assert lowered.items[1]["content"][0]["text"].startswith("[Tool results: Bash: result 0")
    assert lowered.items[4] is body["messages"][-2] and lowered.items[5] is body["messages"][-1]


# ------------------------------------------------------------------ the format


def test_usage_tokens_adds_the_cached_and_cache_written_input() -> None:
    reply = {
        "type": "message",
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 1_000,
            "cache_creation_input_tokens": 200,
            "output_tokens": 50,
        },
    }
    assert usage_tokens(reply) == 1_210
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}
    assert usage_tokens(start) == 7
    delta = {"type": "message_delta", "usage": {"input_tokens": 9, "cache_read_input_tokens": 3}}
    assert usage_tokens(delta) == 12
    assert MESSAGES.usage_tokens(delta) == 12


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        {"type": "message_delta", "usage": {"output_tokens": 40}},  # no input count
        {"usage": {"input_tokens": 0}},
        {"usage": {"input_tokens": True, "cache_read_input_tokens": 5}},
        {"usage": {"input_tokens": -3}},
        {"usage": "many"},
        {"message": {"usage": None}},
        {"type": "ping"},
    ],
)
def test_usage_tokens_is_none_without_an_input_count(payload: Any) -> None:
    assert usage_tokens(payload) is None


@pytest.mark.parametrize(
    ("code", "kind", "expected"),
    [
        ("invalid_messages", "invalid_request_error", "invalid_request_error"),
        ("invalid_api_key", "invalid_request_error", "authentication_error"),
        ("request_too_large", "invalid_request_error", "request_too_large"),
        ("too_many_messages", "invalid_request_error", "request_too_large"),
        ("too_many_content_parts", "invalid_request_error", "request_too_large"),
        ("model_not_found", "invalid_request_error", "not_found_error"),
        ("not_found", "invalid_request_error", "not_found_error"),
        ("server_shutting_down", "server_error", "overloaded_error"),
        (None, "rate_limit_error", "rate_limit_error"),
        (None, "permission_error", "permission_error"),
        ("upstream_unreachable", "server_error", "api_error"),
        (None, "upstream_error", "api_error"),
    ],
)
def test_errors_the_proxy_answers_are_in_anthropics_shape(
    code: str | None, kind: str, expected: str
) -> None:
    body = orjson.loads(anthropic_error_body("what went wrong", type=kind, code=code, param="p"))
    assert body == {"type": "error", "error": {"type": expected, "message": "what went wrong"}}
    assert MESSAGES.error_body("m", type=kind, code=code) == anthropic_error_body(
        "m", type=kind, code=code
    )


def test_which_bodies_are_messages_bodies() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not is_messages_body(plain)  # reads the same either way: chat
    assert registry.for_body(plain) is CHAT
    chat_parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert registry.for_body(chat_parts) is CHAT
    for field in ("system", "stop_sequences", "top_k", "thinking", "context_management"):
        body = {**plain, field: None}
        assert is_messages_body(body) and registry.for_body(body) is MESSAGES, field
    for block in (use("t"), result("t"), thinking(1), image(), {"type": "document", "source": {}}):
        role = "assistant" if block["type"] in ("tool_use", "thinking") else "user"
        body = {"messages": [{"role": role, "content": [block]}]}
        assert is_messages_body(body) and registry.for_body(body) is MESSAGES, block["type"]
    assert not is_messages_body({"system": "s", "input": "x"})  # no messages: not this API
    assert registry.for_body({"input": "x"}) is RESPONSES
    assert registry.for_path("POST", "/v1/messages") is MESSAGES
    assert registry.for_path("GET", "/v1/messages") is None
    assert MESSAGES.claims(body_of(user("x"), system="s"))
    assert MESSAGES.held_by(body_of(user("x"))) is None
    assert MESSAGES.has_items(body_of(user("x"))) and not MESSAGES.has_items({"messages": []})


@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (b"", None, "empty"),
        (b"   ", None, "empty"),
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"model": 7, "messages": []}', "model", "must be a string"),
    ],
)
def test_parse_errors_say_what_is_wrong(raw: bytes, param: str | None, words: str) -> None:
    with pytest.raises(ProxyError) as info:
        parse_messages_body(raw)
    assert info.value.status == 400 and info.value.param == param
    assert words in info.value.message
    error = orjson.loads(
        MESSAGES.error_body(info.value.message, type=info.value.type, code=info.value.code)
    )
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


def test_parse_takes_a_messages_body() -> None:
    raw = orjson.dumps(body_of(user("hi"), system="s"))
    assert parse_messages_body(raw) == body_of(user("hi"), system="s")
    assert MESSAGES.parse is parse_messages_body
    assert parse_messages_body(b'{"messages": []}') == {
        "messages": []
    }  # no model: the upstream's to judge


def test_a_signature_is_not_counted_as_what_the_model_reads() -> None:
    # Claude Code's adaptive thinking sends its blocks back with empty text and a long seal.
    sealed = {"type": "thinking", "thinking": "", "signature": "E" * 4_000}
    turn = assistant(sealed, text("Running it."), use("toolu_1"))
    body = body_of(user("go"), turn, user(result("toolu_1")))
    bare = body_of(
        user("go"), assistant(text("Running it."), use("toolu_1")), user(result("toolu_1"))
    )
    counter = CharacterEstimatorTokenizer()
    with_seal = counter.count_messages(lift(body).messages)
    without = counter.count_messages(lift(bare).messages)
    assert with_seal - without < 20  # the block's frame, not 1,000 tokens of base64
