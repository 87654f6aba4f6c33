"""HttpSummarizer against a mocked upstream (respx): request shape, routing, credentials,
every failure reason, unwrapping and metrics."""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.compaction.budget import ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import CUT_MARK, SummaryError, SummaryRequest
from compaction_proxy.config import ConfigError, Settings, UpstreamSettings
from compaction_proxy.config.preflight import validate_summarization_config
from compaction_proxy.summarizer import (
    CHECKPOINT_PROMPT,
    UPDATE_PROMPT,
    HttpSummarizer,
    SummaryCallRecord,
)
from compaction_proxy.summarizer._prompts import own_limit_note
from compaction_proxy.summarizer._replies import salvage, without_repeats
from compaction_proxy.upstream import HttpxUpstream, UpstreamTransport
from compaction_proxy.wire import CallerKey

OPENAI = "https://api.openai.test/v1"
LOCAL = "http://local.test:8000/v1"
CALLER = "Bearer sk-caller-SECRET-1234"
CALLER_KEY = CallerKey("authorization", CALLER)
UPSTREAM_KEY = "sk-upstream-SECRET-5678"

STRETCH: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Please fix the bug in src/app.py"},
    {"role": "assistant", "content": "Looking.", "reasoning_content": "hidden thoughts"},
)


def upstreams(*, key: str | None = None) -> list[UpstreamSettings]:
    return [
        UpstreamSettings.model_validate(
            {"name": "openai", "base_url": OPENAI, "api_key": key, "models": ["gpt-*", "o*"]}
        ),
        UpstreamSettings.model_validate({"name": "Local", "base_url": LOCAL, "models": ["llama*"]}),
    ]


def summ(**values: Any) -> SummarizationSettings:
    return SummarizationSettings.model_validate(values)


def completion(
    content: Any = "## Goal\nFix the bug.",
    *,
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": content},
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return httpx.Response(200, json=body)


def sent(route: respx.Route, n: int = -1) -> tuple[dict[str, Any], httpx.Headers]:
    request = route.calls[n].request
    return orjson.loads(request.content), request.headers


async def test_request_shape(mock: respx.MockRouter, client: UpstreamTransport) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=512, parameters={"temperature": 0.2, "top_p": 0.9}),
        upstreams(),
        client,
    ).bind(caller_key=CALLER_KEY)
    text = await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert text == "## Goal\nFix the bug."
    body, headers = sent(route)
    assert body["model"] == "gpt-4o"
    assert body["stream"] is False
    assert body["max_completion_tokens"] == 512 and "max_tokens" not in body
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    # Our prompt, and the limit stated (a small model writes on until cut otherwise).
    assert body["messages"][0]["content"] == CHECKPOINT_PROMPT + own_limit_note(512)
    user = body["messages"][1]["content"]
    assert user.startswith("<conversation>\n[user]\nPlease fix the bug in src/app.py")
    assert "hidden thoughts" not in user
    assert headers["authorization"] == CALLER


async def test_update_request_carries_the_previous_summary(
    mock: respx.MockRouter,
    client: UpstreamTransport,
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(summ(), upstreams(), client)
    await summarizer.summarize(SummaryRequest(STRETCH, "## Goal\nOld goal", "gpt-4o"))
    body, headers = sent(route)
    assert body["messages"][0]["content"].startswith(UPDATE_PROMPT)
    assert (
        "<previous-checkpoint>\n## Goal\nOld goal\n</previous-checkpoint>"
        in (body["messages"][1]["content"])
    )
    assert "authorization" not in headers  # unbound and no upstream key: nothing to send
    assert body["max_completion_tokens"] == 4096  # the default limit


async def test_upstream_key_wins_over_the_caller(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(summ(), upstreams(key=UPSTREAM_KEY), client)
    await summarizer.bind(caller_key=CALLER_KEY).summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert sent(route)[1]["authorization"] == f"Bearer {UPSTREAM_KEY}"


async def test_bind_does_not_change_the_shared_instance(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    shared = HttpSummarizer(summ(), upstreams(), client)
    bound = shared.bind(caller_key=CALLER_KEY)
    await shared.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    await bound.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert "authorization" not in sent(route, 0)[1]
    assert sent(route, 1)[1]["authorization"] == CALLER
    assert bound.stats is shared.stats  # one set of metrics


@pytest.mark.parametrize("provider", ["openAI", "OPENAI", "openai"])
async def test_provider_by_name_case_insensitive(
    provider: str, mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(summ(provider=provider, model="gpt-4o-mini"), upstreams(), client)
    # The chat request goes to the local upstream; the summary to the configured provider.
    await summarizer.summarize(SummaryRequest(STRETCH, None, "llama-3-70b"))
    assert sent(route)[0]["model"] == "gpt-4o-mini"


async def test_default_is_the_requests_own_upstream(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    local = mock.post(f"{LOCAL}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(summ(), upstreams(), client)
    await summarizer.summarize(SummaryRequest(STRETCH, None, "llama-3-70b"))
    assert sent(local)[0]["model"] == "llama-3-70b"
    summarizer = HttpSummarizer(summ(provider="local"), upstreams(), client)
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert sent(local)[0]["model"] == "gpt-4o"


def test_validate_summarization_config() -> None:
    base = {"upstreams": [{"name": "openai", "base_url": OPENAI}]}
    validate_summarization_config(
        Settings.model_validate(
            {**base, "summarization": {"provider": "openAI", "model": "gpt-4o-mini"}}
        )
    )
    with pytest.raises(ConfigError, match=r"no upstream named 'anthropic'.*openai"):
        validate_summarization_config(
            Settings.model_validate({**base, "summarization": {"provider": "anthropic"}})
        )
    with pytest.raises(ConfigError, match=r"summarization\.parameters\.stream"):
        validate_summarization_config(
            Settings.model_validate({**base, "summarization": {"parameters": {"stream": True}}})
        )
    with pytest.raises(ConfigError):
        HttpSummarizer(summ(provider="nope"), upstreams(), HttpxUpstream(httpx.AsyncClient()))


async def test_max_tokens_when_the_parameters_say_so(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=300, parameters={"max_tokens": 1}), upstreams(), client
    )
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    body = sent(route)[0]
    assert body["max_tokens"] == 300 and "max_completion_tokens" not in body
    # Configured explicitly, and parameters.maxSummaryTokens wins (and is not sent).
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=300, parameters={"maxSummaryTokens": 200}),
        upstreams(),
        client,
        limit_param="max_tokens",
    )
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    body = sent(route)[0]
    assert body["max_tokens"] == 200 and "maxSummaryTokens" not in body


# ------------------------------------------------------------------ failures


async def reason_of(summarizer: HttpSummarizer, model: str = "gpt-4o") -> SummaryError:
    with pytest.raises(SummaryError) as caught:
        await summarizer.summarize(SummaryRequest(STRETCH, None, model))
    return caught.value


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(500, json={"error": {"message": "boom", "code": "server_error"}}), "error"),
        (
            httpx.Response(
                401,
                json={"error": {"message": f"bad key {UPSTREAM_KEY}", "code": "invalid_api_key"}},
            ),
            "error",
        ),
        (httpx.Response(200, content=b"<html>not json"), "error"),
        (httpx.Response(200, json={"choices": []}), "error"),
        (completion(""), "empty"),
        (completion("  \n\t "), "empty"),
        (completion(None), "empty"),
        (completion("<summary>\n</summary>"), "empty"),
        (completion("x", finish="length"), "oversized"),
        (completion("x", usage={"completion_tokens": 101, "prompt_tokens": 5}), "oversized"),
        (completion("word " * 1000), "oversized"),  # no usage: counted by us
    ],
)
async def test_failure_reasons(
    response: httpx.Response, reason: str, mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(return_value=response)
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=100), upstreams(key=UPSTREAM_KEY), client
    ).bind(caller_key=CALLER_KEY)
    error = await reason_of(summarizer)
    assert error.reason == reason
    assert "SECRET" not in str(error) and "SECRET" not in error.message
    assert "openai" in str(error)
    if response.status_code != 200:
        assert f"HTTP {response.status_code}" in str(error)
    assert summarizer.stats.count(reason) == 1  # our prompt stated the limit: not asked again


async def test_timeout_from_the_transport(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(side_effect=httpx.ReadTimeout("slow"))
    error = await reason_of(HttpSummarizer(summ(), upstreams(), client))
    assert error.reason == "timeout"


async def test_timeout_is_a_total_bound(mock: respx.MockRouter, client: UpstreamTransport) -> None:
    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()  # the upstream never answers
        return completion()

    mock.post(f"{OPENAI}/chat/completions").mock(side_effect=never)
    summarizer = HttpSummarizer(summ(), upstreams(), client, timeout=0.2)
    # Only the summarizer's own bound can end this (the outer one stops a test that would hang).
    error = await asyncio.wait_for(reason_of(summarizer), 30)
    assert error.reason == "timeout"


async def test_transport_error(mock: respx.MockRouter, client: UpstreamTransport) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    error = await reason_of(HttpSummarizer(summ(), upstreams(), client))
    assert error.reason == "error" and "ConnectError" in str(error)


async def test_reasoning_tokens_do_not_count_against_the_limit(
    mock: respx.MockRouter,
    client: UpstreamTransport,
) -> None:
    usage = {"completion_tokens": 900, "completion_tokens_details": {"reasoning_tokens": 850}}
    mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion("ok", usage=usage))
    summarizer = HttpSummarizer(summ(maxSummaryTokens=100), upstreams(), client)
    assert await summarizer.summarize(SummaryRequest(STRETCH, None, "o3")) == "ok"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("<summary>\n## Goal\nX\n</summary>", "## Goal\nX"),
        ("  ## Goal\nX  \n", "## Goal\nX"),
        ("## Goal\nuses <summary> tags\n", "## Goal\nuses <summary> tags"),
        ([{"type": "text", "text": "## Goal\n"}, {"type": "text", "text": "Y"}], "## Goal\nY"),
    ],
)
async def test_summary_text(
    content: Any, expected: str, mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion(content))
    summarizer = HttpSummarizer(summ(), upstreams(), client)
    assert await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o")) == expected


async def test_metrics_record_latency_and_outcome(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    mock.post(f"{OPENAI}/chat/completions").mock(side_effect=[completion(), httpx.Response(503)])
    records: list[SummaryCallRecord] = []
    summarizer = HttpSummarizer(summ(model="gpt-4o-mini"), upstreams(), client)
    summarizer.stats.listeners.append(records.append)
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    await reason_of(summarizer)
    assert [(r.upstream, r.model, r.outcome) for r in records] == [
        ("openai", "gpt-4o-mini", "ok"),
        ("openai", "gpt-4o-mini", "error"),
    ]
    assert all(r.seconds >= 0 for r in records)
    assert summarizer.stats.calls[("openai", "gpt-4o-mini", "ok")] == 1


# ------------------------------------------------------------------ guards on the wire


async def test_long_stretch_is_folded_in_chunks(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(
        side_effect=[completion(f"summary {n}") for n in range(1, 20)]
    )
    stretch = tuple({"role": "user", "content": f"turn {i} " + "talk " * 400} for i in range(30))
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=500),
        upstreams(),
        client,
        facts_for=lambda _model: ModelFacts(context_window=4000, max_output_tokens=4000),
    )
    result = await summarizer.summarize(SummaryRequest(stretch, None, "gpt-4o"))
    calls = len(route.calls)
    assert calls > 2 and result == f"summary {calls}"
    systems = [sent(route, n)[0]["messages"][0]["content"] for n in range(calls)]
    prompts = [s.partition("\n\nThe checkpoint must fit in ")[0] for s in systems]
    assert prompts == [CHECKPOINT_PROMPT] + [UPDATE_PROMPT] * (calls - 1)
    assert all("\n\nThe checkpoint must fit in " in s for s in systems)  # the limit, stated
    second_user = sent(route, 1)[0]["messages"][1]["content"]
    assert "<previous-checkpoint>\nsummary 1\n</previous-checkpoint>" in second_user
    for n in range(calls):
        assert len(route.calls[n].request.content) < 4000 * 4 * 1.2  # fits the small window


async def test_too_many_chunks_is_refused_before_any_call(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    stretch = tuple({"role": "user", "content": "talk " * 2000} for _ in range(40))
    summarizer = HttpSummarizer(
        summ(maxSummaryTokens=500),
        upstreams(),
        client,
        max_chunks=3,
        facts_for=lambda _model: ModelFacts(context_window=4000, max_output_tokens=4000),
    )
    with pytest.raises(SummaryError) as caught:
        await summarizer.summarize(SummaryRequest(stretch, None, "gpt-4o"))
    assert caught.value.reason == "oversized"
    assert "over the limit of 3" in str(caught.value)
    assert len(route.calls) == 0


async def test_images_and_base64_never_reach_the_summarizer(
    mock: respx.MockRouter,
    client: UpstreamTransport,
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    blob = base64.b64encode(os.urandom(300_000)).decode()
    stretch = (
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at this screenshot"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{blob}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t", "content": f"file bytes: {blob}"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "private"},
                {"type": "text", "text": "Done."},
            ],
        },
    )
    summarizer = HttpSummarizer(summ(), upstreams(), client)
    await summarizer.summarize(SummaryRequest(stretch, None, "gpt-4o"))
    assert len(route.calls) == 1
    request = route.calls[0].request
    assert len(request.content) < 10_000
    user = sent(route)[0]["messages"][1]["content"]
    assert "[image]" in user and "[binary data, " in user and "private" not in user


async def test_the_budget_bounds_the_summary_below_max_summary_tokens(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """The core's ``max_tokens`` (a share of the budget the summary must fit)
    lowers the output limit, and the model is told; a larger bound changes nothing."""
    route = mock.post(f"{OPENAI}/chat/completions").mock(return_value=completion())
    summarizer = HttpSummarizer(summ(maxSummaryTokens=4096), upstreams(), client)
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o", max_tokens=1_400))
    body, _ = sent(route)
    assert body["max_completion_tokens"] == 1_400
    assert body["messages"][0]["content"].startswith(CHECKPOINT_PROMPT)
    assert "must fit in 1400 tokens" in body["messages"][0]["content"]
    await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o", max_tokens=9_000))
    body, _ = sent(route)
    assert body["max_completion_tokens"] == 4096  # the larger bound changes nothing
    assert body["messages"][0]["content"] == CHECKPOINT_PROMPT + own_limit_note(4096)
    custom = HttpSummarizer(summ(maxSummaryTokens=4096, prompt="Summarize."), upstreams(), client)
    await custom.summarize(SummaryRequest(STRETCH, None, "gpt-4o", max_tokens=9_000))
    body, _ = sent(route)
    assert body["messages"][0]["content"] == "Summarize."  # a configured prompt, as written


async def test_a_summary_cut_at_its_own_limit_is_asked_once_more_told_the_limit(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """A small model writes on until cut at the summarizer's own limit, which a configured
    prompt does not state: the summary is asked for once more with the limit stated."""
    route = mock.post(f"{OPENAI}/chat/completions").mock(
        side_effect=[completion("## Goal\n" + "more " * 50, finish="length"), completion()]
    )
    summarizer = HttpSummarizer(summ(maxSummaryTokens=100, prompt="Sum up."), upstreams(), client)
    text = await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert text == "## Goal\nFix the bug." and len(route.calls) == 2
    first, _ = sent(route, 0)
    second, _ = sent(route, 1)
    assert first["messages"][0]["content"] == "Sum up."  # as configured: not told at first
    assert "must fit in 100 tokens (the last answer ran past" in second["messages"][0]["content"]


async def test_a_summary_told_its_limit_and_cut_is_not_asked_again(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    route = mock.post(f"{OPENAI}/chat/completions").mock(
        return_value=completion("x", finish="length")
    )
    summarizer = HttpSummarizer(summ(maxSummaryTokens=4096), upstreams(), client)
    with pytest.raises(SummaryError) as caught:  # the budget bound it: told from the start
        await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o", max_tokens=1_400))
    assert caught.value.reason == "oversized" and len(route.calls) == 1
    ours = HttpSummarizer(summ(maxSummaryTokens=100), upstreams(), client)
    with pytest.raises(SummaryError) as told:  # our prompt states the limit: not asked again
        await ours.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert told.value.reason == "oversized" and len(route.calls) == 2
    unbound = HttpSummarizer(summ(maxSummaryTokens=100, prompt="Sum up."), upstreams(), client)
    with pytest.raises(SummaryError) as again:  # told on the second call, cut again: given up
        await unbound.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    assert again.value.reason == "oversized" and "cut again when told the limit" in str(again.value)
    assert len(route.calls) == 4


async def test_a_summary_told_its_limit_and_cut_keeps_its_complete_lines(
    mock: respx.MockRouter, client: UpstreamTransport
) -> None:
    """A small model told the limit still writes on until cut: its complete lines are kept and
    marked, rather than the whole summary lost to a back-off (call outcome ``cut``)."""
    reply = "## Goal\nFix src/app.py.\n\n## Progress\n- ran pytest: 2 failed\n- edited the fi"
    route = mock.post(f"{OPENAI}/chat/completions").mock(
        return_value=completion(reply, finish="length")
    )
    summarizer = HttpSummarizer(summ(maxSummaryTokens=100), upstreams(), client)
    text = await summarizer.summarize(SummaryRequest(STRETCH, None, "gpt-4o"))
    expected = "## Goal\nFix src/app.py.\n\n## Progress\n- ran pytest: 2 failed\n\n"
    assert text == expected + CUT_MARK and len(route.calls) == 1
    assert summarizer.stats.count("cut") == 1 and summarizer.stats.count("ok") == 0


@pytest.mark.parametrize(
    ("reply", "kept"),
    [
        ("## Goal\nShip.\n## Next Steps\n- dep", "## Goal\nShip."),  # an empty heading goes
        ("## Goal\nShip.\n```\nmake te", "## Goal\nShip."),  # so does an open fence
        ("## Goal\nShip.\n```\nmake\n```\nand th", "## Goal\nShip.\n```\nmake\n```"),
        ("## Goal\nShip the rel", None),  # no complete line of content
        ("x", None),
    ],
)
def test_salvage_keeps_complete_lines_only(reply: str, kept: str | None) -> None:
    def count(text: str) -> int:
        return len(text.split())

    result = salvage(reply, 100, count)
    assert result == (None if kept is None else f"{kept}\n\n{CUT_MARK}")


def test_salvage_drops_the_lines_a_looping_model_said_again() -> None:
    """A small model that loops until the cut (measured: every summary of the 6k quality run)
    keeps one copy of each line, not 700 tokens of the same few."""
    loop = "- The user is using the `logging` module.\n- Ran the tests again.\n"
    reply = "## Goal\nFix the build.\n\n## Progress\n" + loop * 40 + "- The user is us"
    result = salvage(reply, 1_000, lambda text: len(text.split()))
    assert result == ("## Goal\nFix the build.\n\n## Progress\n" + loop + "\n" + CUT_MARK)


def test_without_repeats_keeps_code_short_lines_and_blank_lines() -> None:
    lines = [
        "## Progress",
        "- edited src/app.py",
        "",
        "```",
        "    return value",
        "    return value",  # inside code: kept
        "```",
        "- ok",
        "- ok",  # too short to count as a repeat: kept
        "",
        "- edited src/app.py",  # said again: the one line dropped
        "```",
        "    return value",
        "```",
    ]
    assert without_repeats(lines) == [*lines[:10], *lines[11:]]


def test_salvage_fits_the_mark_within_the_limit() -> None:
    lines = "\n".join(f"- line {i}" for i in range(20)) + "\n- unfini"
    result = salvage(lines, 40, lambda text: len(text.split()))
    assert result is not None and result.endswith(CUT_MARK)
    assert len(result.split()) <= 40 and "- line 0" in result and "- line 19" not in result
