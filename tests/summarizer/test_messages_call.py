"""The summary call in Anthropic's Messages form (compaction_proxy/wire/messages/_summary.py):
its body from chat-shaped messages, how its answer is read, and which upstreams get it
(``upstreams[].api``, compaction_proxy/summarizer/_http.py ``_form``)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryError, SummaryRequest
from compaction_proxy.config import ConfigError, Settings, UpstreamSettings, preflight
from compaction_proxy.summarizer import CHECKPOINT_PROMPT, HttpSummarizer, SummarizerStats
from compaction_proxy.upstream import UpstreamTransport
from compaction_proxy.wire import CallerKey, api_names
from compaction_proxy.wire.messages._summary import (
    MESSAGES_SUMMARY,
    THINKING_HEADROOM,
    messages_form,
)

ANTHROPIC = "https://api.anthropic.test/v1"
OPENAI = "https://api.openai.test/v1"
OPERATOR_KEY = "sk-ant-operator-SECRET-1234"
CALLER = "Bearer sk-caller-SECRET-5678"

STRETCH: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Please fix the bug in src/app.py, FACT-42"},
    {"role": "assistant", "content": "Looking."},
)

pytestmark = pytest.mark.usefixtures("messages_api")


def messages_reply(
    content: list[dict[str, Any]] | None = None,
    *,
    stop: str = "end_turn",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content if content is not None else [{"type": "text", "text": "## Goal\nFix."}],
        "stop_reason": stop,
        "usage": usage if usage is not None else {"input_tokens": 500, "output_tokens": 12},
    }


# ------------------------------------------------------------------ the body


def test_chat_shaped_messages_become_a_messages_body() -> None:
    messages = [
        {"role": "system", "content": "Write a checkpoint."},
        {"role": "user", "content": "<conversation>\n[user]\nhi\n</conversation>"},
    ]
    body = MESSAGES_SUMMARY.body(
        {}, "claude-sonnet-4-5", messages, {}, "max_completion_tokens", 800
    )
    assert body == {
        "model": "claude-sonnet-4-5",
        "stream": False,
        "system": "Write a checkpoint.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<conversation>\n[user]\nhi\n</conversation>"}
                ],
            }
        ],
        "max_tokens": 800,  # always, under Messages' own name
    }


def test_messages_form_joins_system_text_and_drops_empty_messages() -> None:
    system, turns = messages_form(
        [
            {"role": "system", "content": "one"},
            {"role": "developer", "content": [{"type": "text", "text": "two"}]},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": [{"type": "text", "text": "said"}]},
            {"role": "tool", "content": "result"},
        ]
    )
    assert system == "one\n\ntwo"
    assert turns == [
        {"role": "assistant", "content": [{"type": "text", "text": "said"}]},
        {"role": "user", "content": [{"type": "text", "text": "result"}]},
    ]


def test_only_parameters_messages_accepts_are_sent() -> None:
    parameters = {
        "temperature": 0.2,
        "top_k": 20,
        "frequency_penalty": 0.5,  # chat's: Messages refuses unknown fields
        "seed": 7,
        "reasoning_effort": "low",
        "stop": "END",
        "metadata": {"user_id": "u-1"},
    }
    body = MESSAGES_SUMMARY.body(parameters, "m", list(STRETCH), {}, "max_tokens", 500)
    assert {k: body[k] for k in ("temperature", "top_k", "metadata")} == {
        "temperature": 0.2,
        "top_k": 20,
        "metadata": {"user_id": "u-1"},
    }
    assert body["stop_sequences"] == ["END"]
    for name in ("frequency_penalty", "seed", "reasoning_effort", "stop"):
        assert name not in body


def test_thinking_in_the_parameters_gets_room_and_no_sampling() -> None:
    adaptive = {"thinking": {"type": "adaptive"}, "temperature": 0.3, "top_p": 0.9}
    body = MESSAGES_SUMMARY.body(adaptive, "m", list(STRETCH), {}, "max_tokens", 500)
    assert body["max_tokens"] == 500 + THINKING_HEADROOM
    assert "temperature" not in body and "top_p" not in body  # refused beside thinking
    budget = {"thinking": {"type": "enabled", "budget_tokens": 2_000}}
    body = MESSAGES_SUMMARY.body(budget, "m", list(STRETCH), {}, "max_tokens", 500)
    assert body["max_tokens"] == 2_500  # max_tokens must exceed the budget


# ------------------------------------------------------------------ the answer


def test_the_answer_is_its_text_blocks() -> None:
    reply = MESSAGES_SUMMARY.read(
        messages_reply(
            [
                {"type": "text", "text": "## Goal\n"},
                {"type": "text", "text": "Fix it."},
            ],
            usage={"input_tokens": 20, "output_tokens": 9, "cache_read_input_tokens": 4_000},
        )
    )
    assert reply.text == "## Goal\nFix it."
    assert not reply.cut
    assert reply.completion_tokens == 9
    assert reply.cached_tokens == 4_000


def test_thinking_blocks_are_ignored_and_not_counted_as_the_summary() -> None:
    reply = MESSAGES_SUMMARY.read(
        messages_reply(
            [
                {"type": "thinking", "thinking": "let me think", "signature": "c2ln"},
                {"type": "redacted_thinking", "data": "ZGF0YQ=="},
                {"type": "text", "text": "## Goal\nFix it."},
            ],
            usage={"input_tokens": 20, "output_tokens": 900},
        )
    )
    assert reply.text == "## Goal\nFix it."
    # output_tokens counts the thinking too: the summarizer counts the text itself
    assert reply.completion_tokens is None


def test_max_tokens_is_a_cut_summary() -> None:
    assert MESSAGES_SUMMARY.read(messages_reply(stop="max_tokens")).cut


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": [{"message": {"role": "assistant", "content": "chat"}}]},
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
        {"type": "message", "role": "user", "content": []},
        ["not", "an", "object"],
        {"type": "message", "content": "text"},
    ],
)
def test_what_is_not_a_messages_reply_is_refused(payload: Any) -> None:
    with pytest.raises(ValueError):
        MESSAGES_SUMMARY.read(payload)


# ------------------------------------------------------------------ which upstream gets it


def upstreams(api: str = "messages", key: str | None = OPERATOR_KEY) -> list[UpstreamSettings]:
    return [
        UpstreamSettings.model_validate(
            {"name": "openai", "base_url": OPENAI, "models": ["gpt-*"]}
        ),
        UpstreamSettings.model_validate(
            {"name": "Anthropic", "base_url": ANTHROPIC, "api_key": key, "models": [], "api": api}
        ),
    ]


def summarizer(
    client: UpstreamTransport,
    *,
    api: str = "messages",
    stats: SummarizerStats | None = None,
    **settings: Any,
) -> HttpSummarizer:
    values = {"provider": "anthropic", "model": "claude-sonnet-4-5", **settings}
    return HttpSummarizer(
        SummarizationSettings.model_validate(values),
        upstreams(api),
        client,
        facts_for=lambda _m: ModelFacts(context_window=200_000, max_output_tokens=8_000),
        stats=stats,
    )


async def test_a_provider_that_speaks_messages_gets_a_messages_call(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/messages").mock(
        return_value=httpx.Response(200, json=messages_reply())
    )
    stats = SummarizerStats()
    bound = summarizer(client, stats=stats).bind(caller_key=CallerKey("authorization", CALLER))
    text = await bound.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert text == "## Goal\nFix."
    request = route.calls[-1].request
    assert request.headers["x-api-key"] == OPERATOR_KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    # the caller's key was meant for the request's own upstream, never for this one
    assert "authorization" not in request.headers
    body = orjson.loads(request.content)
    assert body["model"] == "claude-sonnet-4-5"
    assert body["max_tokens"] == 4_096 and body["stream"] is False
    assert CHECKPOINT_PROMPT in body["system"]
    [turn] = body["messages"]
    assert turn["role"] == "user" and "FACT-42" in turn["content"][0]["text"]
    assert stats.forms == {"transcript": 1}


async def test_a_chat_provider_still_gets_a_chat_completion(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{ANTHROPIC}/chat/completions").mock(
        return_value=httpx.Response(
            200,
            json={
                "choices": [
                    {"finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                ]
            },
        )
    )
    await summarizer(client, api="chat").summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert route.calls[-1].request.headers["authorization"] == f"Bearer {OPERATOR_KEY}"


async def test_a_chat_completion_from_a_messages_upstream_is_an_error(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{ANTHROPIC}/messages").mock(
        return_value=httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})
    )
    with pytest.raises(SummaryError) as caught:
        await summarizer(client).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert caught.value.reason == "error"
    assert "not a Messages reply" in str(caught.value)


async def test_an_anthropic_error_names_its_type_never_its_text(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{ANTHROPIC}/messages").mock(
        return_value=httpx.Response(
            529,
            json={"type": "error", "error": {"type": "overloaded_error", "message": "secret"}},
        )
    )
    with pytest.raises(SummaryError) as caught:
        await summarizer(client).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert "HTTP 529 (overloaded_error)" in str(caught.value)
    assert "secret" not in str(caught.value)


async def test_a_cut_summary_is_oversized(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{ANTHROPIC}/messages").mock(
        return_value=httpx.Response(200, json=messages_reply(stop="max_tokens"))
    )
    with pytest.raises(SummaryError) as caught:
        await summarizer(client).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert caught.value.reason == "oversized"


def test_an_api_no_format_speaks_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="'messagez' is not an API the proxy speaks"):
        HttpSummarizer(
            SummarizationSettings.model_validate({"provider": "anthropic"}),
            upstreams("messagez"),
            httpx.AsyncClient(),
        )


def test_preflight_names_the_upstream_whose_api_is_unknown() -> None:
    settings = Settings.model_validate(
        {
            "upstreams": [
                {"name": "a", "base_url": OPENAI},
                {"name": "b", "base_url": ANTHROPIC, "api": "anthropic"},
            ]
        }
    )
    found = preflight.problems(settings, apis=api_names())
    assert len(found) == 1
    assert found[0].startswith("upstreams.1.api: 'anthropic' is not an API the proxy speaks")
    assert "messages" in found[0]
    assert preflight.problems(settings) == []  # without the registry's names: not checked


def test_api_defaults_to_chat() -> None:
    upstream = UpstreamSettings.model_validate({"name": "a", "base_url": OPENAI})
    assert upstream.api == "chat"
    with pytest.raises(ValueError):
        UpstreamSettings.model_validate(
            {"name": "a", "base_url": OPENAI, "api": "Chat Completions"}
        )
