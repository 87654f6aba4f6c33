"""The cache-aligned summary call in Messages form: a Messages request summarized by its own
upstream and model gets its own ``system``, ``tools`` and messages (the client's objects) up to
the stretch's end, then one instruction (compaction_proxy/wire/messages/_summary.py, the
summarizer's ``_prefix_body``, the flow's ``native`` hook).

The view is a test double of the Messages format's (tests/support/messages_view.py); what is
tested is what the summarizer and the call do with any view that keeps the lifted-view contract.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.api._requests import native_request
from compaction_proxy.checkpoints import MemoryStore
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryRequest
from compaction_proxy.config import Settings, UpstreamSettings
from compaction_proxy.engine import Compactor, FlowRequest, build_flow
from compaction_proxy.summarizer import HttpSummarizer, SummarizerStats
from compaction_proxy.summarizer._prefix import PREFIX_MARKER, ForwardedRequest
from compaction_proxy.upstream import UpstreamTransport
from compaction_proxy.wire import DEFAULT_FORMAT, CallerKey, Lowered, NativeRequest
from compaction_proxy.wire.messages._summary import THINKING_HEADROOM
from tests.fakes.messages.prompt import canonical_bytes
from tests.support.messages_view import STAND_IN, DoubleView, lift

ANTHROPIC = "https://api.anthropic.test/v1"
OPENAI = "https://api.openai.test/v1"
MODEL = "claude-sonnet-4-5"
BETA = "interleaved-thinking-2025-05-14,context-management-2025-06-27"
EPHEMERAL = {"type": "ephemeral"}

SYSTEM = [
    {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
    {"type": "text", "text": "Work in /repo. FACT-SYS", "cache_control": EPHEMERAL},
]
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
THINKING = {"type": "thinking", "thinking": "", "signature": "c2lnbmVkLWJ5LXRoZS1mYWtl"}

pytestmark = pytest.mark.usefixtures("messages_api")


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fix the failing test. FACT-1"},
        {
            "role": "assistant",
            "content": [
                THINKING,
                {"type": "text", "text": "Running the tests."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Bash",
                    "input": {"command": "pytest"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 failed FACT-2"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Found it."}]},
        {"role": "user", "content": "Now fix it."},
    ]


def messages_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 32_000,
        "stream": True,
        "system": SYSTEM,
        "tools": TOOLS,
        "thinking": {"type": "adaptive"},
        "messages": conversation(),
        **extra,
    }


def reply(cached: int = 0) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "## Goal\nFix the test. FACT-1 FACT-2"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 50, "output_tokens": 20, "cache_read_input_tokens": cached},
        },
    )


def upstreams() -> list[UpstreamSettings]:
    return [
        UpstreamSettings.model_validate(
            {"name": "anthropic", "base_url": ANTHROPIC, "models": ["claude-*"], "api": "messages"}
        ),
        UpstreamSettings.model_validate(
            {"name": "openai", "base_url": OPENAI, "api_key": "sk-op", "models": ["gpt-*"]}
        ),
    ]


def bound(
    client: UpstreamTransport,
    view: DoubleView,
    *,
    native: NativeRequest | None = None,
    stats: SummarizerStats | None = None,
    window: int = 200_000,
    **settings: Any,
) -> HttpSummarizer:
    shared = HttpSummarizer(
        SummarizationSettings.model_validate({"maxSummaryTokens": 1_000, **settings}),
        upstreams(),
        client,
        facts_for=lambda _m: ModelFacts(context_window=window, max_output_tokens=8_000),
        stats=stats,
    )
    native = native if native is not None else view.native_request({"anthropic-beta": BETA})
    forwarded = ForwardedRequest.from_body(view.chat, "anthropic", native)
    return shared.bind(
        caller_key=CallerKey("authorization", "Bearer sk-ant-caller"),
        request=forwarded,
        wire=STAND_IN,
        upstream="anthropic",
    )


def stretch(view: DoubleView, end: int) -> tuple[dict[str, Any], ...]:
    """The view's chat messages 1..end (the system message is never in a stretch)."""
    return tuple(view.chat["messages"][1 : end + 1])


def sent(route: respx.Route) -> tuple[dict[str, Any], httpx.Headers]:
    request = route.calls[-1].request
    return orjson.loads(request.content), request.headers


def without_marks(value: Any) -> bytes:
    return canonical_bytes(value)


def marks(body: Mapping[str, Any]) -> list[str]:
    """Paths of the ``cache_control`` blocks of a Messages body."""
    found = [f"system.{i}" for i, b in enumerate(body.get("system") or []) if "cache_control" in b]
    for m, message in enumerate(body["messages"]):
        content = message["content"]
        for b, block in enumerate(content if isinstance(content, list) else []):
            if "cache_control" in block:
                found.append(f"messages.{m}.content.{b}")
    return found


async def test_the_call_is_the_requests_own_prefix_in_messages_form(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    body = messages_body()
    view = lift(body)
    stats = SummarizerStats()
    # the stretch: the first user message and the tool-use group (chat messages 1..3)
    text = await bound(client, view, stats=stats).summarize(
        SummaryRequest(stretch(view, 3), None, MODEL)
    )
    assert text.startswith("## Goal")
    call, headers = sent(route)
    # system and tools as the client sent them, breakpoints included
    assert orjson.dumps(call["system"]) == orjson.dumps(SYSTEM)
    assert orjson.dumps(call["tools"]) == orjson.dumps(TOOLS)
    # the client's messages up to the stretch's end, thinking blocks and all
    client_messages = body["messages"]
    assert orjson.dumps(call["messages"][:2]) == orjson.dumps(client_messages[:2])
    assert without_marks(call["messages"][2]) == without_marks(client_messages[2])
    # ... with one breakpoint at the prefix's end, where the forwarded requests cached it
    assert marks(call) == ["system.0", "system.1", "messages.2.content.0"]
    final = call["messages"][3]
    assert final["role"] == "user" and final["content"].startswith(PREFIX_MARKER)
    assert len(call["messages"]) == 4
    # the cache keys messages on thinking and tool_choice: both as the client sent them
    assert call["thinking"] == {"type": "adaptive"}
    assert "tool_choice" not in call
    assert call["max_tokens"] == 1_000 + THINKING_HEADROOM
    assert call["stream"] is False and call["model"] == MODEL
    for name in ("metadata", "context_management"):
        assert name not in call
    # its betas go along (the prefix's content may need them), the version is the API's
    assert headers["anthropic-beta"] == BETA
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["authorization"] == "Bearer sk-ant-caller"  # the caller's own upstream
    assert stats.forms == {"prefix": 1}


async def test_the_shared_objects_are_never_edited(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    body = messages_body()
    before = copy.deepcopy(body)
    view = lift(body)
    await bound(client, view).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
    # the call did add a breakpoint to the client's message (else there was nothing to copy) ...
    call, _ = sent(route)
    assert "messages.2.content.0" in marks(call)
    assert "messages.2.content.0" not in marks(before)
    assert body == before  # ... and it went on a copy


async def test_a_forced_tool_choice_becomes_none(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    for sent_choice, expected in (
        ({"type": "any"}, {"type": "none"}),
        ({"type": "tool", "name": "Bash"}, {"type": "none"}),
        ({"type": "auto", "disable_parallel_tool_use": True}, None),
    ):
        view = lift(messages_body(tool_choice=sent_choice, thinking={"type": "disabled"}))
        await bound(client, view).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
        call, _ = sent(route)
        assert call["tool_choice"] == (expected or sent_choice)
        assert call["thinking"] == {"type": "disabled"}
        assert call["max_tokens"] == 1_000


async def test_a_manual_thinking_budget_is_left_out(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    thinking = {"type": "enabled", "budget_tokens": 31_999}
    view = lift(messages_body(thinking=thinking))
    await bound(client, view, parameters={"temperature": 0.1}).summarize(
        SummaryRequest(stretch(view, 3), None, MODEL)
    )
    call, _ = sent(route)
    assert "thinking" not in call and call["max_tokens"] == 1_000
    assert call["temperature"] == 0.1  # allowed without thinking
    # its thinking blocks stay in the prefix: the API ignores them with thinking off
    assert call["messages"][1]["content"][0] == THINKING


async def test_at_four_breakpoints_the_newest_moves_to_the_end(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    body = messages_body()
    hour = {"type": "ephemeral", "ttl": "1h"}
    first = body["messages"][0]
    first["content"] = [{"type": "text", "text": "Fix the failing test.", "cache_control": hour}]
    body["messages"][1]["content"][1]["cache_control"] = hour
    view = lift(body)
    await bound(client, view).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
    call, _ = sent(route)
    assert marks(call) == ["system.0", "system.1", "messages.0.content.0", "messages.2.content.0"]
    # the moved one's control, so a longer ttl never follows a shorter one
    assert call["messages"][2]["content"][0]["cache_control"] == hour
    assert "cache_control" not in call["messages"][1]["content"][1]


async def test_no_breakpoint_is_added_past_four_elsewhere(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    tools = [{**tool, "cache_control": EPHEMERAL} for tool in (TOOLS[0], {**TOOLS[0], "name": "R"})]
    view = lift(messages_body(tools=tools))
    await bound(client, view).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
    call, _ = sent(route)
    assert orjson.dumps(call["messages"][2]) == orjson.dumps(view.native["messages"][2])
    assert len(marks(call)) + sum("cache_control" in t for t in call["tools"]) == 4


async def test_made_up_stretch_messages_are_lowered_after_the_clients(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view = lift(messages_body())
    # an earlier strategy collapsed the tool-use group into a message the request lacks
    made_up = {"role": "assistant", "content": "[Tool results: Bash: 1 failed]"}
    request = SummaryRequest((*stretch(view, 1), made_up), None, MODEL)
    await bound(client, view).summarize(request)
    call, _ = sent(route)
    # the client's own message closes the cached part: the breakpoint goes there (its string
    # content as the one text block it stands for), not on the made-up message after it
    task = view.native["messages"][0]["content"]
    assert call["messages"][0]["content"] == [
        {"type": "text", "text": task, "cache_control": EPHEMERAL}
    ]
    assert call["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": made_up["content"]}],
    }
    assert marks(call) == ["system.0", "system.1", "messages.0.content.0"]
    assert call["messages"][2]["content"].startswith(PREFIX_MARKER)


class ContextView(DoubleView):
    """Lowers a made-up assistant message as user text before a turn that opens with thinking,
    as the Messages format does: a message's form depends on what follows it."""

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        items: list[Any] = []
        for index, message in enumerate(messages):
            if message is self.system:
                continue
            own = self.owner.get(id(message))
            if own is not None:
                if not items or items[-1] is not own:
                    items.append(own)
                continue
            after = messages[index + 1] if index + 1 < len(messages) else None
            before_thinking = after is not None and bool(after.get("thinking"))
            role = "user" if before_thinking else str(message["role"])
            items.append({"role": role, "content": [{"type": "text", "text": message["content"]}]})
        return Lowered(items)


def checkpoint_view() -> tuple[ContextView, list[dict[str, Any]], dict[str, Any]]:
    """A view as a checkpoint hit forwards it: a made-up message (an earlier event's collapse)
    between the task and the next thinking turn."""
    base = lift(messages_body())
    view = ContextView(base.chat, base.native, base.system, base.owner)
    made_up = {"role": "assistant", "content": "[Tool results: Bash: 1 failed FACT-2]"}
    chat = view.chat["messages"]
    forwarded = [chat[0], chat[1], made_up, *chat[2:]]
    return view, forwarded, made_up


async def test_the_cached_part_is_what_the_whole_request_lowers_to(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view, forwarded, made_up = checkpoint_view()
    summarizer = bound(client, view)
    summarizer._request = ForwardedRequest.from_body(
        {**view.chat, "messages": forwarded}, "anthropic", view.native_request()
    )
    # the stretch ends at the made-up message: cut there, it would lower as assistant text
    assert view.lower(forwarded[:3]).items[-1]["role"] == "assistant"
    await summarizer.summarize(SummaryRequest((forwarded[1], made_up), None, MODEL))
    call, _ = sent(route)
    first, collapsed, instruction_message = call["messages"]
    assert first == view.native["messages"][0]
    # as the forwarded request carried it (before a thinking turn): user text
    assert collapsed["role"] == "user"
    assert collapsed["content"][0]["text"] == made_up["content"]
    assert instruction_message["content"].startswith(PREFIX_MARKER)


async def test_lowerings_that_do_not_line_up_get_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view = lift(messages_body())

    def shifting(messages: Sequence[Mapping[str, Any]]) -> Lowered:
        items = list(view.lower(messages).items)
        if len(messages) == len(view.chat["messages"]):  # the whole request: one item more
            items.insert(0, {"role": "user", "content": "note"})
        return Lowered(items)

    native = NativeRequest(view.native, shifting, {})
    await bound(client, view, native=native).summarize(
        SummaryRequest(stretch(view, 3), None, MODEL)
    )
    call, _ = sent(route)
    assert call["messages"][0]["content"][0]["text"].startswith("<conversation>")


async def test_a_prefix_the_view_cannot_lower_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view = lift(messages_body())

    def refuse(messages: Sequence[Mapping[str, Any]]) -> Lowered:
        raise RuntimeError("cannot lower")

    native = NativeRequest(view.native, refuse, {"anthropic-beta": BETA})
    await bound(client, view, native=native).summarize(
        SummaryRequest(stretch(view, 3), None, MODEL)
    )
    call, headers = sent(route)
    [turn] = call["messages"]
    assert turn["content"][0]["text"].startswith("<conversation>")
    assert "tools" not in call and "thinking" not in call
    assert "anthropic-beta" not in headers  # the transcript needs no beta


async def test_a_prefix_ending_in_a_tool_use_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """The API wants a tool use's results in the very next message: a prefix cut between the
    two (a view that could not place the results) is not sent."""
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view = lift(messages_body())
    await bound(client, view).summarize(SummaryRequest(stretch(view, 2), None, MODEL))
    call, _ = sent(route)
    assert call["messages"][0]["content"][0]["text"].startswith("<conversation>")


@pytest.mark.parametrize(
    "settings",
    [{"model": "claude-haiku-4-5"}, {"reusePrefix": "never"}],
)
async def test_another_model_or_never_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport, settings: dict[str, Any]
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    view = lift(messages_body())
    await bound(client, view, **settings).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
    call, _ = sent(route)
    assert call["messages"][0]["content"][0]["text"].startswith("<conversation>")
    assert "FACT-1" in call["messages"][0]["content"][0]["text"]


async def test_a_chat_provider_never_gets_the_lifted_view_as_a_prefix(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """`always` on a chat provider: the view's messages are not chat completions (thinking
    aside, blocks), so the transcript goes, never the view."""
    route = mock.post(f"{OPENAI}/chat/completions").mock(
        return_value=httpx.Response(
            200,
            json={"choices": [{"finish_reason": "stop", "message": {"content": "## Goal\nx"}}]},
        )
    )
    view = lift(messages_body())
    await bound(client, view, provider="openai", reusePrefix="always").summarize(
        SummaryRequest(stretch(view, 3), None, MODEL)
    )
    call, _ = sent(route)
    assert [m["role"] for m in call["messages"]] == ["system", "user"]
    assert call["messages"][1]["content"].startswith("<conversation>")


async def test_a_chat_request_never_gets_a_messages_prefix(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """`always` with a Messages provider for a chat request: no Messages form of its prefix
    exists, so the transcript goes."""
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    shared = HttpSummarizer(
        SummarizationSettings.model_validate({"provider": "anthropic", "reusePrefix": "always"}),
        upstreams(),
        client,
    )
    asked: dict[str, Any] = {"role": "user", "content": "hi FACT-9"}
    chat = {"model": "gpt-4o", "messages": [asked]}
    summarizer = shared.bind(
        caller_key=None,
        request=ForwardedRequest.from_body(chat, "openai"),
        wire=DEFAULT_FORMAT,
        upstream="openai",
    )
    await summarizer.summarize(SummaryRequest((asked,), None, "gpt-4o"))
    call, _ = sent(route)
    assert call["messages"][0]["content"][0]["text"].startswith("<conversation>")


async def test_cache_reads_of_the_prefix_form_are_counted(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply(cached=12_345))
    stats = SummarizerStats()
    view = lift(messages_body())
    await bound(client, view, stats=stats).summarize(SummaryRequest(stretch(view, 3), None, MODEL))
    assert stats.cached_tokens == {("anthropic", MODEL): 12_345}


# ------------------------------------------------------------------ through the flow


async def test_the_flow_hands_the_native_request_to_the_summarizer(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """A format whose view is not chat completions (`prefix_summaries` False) still gets the
    prefix form when the route hands the flow the client's own request."""
    settings = Settings.model_validate(
        {
            "upstreams": [
                {"name": "anthropic", "base_url": ANTHROPIC, "models": ["*"], "api": "messages"}
            ],
            "models": {MODEL: {"context_window": 3_000, "max_output_tokens": 500}},
            "summarization": {"enabled": True, "maxSummaryTokens": 300},
            "compaction": {
                "pipeline": [
                    {
                        "strategy": "summarization",
                        "trigger": {"tokens_exceed": 400},
                        "retain_recent": {"turns": 1},
                    }
                ]
            },
        }
    )
    route = mock.post(f"{ANTHROPIC}/messages").mock(return_value=reply())
    compactor = Compactor(settings)
    try:
        body = messages_body()
        body["messages"][2]["content"][0]["content"] = "1 failed FACT-2 " + "log line " * 400
        view = lift(body)

        async def run(native: NativeRequest | None) -> dict[str, Any]:
            calls = route.call_count
            # a flow of its own: summaries are shared across requests of one flow
            flow = build_flow(settings, compactor, MemoryStore(), client)
            result = await flow.run(
                FlowRequest(
                    view.chat,
                    Mode.FORCE,
                    size_hint=0,
                    credential="k",
                    caller_key=None,
                    upstream_name="anthropic",
                    persist=False,
                    wire=STAND_IN,
                    native=native,
                )
            )
            assert result.result is not None and "summarization" in result.result.report.changed_by
            assert route.call_count == calls + 1
            call, _ = sent(route)
            return call

        prefixed = await run(view.native_request({"anthropic-beta": BETA}))
        assert orjson.dumps(prefixed["system"]) == orjson.dumps(SYSTEM)
        assert prefixed["messages"][0] == body["messages"][0]
        assert prefixed["messages"][-1]["content"].startswith(PREFIX_MARKER)
        transcript = await run(None)
        assert "system" in transcript and "tools" not in transcript
        assert transcript["messages"][0]["content"][0]["text"].startswith("<conversation>")
    finally:
        compactor.close()


def test_the_route_hands_over_the_headers_the_call_repeats() -> None:
    body = messages_body()
    view = lift(body)
    scope: dict[str, Any] = {
        "headers": [
            (b"anthropic-beta", b"interleaved-thinking-2025-05-14"),
            (b"x-api-key", b"sk-ant-caller-SECRET"),
            (b"anthropic-beta", b"context-1m-2025-08-07"),
            (b"anthropic-version", b"2023-06-01"),
        ]
    }
    native = native_request(scope, STAND_IN, body, view)
    assert native is not None
    assert native.headers == {
        "anthropic-beta": "interleaved-thinking-2025-05-14, context-1m-2025-08-07",
        "anthropic-version": "2023-06-01",
    }
    assert native.body is body and native.lower == view.lower
    assert native_request(scope, DEFAULT_FORMAT, {"messages": []}, view) is None  # chat's own
