"""Cache-aligned summary calls (compaction_proxy/summarizer/_prefix.py): the request's own prefix
plus one instruction, and when the transcript form is used instead."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryRequest
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.summarizer import (
    CHECKPOINT_PROMPT,
    UPDATE_PROMPT,
    HttpSummarizer,
    SummarizerStats,
)
from compaction_proxy.summarizer._prefix import (
    PREFIX_MARKER,
    ForwardedRequest,
    has_binary,
    place_stretch,
    stretch_end,
)
from compaction_proxy.upstream import UpstreamTransport

OPENAI = "https://api.openai.test/v1"
OTHER = "https://other.test/v1"

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}},
    }
]
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "def main(): pass"}
U1 = {"role": "user", "content": "Please fix the bug in src/app.py"}
A1 = {"role": "assistant", "content": "Looking.", "reasoning_content": "hidden thoughts"}
U2 = {"role": "user", "content": "And add a test."}
A2 = {"role": "assistant", "content": "Done."}
U3 = {"role": "user", "content": "Thanks, now the docs."}
MESSAGES = [SYSTEM, U1, A1, CALL, RESULT, U2, A2, U3]
STRETCH = (U1, A1, CALL, RESULT)


def upstreams() -> list[UpstreamSettings]:
    return [
        UpstreamSettings.model_validate(
            {"name": "openai", "base_url": OPENAI, "models": ["gpt-*"]}
        ),
        UpstreamSettings.model_validate({"name": "other", "base_url": OTHER, "models": ["x-*"]}),
    ]


def completion(cached: int | None = None) -> httpx.Response:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "## Goal\nFix the bug."},
            }
        ],
    }
    if cached is not None:
        body["usage"] = {
            "prompt_tokens": 500,
            "completion_tokens": 10,
            "total_tokens": 510,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    return httpx.Response(200, json=body)


def summarizer(
    client: UpstreamTransport,
    *,
    window: int = 128_000,
    body: dict[str, Any] | None = None,
    stats: SummarizerStats | None = None,
    **settings: Any,
) -> HttpSummarizer:
    shared = HttpSummarizer(
        SummarizationSettings.model_validate(settings),
        upstreams(),
        client,
        facts_for=lambda _m: ModelFacts(context_window=window, max_output_tokens=1024),
        stats=stats,
    )
    request = (
        body if body is not None else {"model": "gpt-4o", "messages": MESSAGES, "tools": TOOLS}
    )
    return shared.bind(caller_key=None, request=ForwardedRequest.from_body(request, "openai"))


def sent(route: respx.Route) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(route.calls[-1].request.content)
    return loaded


def is_transcript(body: dict[str, Any]) -> bool:
    return [m["role"] for m in body["messages"]] == ["system", "user"] and body["messages"][1][
        "content"
    ].startswith("<conversation>")


async def test_the_prefix_is_the_requests_own_messages_byte_for_byte(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    await summarizer(client).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    body = sent(route)
    messages = body["messages"]
    prefix = [SYSTEM, *STRETCH]
    # the same bytes as the forwarded request's messages, up to the stretch's end
    assert orjson.dumps(messages[: len(prefix)]) == orjson.dumps(MESSAGES[: len(prefix)])
    assert orjson.dumps(body["tools"]) == orjson.dumps(TOOLS)
    assert "tool_choice" not in body  # the request had none
    assert len(messages) == len(prefix) + 1
    final = messages[-1]
    assert final["role"] == "user"
    assert final["content"].startswith(PREFIX_MARKER)
    assert CHECKPOINT_PROMPT in final["content"]
    assert "<previous-checkpoint>" not in final["content"]


async def test_an_update_puts_the_previous_summary_in_the_instruction(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    await summarizer(client).summarize(SummaryRequest(STRETCH, "## Goal\nOld goal", "gpt-4o"))
    final = sent(route)["messages"][-1]["content"]
    assert final.startswith(PREFIX_MARKER)
    assert UPDATE_PROMPT in final
    assert "<previous-checkpoint>\n## Goal\nOld goal\n</previous-checkpoint>" in final


async def test_a_forced_tool_choice_becomes_none(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    body = {"model": "gpt-4o", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    await summarizer(client, body=body).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert sent(route)["tool_choice"] == "none"


async def test_a_different_summarizer_model_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    await summarizer(client, model="gpt-4o-mini").summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    body = sent(route)
    assert is_transcript(body) and "tools" not in body


async def test_a_different_provider_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OTHER}/chat/completions").mock(return_value=completion())
    await summarizer(client, provider="other").summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert is_transcript(sent(route))


async def test_always_reuses_the_prefix_for_another_model(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    await summarizer(client, model="gpt-4o-mini", reusePrefix="always").summarize(
        SummaryRequest(STRETCH, None, "gpt-4o")
    )
    assert sent(route)["messages"][-1]["content"].startswith(PREFIX_MARKER)


async def test_never_gives_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    await summarizer(client, reusePrefix="never").summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert is_transcript(sent(route))


@pytest.mark.parametrize("mode", ["auto", "always"])
async def test_a_prefix_too_big_for_the_window_falls_back(
    mock: respx.MockRouter, client: UpstreamTransport, mode: str
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    big = {"role": "tool", "tool_call_id": "c1", "content": "line of log output\n" * 2000}
    messages = [SYSTEM, U1, A1, CALL, big, U2, A2, U3]
    body = {"model": "gpt-4o", "messages": messages, "tools": TOOLS}
    # 8k window, 1k output: the ~10k-token prefix cannot fit; the transcript elides the log
    await summarizer(client, window=8_000, body=body, reusePrefix=mode).summarize(
        SummaryRequest((U1, A1, CALL, big), None, "gpt-4o")
    )
    assert is_transcript(sent(route))


async def test_images_in_the_prefix_get_the_transcript_under_auto(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    messages = [SYSTEM, image, A1, U2, A2, U3]
    body = {"model": "gpt-4o", "messages": messages}
    await summarizer(client, body=body).summarize(SummaryRequest((image, A1), None, "gpt-4o"))
    assert is_transcript(sent(route))
    await summarizer(client, body=body, reusePrefix="always").summarize(
        SummaryRequest((image, A1), None, "gpt-4o")
    )
    assert sent(route)["messages"][:3] == messages[:3]


async def test_made_up_stretch_messages_follow_the_cached_part(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    # an earlier strategy collapsed the tool-call group into a message the request lacks
    made_up = {"role": "assistant", "content": "[Tool results: read_file: def main(): pass]"}
    await summarizer(client).summarize(SummaryRequest((U1, A1, made_up), None, "gpt-4o"))
    messages = sent(route)["messages"]
    assert messages[:4] == [SYSTEM, U1, A1, made_up]
    assert messages[4]["content"].startswith(PREFIX_MARKER) and len(messages) == 5


async def test_an_unplaceable_stretch_gets_the_transcript(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    made_up = {"role": "assistant", "content": "[Tool results: read_file]"}
    await summarizer(client).summarize(SummaryRequest((made_up,), None, "gpt-4o"))
    assert is_transcript(sent(route))


async def test_cached_tokens_are_counted(mock: respx.MockRouter, client: UpstreamTransport) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion(cached=384))
    stats = SummarizerStats()
    await summarizer(client, stats=stats).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert stats.cached_tokens == {("openai", "gpt-4o"): 384}
    assert stats.total_cached_tokens() == 384
    assert stats.forms == {"prefix": 1}


def test_stretch_end_matches_identity_equality_and_trimmed_results() -> None:
    assert stretch_end(MESSAGES, STRETCH) == (5, 4)
    copies = tuple(dict(m) for m in STRETCH)
    assert stretch_end(MESSAGES, copies) == (5, 4)
    trimmed = {**RESULT, "content": "[trimmed]"}
    assert stretch_end(MESSAGES, (U1, A1, CALL, trimmed)) == (5, 4)
    assert stretch_end(MESSAGES, (U1, {"role": "assistant", "content": "nope"})) == (2, 1)
    assert stretch_end(MESSAGES, ({"role": "assistant", "content": "nope"},)) is None
    # a repeated short message is placed after the ones before it
    ok = {"role": "user", "content": "ok"}
    messages = [SYSTEM, ok, A1, dict(ok), A2]
    assert stretch_end(messages, (messages[3], A2)) == (5, 2)
    assert place_stretch(messages, (messages[3], A2)) == messages


def test_has_binary() -> None:
    assert not has_binary(MESSAGES)
    blob = "".join(chr(65 + (i * 7) % 26) + chr(97 + (i * 3) % 26) for i in range(200))
    assert has_binary([{"role": "tool", "content": f"file: {blob}"}])
    assert has_binary([{"role": "user", "content": "see data:image/png;base64,AAAA"}])
    assert not has_binary([{"role": "user", "content": "x" * 500}])


async def test_a_prefix_the_core_hands_over_is_used_without_a_bound_request(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    shared = HttpSummarizer(
        SummarizationSettings.model_validate({}),
        upstreams(),
        client,
        facts_for=lambda _m: ModelFacts(context_window=128_000, max_output_tokens=1024),
    )
    prefix = (SYSTEM, *STRETCH)
    request = SummaryRequest(STRETCH, None, "gpt-4o", prefix=prefix, tools=tuple(TOOLS))
    await shared.bind(caller_key=None).summarize(request)
    body = sent(route)
    assert body["messages"][: len(prefix)] == list(prefix)
    assert body["messages"][-1]["content"].startswith(PREFIX_MARKER)
    assert body["tools"] == TOOLS
