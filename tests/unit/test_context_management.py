"""Anthropic's ``context_management`` applied by the proxy
(compaction_proxy/wire/messages/_context_management.py): each edit translated with its
parameters and defaults, malformed ones refused in Anthropic's shape, unknown ones reported,
and what the translated strategies make of a Messages request once lowered back.

The strategies run through the real compactor (``Compactor.run`` with ``edits``) on the
Messages format's own view, and the result is lowered with the view, as the route does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.strategies.clear_tool_uses import ClearToolUsesStrategy
from compaction_proxy.compaction.strategies.summarization import SummarizationStrategy
from compaction_proxy.compaction.triggers import Always, Never, TokensExceed
from compaction_proxy.config import Settings
from compaction_proxy.engine import Compactor, RunExtras
from compaction_proxy.http import ProxyError
from compaction_proxy.wire import EditedView
from compaction_proxy.wire.messages import MESSAGES, anthropic_error_body
from compaction_proxy.wire.messages._context_management import MessagesEdits, translate
from compaction_proxy.wire.messages._edit_strategies import (
    ClearThinking,
    ClearToolUses,
    ClearToolUsesByCount,
    Compact,
)
from tests.support.processes import tiktoken_cache_dir

MODEL = "claude-sonnet-4-5"
CLAUDE_CODE = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


@pytest.fixture
def compactor() -> Iterator[Compactor]:
    made = Compactor(
        Settings.model_validate(
            {
                "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
                "models": {MODEL: {"context_window": 200_000}},
                "summarization": {"enabled": False},
                # What the edits translate to, alone: the ledger the default pipeline keeps
                # beside them is tested in tests/unit/test_ledger_formats.py (Messages too).
                "compaction": {"ledger": {"enabled": False}},
            }
        )
    )
    yield made
    made.close()


def edits_of(management: Any, *, summarizer: bool = True) -> MessagesEdits:
    found = translate(
        {"model": MODEL, "messages": [], "context_management": management}, summarizer=summarizer
    )
    assert found is not None
    return found


def only(management: Any, **kwargs: Any) -> Any:
    (strategy,) = edits_of(management, **kwargs).strategies
    return strategy


def thinking(n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": f"thought {n} " * 40, "signature": f"sig-{n}"}


def chat_turns(turns: int) -> list[dict[str, Any]]:
    """``turns`` user turns, each answered with thinking then text; a last question."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        messages.append(
            {
                "role": "assistant",
                "content": [thinking(turn), {"type": "text", "text": f"answer {turn}"}],
            }
        )
    messages.append({"role": "user", "content": "one more question"})
    return messages


def tool_loop(steps: int, *, lines: int = 60, tool: str = "Bash") -> list[dict[str, Any]]:
    """A single-turn tool loop as Claude Code sends it: each step thinks, calls, is answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the parser"}]
    for step in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    thinking(step),
                    {"type": "text", "text": f"Step {step}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{step}",
                        "name": tool,
                        "input": {"command": f"cat part-{step}"},
                    },
                ],
            }
        )
        output = "".join(f"step {step} line {n}: lorem ipsum dolor\n" for n in range(lines))
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{step}", "content": output}
                ],
            }
        )
    return messages


async def run(
    compactor: Compactor, messages: list[dict[str, Any]], management: Any
) -> tuple[list[Any], Any, MessagesEdits]:
    """The Messages request compacted with its edits, lowered back: the forwarded messages,
    the report and the edits."""
    body = {
        "model": MODEL,
        "max_tokens": 1024,
        "messages": messages,
        "context_management": management,
    }
    view = MESSAGES.lift(body)
    assert isinstance(view, EditedView)
    edits = view.context_edits(summarizer=False)
    assert edits is not None
    result = await compactor.run(
        view.chat, Mode.NORMAL, size_hint=0, extras=RunExtras(tuple(edits.strategies), edits.key)
    )
    forwarded = view.lower(result.messages).items if result.changed else messages
    return list(forwarded), result.report, edits


# ---------------------------------------------------------------------------- translation


def test_a_request_without_the_field_has_no_edits() -> None:
    assert translate({"model": MODEL, "messages": []}, summarizer=True) is None


def test_claude_codes_edit_keeps_every_thought_and_strips_the_field() -> None:
    edits = edits_of(CLAUDE_CODE)
    assert edits.strip == ("context_management",)
    (strategy,) = edits.strategies
    assert isinstance(strategy, ClearThinking) and strategy.keep is None
    assert isinstance(strategy.trigger, Never)  # nothing to clear: never fires


def test_clear_tool_uses_defaults_are_anthropics() -> None:
    strategy = only({"edits": [{"type": "clear_tool_uses_20250919"}]})
    assert isinstance(strategy, ClearToolUses)
    assert isinstance(strategy, ClearToolUsesStrategy)
    assert strategy.name == "clear_tool_uses_20250919"
    assert strategy.trigger == TokensExceed(100_000)
    assert strategy.keep == 3
    assert strategy.clear_at_least == 0
    assert strategy.exclude_tools == frozenset()
    assert not strategy.clears_inputs("Bash")


def test_clear_tool_uses_takes_every_parameter() -> None:
    strategy = only(
        {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 30_000},
                    "keep": {"type": "tool_uses", "value": 5},
                    "clear_at_least": {"type": "input_tokens", "value": 5_000},
                    "exclude_tools": ["web_search"],
                    "clear_tool_inputs": ["Bash"],
                }
            ]
        }
    )
    assert strategy.trigger == TokensExceed(30_000)
    assert (strategy.keep, strategy.clear_at_least) == (5, 5_000)
    assert strategy.exclude_tools == frozenset({"web_search"})
    assert strategy.clears_inputs("Bash") and not strategy.clears_inputs("Read")


def test_clear_tool_inputs_true_clears_every_tools_inputs() -> None:
    strategy = only({"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": True}]})
    assert strategy.clears_inputs("Bash") and strategy.clears_inputs("Read")


def test_a_tool_uses_trigger_counts_tool_uses() -> None:
    strategy = only(
        {
            "edits": [
                {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4}}
            ]
        }
    )
    assert isinstance(strategy, ClearToolUsesByCount) and strategy.uses == 4


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        (None, 1),  # Anthropic's default: the last thinking turn
        ({"type": "thinking_turns", "value": 2}, 2),
        ({"type": "thinking_turns", "value": 0}, 0),
        ("all", None),
        ({"type": "all"}, None),
    ],
)
def test_clear_thinking_keep(keep: Any, expected: int | None) -> None:
    edit: dict[str, Any] = {"type": "clear_thinking_20251015"}
    if keep is not None:
        edit["keep"] = keep
    strategy = only({"edits": [edit]})
    assert isinstance(strategy, ClearThinking) and strategy.keep == expected
    assert isinstance(strategy.trigger, Never if expected is None else Always)


def test_compact_is_the_summary_at_its_trigger() -> None:
    strategy = only({"edits": [{"type": "compact_20260112"}]})
    assert isinstance(strategy, Compact)
    assert strategy.trigger == TokensExceed(150_000)
    assert isinstance(strategy.summary, SummarizationStrategy)
    assert strategy.summary.trigger == TokensExceed(150_000)
    later = only(
        {
            "edits": [
                {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 60_000}}
            ]
        }
    )
    assert later.trigger == TokensExceed(60_000)


def test_compact_without_a_summarizer_is_reported_not_applied() -> None:
    edits = edits_of({"edits": [{"type": "compact_20260112"}]}, summarizer=False)
    assert edits.strategies == ()
    notes = edits.notes(None)
    assert any("compact_20260112 not applied: no summarizer" in n for n in notes)


def test_compact_parameters_without_a_counterpart_are_named() -> None:
    edits = edits_of(
        {
            "edits": [
                {
                    "type": "compact_20260112",
                    "instructions": "Keep file names.",
                    "pause_after_compaction": True,
                }
            ]
        }
    )
    assert len(edits.strategies) == 1
    joined = " ".join(edits.notes(None))
    assert "instructions not applied" in joined
    assert "pause_after_compaction not applied" in joined


def test_unknown_edit_types_and_parameters_are_reported_never_silently() -> None:
    edits = edits_of(
        {
            "edits": [
                {"type": "clear_everything_20270101", "value": 1},
                {"type": "clear_thinking_20251015", "keep": "all", "mode": "fast"},
            ],
            "future_switch": True,
        }
    )
    assert [type(s) for s in edits.strategies] == [ClearThinking]
    notes = edits.notes(None)
    assert any("clear_everything_20270101 not applied" in n for n in notes)
    assert any("clear_thinking_20251015: mode not applied" in n for n in notes)
    assert any("context_management: future_switch not applied" in n for n in notes)


def test_null_edits_strip_the_field_and_apply_nothing() -> None:
    for management in (None, {}, {"edits": None}, {"edits": []}):
        edits = edits_of(management)
        assert edits.strategies == () and edits.strip == ("context_management",)


@pytest.mark.parametrize(
    ("management", "path"),
    [
        ("clear", "context_management"),
        ({"edits": {"type": "clear_thinking_20251015"}}, "context_management.edits"),
        ({"edits": ["clear_thinking_20251015"]}, "context_management.edits.0"),
        ({"edits": [{"keep": "all"}]}, "context_management.edits.0.type"),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": "some"}]},
            "context_management.edits.0.keep",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_thinking_20251015",
                        "keep": {"type": "thinking_turns", "value": -1},
                    }
                ]
            },
            "context_management.edits.0.keep.value",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_thinking_20251015",
                        "keep": {"type": "thinking_turns", "value": "2"},
                    }
                ]
            },
            "context_management.edits.0.keep.value",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "trigger": {"type": "messages", "value": 3},
                    }
                ]
            },
            "context_management.edits.0.trigger.type",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "trigger": {"type": "input_tokens", "value": 0},
                    }
                ]
            },
            "context_management.edits.0.trigger.value",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "keep": {"type": "tool_uses", "value": True},
                    }
                ]
            },
            "context_management.edits.0.keep.value",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "keep": {"type": "tool_uses", "value": 2, "extra": 1},
                    }
                ]
            },
            "context_management.edits.0.keep",
        ),
        (
            {
                "edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "clear_at_least": {"type": "tool_uses", "value": 2},
                    }
                ]
            },
            "context_management.edits.0.clear_at_least.type",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": "Bash"}]},
            "context_management.edits.0.exclude_tools",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"}]},
            "context_management.edits.0.clear_tool_inputs",
        ),
        (
            {
                "edits": [
                    {
                        "type": "compact_20260112",
                        "trigger": {"type": "input_tokens", "value": 49_999},
                    }
                ]
            },
            "context_management.edits.0.trigger.value",
        ),
        (
            {"edits": [{"type": "compact_20260112", "instructions": 3}]},
            "context_management.edits.0.instructions",
        ),
        (
            {"edits": [{"type": "compact_20260112", "pause_after_compaction": "no"}]},
            "context_management.edits.0.pause_after_compaction",
        ),
    ],
)
def test_malformed_edits_are_a_400_in_anthropics_shape(management: Any, path: str) -> None:
    with pytest.raises(ProxyError) as caught:
        edits_of(management)
    error = caught.value
    assert error.status == 400
    assert error.message.startswith(f"{path}: ")
    body = orjson.loads(
        anthropic_error_body(error.message, type=error.type, code=error.code, param=error.param)
    )
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": error.message},
    }


def test_the_key_names_the_edits_and_nothing_else() -> None:
    one = edits_of({"edits": [{"keep": "all", "type": "clear_thinking_20251015"}]})
    same = edits_of({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    other = edits_of({"edits": [{"type": "clear_thinking_20251015"}]})
    offline = edits_of(
        {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, summarizer=False
    )
    assert one.key == same.key
    assert len({one.key, other.key, offline.key}) == 3


# ---------------------------------------------------------------------------- applied


async def test_clear_thinking_keeps_the_newest_turns_thinking(compactor: Compactor) -> None:
    messages = chat_turns(4)
    forwarded, report, edits = await run(
        compactor,
        messages,
        {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
            ]
        },
    )
    assistants = [m for m in forwarded if m["role"] == "assistant"]
    assert [b["type"] for b in assistants[-1]["content"]] == ["thinking", "text"]
    assert assistants[-1] is messages[-2]  # the client's own message, untouched
    for message in assistants[:-1]:
        assert [b["type"] for b in message["content"]] == ["text"]
    # Everything else is the client's own objects: only thinking blocks went.
    for sent, original in zip(forwarded, messages, strict=True):
        if sent is not original:
            assert sent["content"] == original["content"][1:]
            assert sent["content"][0] is original["content"][1]
    (step,) = [s for s in report.strategies if s.name == "clear_thinking_20251015"]
    assert step.changed and "cleared the thinking of 3 turn(s)" in step.notes[0]
    assert report.tokens_after < report.tokens_before
    (note,) = edits.notes(report)
    assert note.startswith(
        "context_management applied by the proxy (clear_thinking_20251015 "
        "cleared the thinking of 3 turn(s)"
    )


async def test_keep_all_changes_nothing_and_says_so(compactor: Compactor) -> None:
    messages = chat_turns(4)
    forwarded, report, edits = await run(compactor, messages, CLAUDE_CODE)
    assert forwarded == messages
    assert report.strategies[0].name == "clear_thinking_20251015"
    assert report.strategies[0].skipped == "trigger"
    assert edits.notes(report) == (
        "context_management applied by the proxy (clear_thinking_20251015 keep all)",
    )


async def test_the_turn_a_tool_result_continues_keeps_its_thinking(
    compactor: Compactor,
) -> None:
    """keep 0 clears every older turn but never the one the request continues: its last
    message answers that turn's tool use, and the API wants the turn's thinking back."""
    messages = [*chat_turns(2)[:-1], *tool_loop(3)]
    forwarded, _, _ = await run(
        compactor,
        messages,
        {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}
            ]
        },
    )
    loop_start = len(chat_turns(2)) - 1
    for sent in forwarded[:loop_start]:
        if sent["role"] == "assistant":
            assert all(b["type"] != "thinking" for b in sent["content"])
    assert forwarded[loop_start:] == messages[loop_start:]
    assert all(a is b for a, b in zip(forwarded[loop_start:], messages[loop_start:], strict=True))


async def test_a_message_of_thinking_alone_keeps_it(compactor: Compactor) -> None:
    messages = chat_turns(3)
    messages[1] = {"role": "assistant", "content": [thinking(0)]}
    forwarded, _, _ = await run(
        compactor, messages, {"edits": [{"type": "clear_thinking_20251015"}]}
    )
    assert forwarded[1] is messages[1]
    assert [b["type"] for b in forwarded[3]["content"]] == ["text"]
    assert forwarded[5] is messages[5]


async def test_clear_tool_uses_clears_all_but_the_newest_above_its_trigger(
    compactor: Compactor,
) -> None:
    messages = tool_loop(8)
    management = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 2_000},
                "keep": {"type": "tool_uses", "value": 2},
                "clear_tool_inputs": ["Bash"],
            }
        ]
    }
    forwarded, report, edits = await run(compactor, messages, management)
    results = [
        m["content"][0] for m in forwarded if m["role"] == "user" and isinstance(m["content"], list)
    ]
    cleared = [r for r in results if r["content"] == "[Old tool result content cleared]"]
    assert len(cleared) == 6 and results[-2:] == [m["content"][0] for m in messages[-3::2]]
    calls = [
        b
        for m in forwarded
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert [c["input"] for c in calls[:6]] == [{}] * 6
    assert [c["input"] for c in calls[6:]] == [{"command": "cat part-6"}, {"command": "cat part-7"}]
    # Thinking rides with its turn, untouched, and the pairing is intact.
    for sent, original in zip(forwarded, messages, strict=True):
        if sent["role"] == "assistant":
            assert sent["content"][0] is original["content"][0]
    (note,) = edits.notes(report)
    assert note == (
        "context_management applied by the proxy (clear_tool_uses_20250919 cleared 6 tool "
        f"result(s), {report.tokens_before - report.tokens_after} token(s))"
    )


async def test_clear_tool_uses_below_its_trigger_changes_nothing(compactor: Compactor) -> None:
    messages = tool_loop(8)
    forwarded, report, edits = await run(
        compactor, messages, {"edits": [{"type": "clear_tool_uses_20250919"}]}
    )
    assert forwarded == messages and report.tokens_after == report.tokens_before
    assert edits.notes(report) == (
        "context_management applied by the proxy (clear_tool_uses_20250919 above 100000 "
        "input tokens: not reached)",
    )


async def test_exclude_tools_and_clear_at_least(compactor: Compactor) -> None:
    messages = tool_loop(6)
    for message in messages[1::2][:3]:
        message["content"][2]["name"] = "Read"
    base = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1_000},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["Read"],
    }
    forwarded, _, _ = await run(compactor, messages, {"edits": [base]})
    cleared = [
        m["content"][0]["tool_use_id"]
        for m in forwarded
        if m["role"] == "user"
        and isinstance(m["content"], list)
        and m["content"][0]["content"] == "[Old tool result content cleared]"
    ]
    assert cleared == ["toolu_3", "toolu_4"]
    guarded = {**base, "clear_at_least": {"type": "input_tokens", "value": 1_000_000}}
    forwarded, report, edits = await run(compactor, messages, {"edits": [guarded]})
    assert forwarded == messages
    assert "would clear" in edits.notes(report)[0]


async def test_a_tool_uses_trigger_fires_on_the_count(compactor: Compactor) -> None:
    messages = tool_loop(5, lines=5)
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1}}
    below = {**edit, "trigger": {"type": "tool_uses", "value": 5}}
    forwarded, _, _ = await run(compactor, messages, {"edits": [below]})
    assert forwarded == messages
    above = {**edit, "trigger": {"type": "tool_uses", "value": 4}}
    forwarded, _, _ = await run(compactor, messages, {"edits": [above]})
    assert (
        sum(
            1
            for m in forwarded
            if m["role"] == "user"
            and isinstance(m["content"], list)
            and m["content"][0]["content"] == "[Old tool result content cleared]"
        )
        == 4
    )


async def test_both_edits_in_order_one_note(compactor: Compactor) -> None:
    messages = [*chat_turns(2)[:-1], *tool_loop(6)]
    management = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 1_000},
                "keep": {"type": "tool_uses", "value": 3},
            },
        ]
    }
    forwarded, report, edits = await run(compactor, messages, management)
    names = [s.name for s in report.strategies[:2]]
    assert names == ["clear_thinking_20251015", "clear_tool_uses_20250919"]
    assert all(b["type"] != "thinking" for b in forwarded[1]["content"])
    (note,) = edits.notes(report)
    assert "clear_thinking_20251015 cleared the thinking of 2 turn(s)" in note
    assert "; clear_tool_uses_20250919 cleared 3 tool result(s)" in note


# ---------------------------------------------------------------------------- the edge


def small_compactor(window: int) -> Compactor:
    return Compactor(
        Settings.model_validate(
            {
                "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
                "models": {MODEL: {"context_window": window}},
                "summarization": {"enabled": False},
            }
        )
    )


async def test_edits_run_outside_the_pipelines_composition() -> None:
    """An edit that fires far below the default pipeline's trigger (0.8 of the budget) does
    not set off the pipeline's hysteresis: its strategies still wait for their own trigger."""
    messages = tool_loop(10)
    for message in messages[1::2][2:]:
        message["content"][2]["name"] = "Read"  # only the first two steps' results may go
    compactor = small_compactor(12_000)
    try:
        management = {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 1_000},
                    "keep": {"type": "tool_uses", "value": 1},
                    "exclude_tools": ["Read"],
                }
            ]
        }
        _, report, _ = await run(compactor, messages, management)
    finally:
        compactor.close()
    first, *rest = report.strategies
    assert first.name == "clear_tool_uses_20250919" and first.changed
    budget = report.budget
    assert 0.5 * budget < report.tokens_after < 0.8 * budget  # where hysteresis would act
    assert rest and all(step.skipped == "trigger" for step in rest)
    assert report.changed_by == ("clear_tool_uses_20250919",)


async def test_checkpoints_are_kept_apart_by_the_edits() -> None:
    """A checkpoint made under one set of edits is never found for another (or none)."""
    import httpx

    from compaction_proxy.checkpoints import MemoryStore
    from compaction_proxy.engine import FlowRequest, build_flow

    settings = Settings.model_validate(
        {
            "upstreams": [{"name": "up", "base_url": "http://up.test/v1"}],
            "models": {MODEL: {"context_window": 200_000}},
            "summarization": {"enabled": False},
        }
    )
    compactor = Compactor(settings)
    client = httpx.AsyncClient()
    flow = build_flow(settings, compactor, MemoryStore(), client)
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 2_000},
        "keep": {"type": "tool_uses", "value": 1},
    }

    async def send(steps: int, management: Any) -> str:
        body = {"model": MODEL, "max_tokens": 1024, "messages": tool_loop(steps)}
        if management is not None:
            body["context_management"] = management
        view = MESSAGES.lift(body)
        assert isinstance(view, EditedView)
        edits = view.context_edits(summarizer=False)
        done = await flow.run(
            FlowRequest(
                view.chat,
                Mode.NORMAL,
                size_hint=0,
                credential="k",
                caller_key=None,
                upstream_name="up",
                edits=edits,
            )
        )
        if done.save is not None:
            assert await done.save() is None
        return done.checkpoint

    try:
        assert await send(6, {"edits": [clear]}) == "new"
        assert await send(6, {"edits": [clear]}) == "hit"
        other = {**clear, "keep": {"type": "tool_uses", "value": 2}}
        assert await send(6, {"edits": [other]}) == "new"
        assert await send(6, {"edits": [other]}) == "hit"
        assert await send(6, None) == "none"  # no edits: the pipeline alone, nothing fires
    finally:
        await client.aclose()
        compactor.close()


async def test_compact_summarizes_above_its_trigger_and_reports_the_summary_inside(
    compactor: Compactor,
) -> None:
    from tests.compaction.summarizer_fakes import FakeSummarizer

    messages = tool_loop(80)
    body = {
        "model": MODEL,
        "max_tokens": 1024,
        "messages": messages,
        "context_management": {
            "edits": [
                {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}
            ]
        },
    }
    view = MESSAGES.lift(body)
    assert isinstance(view, EditedView)
    edits = view.context_edits(summarizer=True)
    assert edits is not None
    summarizer = FakeSummarizer("FACT-TASK-7 is half done")
    result = await compactor.run(
        view.chat,
        Mode.NORMAL,
        size_hint=0,
        summarizer=summarizer,
        extras=RunExtras(tuple(edits.strategies), edits.key),
    )
    assert len(summarizer.calls) == 1
    report = result.report
    assert report.tokens_before > 50_000 > report.tokens_after
    step = report.strategies[0]
    assert step.name == "compact_20260112" and step.changed
    assert [child.name for child in step.children] == ["summarization"]
    assert report.changed_by == ("summarization",)
    forwarded = view.lower(result.messages).items
    assert any("FACT-TASK-7 is half done" in str(m["content"]) for m in forwarded)
    assert forwarded[-1] is messages[-1]  # the newest step goes verbatim
    (note,) = edits.notes(report)
    assert note.startswith("context_management applied by the proxy (compact_20260112 ")


def lowered_json(view: Any, messages: list[Any]) -> bytes:
    return orjson.dumps(list(view.lower(messages).items))


async def test_a_checkpoints_copies_lower_as_the_pipelines_own_output(
    compactor: Compactor,
) -> None:
    """On a checkpoint hit the pipeline's messages are copies read back from the store: the
    thinking the edit cleared is still dropped, and every other piece is still the client's."""
    messages = chat_turns(4)
    body = {"model": MODEL, "max_tokens": 1024, "messages": messages}
    view = MESSAGES.lift(body)
    edits = edits_of({"edits": [{"type": "clear_thinking_20251015"}]})
    result = await compactor.run(
        view.chat, Mode.NORMAL, size_hint=0, extras=RunExtras(tuple(edits.strategies))
    )
    assert result.changed
    copies = orjson.loads(orjson.dumps(result.messages))
    assert lowered_json(view, copies) == lowered_json(view, list(result.messages))
    assert view.lower(copies).items[-2] is messages[-2]


async def test_pieces_that_differ_only_in_thinking_are_told_apart(compactor: Compactor) -> None:
    same = {"type": "text", "text": "Done."}
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": [thinking(0), same]},  # cleared: an older turn
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": [same]},  # no thinking, the same bytes once cleared
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": [thinking(2), same]},  # the newest: kept
        {"role": "user", "content": "four"},
    ]
    view = MESSAGES.lift({"model": MODEL, "max_tokens": 1024, "messages": messages})
    edits = edits_of({"edits": [{"type": "clear_thinking_20251015"}]})
    result = await compactor.run(
        view.chat, Mode.NORMAL, size_hint=0, extras=RunExtras(tuple(edits.strategies))
    )
    expected = [
        messages[0],
        {"role": "assistant", "content": [same]},
        *messages[2:],
    ]
    assert orjson.loads(lowered_json(view, list(result.messages))) == expected
    copies = orjson.loads(orjson.dumps(result.messages))
    lowered = view.lower(copies).items
    assert orjson.loads(orjson.dumps(list(lowered))) == expected
    assert lowered[3] is messages[3] and lowered[5] is messages[5]


@pytest.mark.parametrize(
    ("base_url", "setting", "native"),
    [
        ("https://api.anthropic.com/v1", None, True),
        ("https://API.Anthropic.com/v1", None, True),
        ("http://127.0.0.1:8080/v1", None, False),
        ("https://gateway.example.com/anthropic/v1", None, False),
        ("https://api.anthropic.com.example.com/v1", None, False),
        ("https://api.anthropic.com/v1", "emulate", False),
        ("http://llama:8080/v1", "native", True),
    ],
)
def test_who_applies_context_management(base_url: str, setting: str | None, native: bool) -> None:
    from compaction_proxy.config import UpstreamSettings

    entry: dict[str, Any] = {"name": "up", "base_url": base_url}
    if setting is not None:
        entry["context_management"] = setting
    assert UpstreamSettings.model_validate(entry).applies_context_management is native


def test_an_unknown_context_management_setting_is_refused() -> None:
    from pydantic import ValidationError

    from compaction_proxy.config import UpstreamSettings

    with pytest.raises(ValidationError):
        UpstreamSettings.model_validate(
            {"name": "up", "base_url": "http://x/v1", "context_management": "auto"}
        )
