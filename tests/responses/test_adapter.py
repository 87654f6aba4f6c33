"""The Responses adapter, item by item: what the core is shown, and what comes back.

The adapter shows the compaction core each Responses conversation as chat messages
(compaction_proxy/wire/responses/_lift.py) and maps the result back to items (lower.py). These tests
pin the grouping (parallel calls one step, reasoning with the item it precedes, hosted calls,
unknown items riding with a neighbour), the exact round trip when nothing changed (the client's own
objects, even through a checkpoint's JSON), and each kind of edit a strategy can make.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.compaction import (
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
    ToolResultCompactionStrategy,
)
from compaction_proxy.compaction.triggers import Always
from compaction_proxy.wire.responses import (
    LowerError,
    input_items,
    is_responses_body,
    lift,
    lower,
    server_state,
)

Item = dict[str, Any]


def user(text: str) -> Item:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def reasoning(n: int) -> Item:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"enc{n}"}


def call(call_id: str, name: str = "read_file", arguments: str = '{"path": "a.py"}') -> Item:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def output(call_id: str, text: str = "ok") -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def answer(text: str) -> Item:
    return {
        "type": "message",
        "id": f"msg_{text}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def body_of(*items: Item, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": list(items), **extra}


def roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in lift(body).messages]


# ------------------------------------------------------------------ grouping


def test_one_response_with_parallel_calls_is_one_assistant_message() -> None:
    body = body_of(user("go"), reasoning(1), call("a"), call("b"), output("a"), output("b"))
    messages = lift(body).messages
    assert roles(body) == ["user", "assistant", "tool", "tool"]
    assistant = messages[1]
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b"]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path": "a.py"}',
    }
    assert assistant["reasoning"] == [reasoning(1)]  # rides with the calls it preceded
    assert [m["tool_call_id"] for m in messages[2:]] == ["a", "b"]


def test_the_models_text_and_its_calls_are_separate_groups() -> None:
    body = body_of(
        user("go"),
        answer("let me look"),
        call("a"),
        output("a"),
        reasoning(2),
        answer("done"),
    )
    messages = lift(body).messages
    assert roles(body) == ["user", "assistant", "assistant", "tool", "assistant"]
    assert messages[1]["content"][0]["text"] == "let me look" and "tool_calls" not in messages[1]
    assert messages[2]["content"] is None and messages[2]["tool_calls"][0]["id"] == "a"
    assert messages[4]["content"][0]["text"] == "done" and "tool_calls" not in messages[4]
    assert messages[4]["reasoning"] == [reasoning(2)]


def test_instructions_and_developer_messages_are_the_system_block() -> None:
    developer = {"role": "developer", "content": "use tools"}
    body = body_of(developer, user("hi"), instructions="Be brief.")
    messages = lift(body).messages
    assert messages[:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "use tools"},
    ]


def test_hosted_calls_are_tool_call_groups_that_carry_their_result() -> None:
    search = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "weather"},
    }
    body = body_of(user("weather?"), search, answer("sunny"))
    messages = lift(body).messages
    assert messages[1]["tool_calls"] == [
        {"id": "ws_1", "type": "custom", "custom": {"name": "web_search_call", "input": ""}}
    ]
    assert messages[1]["items"] == [search]  # counted as its JSON
    assert messages[2]["content"][0]["text"] == "sunny"


def test_other_paired_calls_pair_by_their_own_keys() -> None:
    shell = {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "sh1",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
        "status": "completed",
    }
    shell_output = {"type": "local_shell_call_output", "id": "sh1", "output": "a.py"}
    approval = {
        "type": "mcp_approval_request",
        "id": "apr_1",
        "server_label": "git",
        "name": "push",
        "arguments": "{}",
    }
    approved = {"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": True}
    messages = lift(body_of(user("x"), shell, shell_output, approval, approved)).messages
    assert [m.get("tool_call_id") for m in messages] == [None, None, "sh1", None, "apr_1"]
    assert messages[2]["content"] == "a.py"  # a text output: strategies may trim it
    assert messages[4]["content"] == "" and messages[4]["items"] == [approved]


def test_an_unknown_item_rides_with_its_neighbour() -> None:
    mystery = {"type": "future_thing", "payload": "x" * 40}
    body = body_of(user("go"), answer("a"), mystery, user("more"))
    messages = lift(body).messages
    assert len(messages) == 3 and messages[1]["items"] == [mystery]
    # first, or right after a system message: it goes with the next unit instead
    first = lift(body_of({"role": "system", "content": "s"}, mystery, user("go"))).messages
    assert first[1]["role"] == "user" and first[1]["items"] == [mystery]


def test_an_unknown_item_with_a_call_id_pairs_like_a_call() -> None:
    program = {"type": "program", "id": "p1", "call_id": "prog1", "code": "x()", "fingerprint": "f"}
    result = {"type": "program_output", "id": "po1", "call_id": "prog1", "result": "7"}
    messages = lift(body_of(user("go"), program, answer("wait"), result)).messages
    assert messages[1]["tool_calls"][0]["id"] == "prog1"
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "prog1",
        "content": "",
        "items": [result],
    }


def test_a_string_input_is_one_user_message() -> None:
    body = {"model": "gpt-4o", "input": "hello"}
    assert input_items(body) == [{"role": "user", "content": "hello"}]
    assert lift(body).messages == [{"role": "user", "content": "hello"}]


def test_chat_body_carries_tools_in_chat_shape_and_the_output_limit() -> None:
    tools = [
        {"type": "function", "name": "f", "description": "d", "parameters": {}, "strict": True},
        {"type": "web_search"},
    ]
    body = body_of(user("x"), tools=tools, max_output_tokens=500)
    chat = lift(body).chat_body(body)
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}},
        {"type": "web_search"},
    ]
    assert chat["max_completion_tokens"] == 500 and chat["model"] == "gpt-4o"


def test_server_state_and_body_detection() -> None:
    assert server_state({"previous_response_id": "resp_1", "input": []}) == "previous_response_id"
    assert server_state({"conversation": "conv_1"}) == "conversation"
    assert server_state({"previous_response_id": None, "input": []}) is None
    assert is_responses_body({"input": "x"}) and not is_responses_body({"messages": []})


# ------------------------------------------------------------------ counting


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return TokenizerProvider(EncodingLoader()).get("o200k_base")


def test_items_count_like_the_chat_messages_they_stand_for(tokenizer: Any) -> None:
    lifted = lift(body_of(user("x"), call("a"), output("a", "result text " * 50)))
    chat = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "result text " * 50},
    ]
    # item ids and statuses are not read by the model and not counted
    assert tokenizer.count_messages(lifted.messages) == tokenizer.count_messages(chat)


def test_reasoning_and_images_are_counted(tokenizer: Any) -> None:
    with_reasoning = lift(body_of(user("x"), {**reasoning(1), "encrypted_content": "e" * 8000}))
    plain = lift(body_of(user("x")))
    assert (
        tokenizer.count_messages(with_reasoning.messages)
        >= tokenizer.count_messages(plain.messages) + 1500
    )  # 8,000 characters at four a token
    image = {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"}
    looked = lift(body_of({"role": "user", "content": [image]}))
    assert looked.messages[0]["content"][0]["type"] == "image_url"
    # a low-detail image costs the base tokens, not its URL's text
    assert tokenizer.count_messages(looked.messages) < 120


# ------------------------------------------------------------------ the way back


def conversation() -> list[Item]:
    return [
        {"role": "developer", "content": "dev"},
        user("task"),
        reasoning(1),
        call("a"),
        call("b"),
        output("a", "A" * 300),
        output("b", [{"type": "input_text", "text": "B" * 300}]),
        {"type": "future_thing", "x": 1},
        reasoning(2),
        answer("summary of a and b"),
        user("next"),
        call("c"),
        output("c", "C"),
    ]


def test_nothing_changed_gives_back_the_clients_own_objects() -> None:
    items = conversation()
    lifted = lift(body_of(*items, instructions="sys"))
    lowered = lower(lifted, lifted.messages)
    assert lowered.items == items and lowered.notes == ()
    assert all(a is b for a, b in zip(lowered.items, items, strict=True))


def test_messages_read_back_from_a_checkpoint_map_to_the_same_objects() -> None:
    items = conversation()
    lifted = lift(body_of(*items))
    stored = orjson.loads(orjson.dumps(lifted.messages))  # what a store hands back
    lowered = lower(lifted, stored)
    assert all(a is b for a, b in zip(lowered.items, items, strict=True))


def test_a_cleared_output_keeps_its_call_id_and_every_other_field() -> None:
    items = conversation()
    lifted = lift(body_of(*items))
    messages = [dict(m) for m in lifted.messages]
    messages[3] = {**messages[3], "content": "[cleared]"}  # output a
    messages[4] = {**messages[4], "content": [{"type": "text", "text": "[cleared]"}]}  # b
    lowered = lower(lifted, messages)
    assert lowered.items[5] == {**items[5], "output": "[cleared]"}
    assert lowered.items[6] == {
        **items[6],
        "output": [{"type": "input_text", "text": "[cleared]"}],
    }
    assert lowered.items[2] is items[2]  # the reasoning of those calls is untouched


def test_a_trimmed_output_keeps_its_images_as_the_client_sent_them() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "file_id": "f1"}
    tool_output = {
        "type": "function_call_output",
        "call_id": "a",
        "output": [{"type": "input_text", "text": "T" * 500}, image],
    }
    items = [user("x"), call("a"), tool_output, call("b"), output("b")]
    lifted = lift(body_of(*items))
    lifted_parts = lifted.messages[2]["content"]
    trimmed = {**lifted.messages[2], "content": [{"type": "text", "text": "T…"}, lifted_parts[1]]}
    messages = [*lifted.messages[:2], trimmed, *lifted.messages[3:]]
    lowered = lower(lifted, messages)
    assert lowered.items[2]["output"] == [{"type": "input_text", "text": "T…"}, image]
    assert lowered.items[2]["output"][1] is image


def test_cleared_arguments_reach_the_call_item() -> None:
    items = [user("x"), reasoning(1), call("a"), output("a"), call("b"), output("b")]
    lifted = lift(body_of(*items))
    assistant = lifted.messages[1]
    cleared = {
        **assistant,
        "tool_calls": [
            {**assistant["tool_calls"][0], "function": {"name": "read_file", "arguments": "{}"}}
        ],
    }
    lowered = lower(lifted, [lifted.messages[0], cleared, *lifted.messages[2:]])
    assert lowered.items[1] is items[1]
    assert lowered.items[2] == {**items[2], "arguments": "{}"}


def test_summaries_and_collapsed_results_become_message_items() -> None:
    items = [user("task"), call("a"), output("a"), call("b"), output("b")]
    lifted = lift(body_of(*items))
    summary = {"role": "user", "content": "<summary>\nthe story\n</summary>"}
    collapsed = {"role": "assistant", "content": "[Tool results: read_file: ok]"}
    messages = [lifted.messages[0], summary, collapsed, *lifted.messages[3:]]
    lowered = lower(lifted, messages)
    assert lowered.items[1:3] == [
        {"type": "message", "role": "user", "content": summary["content"]},
        {"type": "message", "role": "assistant", "content": collapsed["content"]},
    ]
    assert lowered.items[3] is items[3] and lowered.items[4] is items[4]


def test_a_dropped_unknown_item_is_named_in_a_note() -> None:
    items = conversation()
    lifted = lift(body_of(*items))
    # the group the unknown item rode with (the second output) is gone, with its call
    kept = [m for i, m in enumerate(lifted.messages) if i not in (1, 2, 3, 4)]
    lowered = lower(lifted, kept)
    assert not any(item.get("type") == "future_thing" for item in lowered.items)
    assert lowered.notes and "future_thing" in lowered.notes[0]


def test_a_screenshot_cannot_become_text_and_says_so() -> None:
    computer = {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "cc1",
        "action": {"type": "click", "x": 1, "y": 2},
        "pending_safety_checks": [],
        "status": "completed",
    }
    shot = {
        "type": "computer_call_output",
        "call_id": "cc1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"},
    }
    lifted = lift(body_of(user("x"), computer, shot))
    assert lifted.messages[2]["content"][0]["type"] == "image_url"  # counted as an image
    cleared = {**lifted.messages[2], "content": "[cleared]"}
    lowered = lower(lifted, [*lifted.messages[:2], cleared])
    assert lowered.items[2] is shot and "computer_call_output" in lowered.notes[0]


def test_a_message_that_maps_back_to_nothing_is_an_error() -> None:
    lifted = lift(body_of(user("x")))
    with pytest.raises(LowerError):
        lower(lifted, [{"role": "tool", "tool_call_id": "nobody", "content": "?"}])


# ------------------------------------------------------------------ with the real strategies


def run(items: list[Item], *strategies: Any, window: int = 100_000) -> tuple[Any, Any]:
    body = body_of(*items)
    lifted = lift(body)
    result = compact(
        CompactionRequest(
            lifted.messages,
            model="gpt-4o",
            pipeline=Pipeline(tuple(strategies)),
            tokenizer=TokenizerProvider(EncodingLoader()),
            facts=ModelFacts(context_window=window, max_output_tokens=1_000),
            mode=Mode.NORMAL,
        )
    )
    return result, lower(lifted, result.messages)


def agent_loop(steps: int) -> list[Item]:
    items = [user("fix the parser")]
    for n in range(steps):
        items += [reasoning(n), call(f"c{n}"), output(f"c{n}", f"result {n} " * 400)]
    return items


def test_clear_tool_uses_writes_placeholders_into_outputs() -> None:
    items = agent_loop(6)
    result, lowered = run(items, ClearToolUsesStrategy(keep=2, trigger=Always()))
    assert result.changed
    outputs = [i for i in lowered.items if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs[:4]] == ["[Old tool result content cleared]"] * 4
    assert outputs[4] is items[-4] and outputs[5] is items[-1]
    assert len(lowered.items) == len(items)  # nothing dropped: every call keeps its output


def test_context_pruning_trims_old_outputs_in_place() -> None:
    items = agent_loop(8)
    strategy = ContextPruningStrategy(
        keep_last_assistants=1,
        min_prunable_tool_chars=1_000,
        soft_trim_max_chars=1_000,
        soft_trim_head_chars=200,
        soft_trim_tail_chars=200,
        hard_clear_enabled=False,
        trigger=Always(),
    )
    result, lowered = run(items, strategy)
    assert result.changed
    first = next(i for i in lowered.items if i.get("type") == "function_call_output")
    assert "soft-trimmed" in first["output"] and first["call_id"] == "c0"


def test_tool_result_compaction_collapses_whole_steps_with_their_reasoning() -> None:
    items = agent_loop(4)
    result, lowered = run(items, ToolResultCompactionStrategy(keep_last_tool_call_groups=1))
    assert result.changed
    assert [i.get("type") for i in lowered.items] == [
        "message",  # the task
        "message",
        "message",
        "message",  # three steps collapsed, reasoning and all
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert lowered.items[1]["content"].startswith("[Tool results: read_file: result 0")
