"""The Responses API through the proxy, over real processes and the official SDK.

One fake Responses upstream (tests/support/responses_upstream.py: it enforces the window,
call/output pairing and reasoning attachment the way OpenAI's servers do) and one proxy for the
module. ``client.responses.create(...)`` goes through the proxy as JSON and as typed SSE
events; a long stateless agent session (``store: false``, the whole input re-sent every step,
one task and many tool steps with reasoning items and parallel calls) must stay under the
window with every request accepted, summaries sticky as for chat completions; requests that
continue server-side state pass through untouched; an overflow refusal is compacted away.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.responses import Response

from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from compaction_proxy.wire.responses import lift
from compaction_proxy.wire.responses._items import CALL_KEYS, OUTPUT_KEYS
from tests.fakes.upstream import SUMMARIZER_PREFIX_MARKER
from tests.support.agent_session import is_summarizer_text, tool_output
from tests.support.responses_upstream import RESPONSES, ResponsesUpstreamServer
from tests.support.sdk_chat import post_raw
from tests.support.servers import ProxyServer, Recorded, proxy_config, upstream_entry

WINDOW = 32_000
MODEL = "agent-32k"
LIAR = "liar-64k"  # the proxy is told 64k; the upstream enforces 12k
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file from the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "type": "function",
        "name": "grep",
        "description": "Search the repository",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    },
]
TASK = {
    "role": "user",
    "content": "call tool after tool (keep calling tools) until the parser tests pass. FACT-TASK.",
}
STEPS = 90


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponsesUpstreamServer]:
    server = ResponsesUpstreamServer(tmp_path_factory.mktemp("responses") / "upstream.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(fake: ResponsesUpstreamServer) -> Iterator[ResponsesUpstreamServer]:
    fake.reset()
    fake.control(model_context_windows={MODEL: WINDOW, LIAR: 12_000})
    yield fake
    fake.reset()


@pytest.fixture(scope="module")
def proxy(
    fake: ResponsesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ProxyServer:
    db = tmp_path_factory.mktemp("responses-store") / "checkpoints.db"
    config = proxy_config(
        upstream_entry(fake),
        models={
            MODEL: {"context_window": WINDOW, "max_output_tokens": 2_000},
            LIAR: {"context_window": 64_000, "max_output_tokens": 2_000},
        },
        store={"backend": "sqlite", "path": str(db)},
        summarization={
            "enabled": True,
            "maxSummaryTokens": 1_000,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
    )
    return module_proxy_factory(config)


@pytest.fixture
def client(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    sdk = proxy.openai_client()
    yield sdk
    sdk.close()


def forwarded(upstream: ResponsesUpstreamServer) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests(RESPONSES)]


def assert_valid_input(items: list[dict[str, Any]]) -> None:
    """Every call with its output and every output with its call (what OpenAI requires)."""
    calls: list[str] = []
    outputs: list[str] = []
    for item in items:
        kind = item.get("type")
        if kind in CALL_KEYS:
            calls.append(item[CALL_KEYS[kind]])
        elif kind in OUTPUT_KEYS:
            key = next(item[f] for f in OUTPUT_KEYS[kind] if isinstance(item.get(f), str))
            assert key in calls, f"output {key} lost its call"
            outputs.append(key)
    assert sorted(calls) == sorted(outputs), "a call lost its output"


def assert_transcript_form(recorded: Recorded) -> None:
    """A summary call in the plain-text transcript form: a system prompt and the conversation
    as text, not the request's own (chat-shaped) messages with the instruction after them."""
    assert is_summarizer_text(recorded.text)
    assert SUMMARIZER_PREFIX_MARKER not in recorded.text
    payload = recorded.json()
    assert [m["role"] for m in payload["messages"]] == ["system", "user"]
    assert all(isinstance(m["content"], str) for m in payload["messages"])
    assert "<conversation>" in payload["messages"][1]["content"]
    assert "tools" not in payload


# ------------------------------------------------------------------ the SDK, JSON and stream


def test_the_sdk_creates_a_response_through_the_proxy(
    client: openai.OpenAI, upstream: ResponsesUpstreamServer
) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions="Be brief.", input="Say hello", store=False
    )
    response = raw.parse()
    assert response.output_text == "echo: Say hello"
    assert response.usage is not None and response.usage.input_tokens > 0
    assert raw.headers["x-compaction-strategies"] == "none"
    assert int(raw.headers["x-compaction-tokens-before"]) > 0
    sent = upstream.last_request(RESPONSES).json()
    assert sent["input"] == "Say hello" and sent["instructions"] == "Be brief."


def test_an_unchanged_request_goes_upstream_byte_for_byte(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    body = b'{ "model" : "agent-32k",\n  "input": [ {"role": "user", "content": "hi \\u00e9"} ] }'
    with proxy.http_client() as http:
        response = http.post(RESPONSES, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-checkpoint"] == "none"
    assert upstream.last_request(RESPONSES).body == body


def test_a_stream_is_relayed_event_by_event(
    client: openai.OpenAI, upstream: ResponsesUpstreamServer, proxy: ProxyServer
) -> None:
    items = [{"role": "user", "content": "please call tool read_file"}]
    events = list(client.responses.create(model=MODEL, input=items, tools=TOOLS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    calls = [item for item in final.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["read_file", "grep"]  # parallel calls
    # the same conversation continued, as a stream again: the proxy read usage.input_tokens
    # from the last event (calibration), and relayed every event
    items += [item.model_dump(exclude_none=True) for item in final.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls]
    with client.responses.with_streaming_response.create(
        model=MODEL, input=items, tools=TOOLS, stream=True
    ) as raw:
        body = raw.read()
        assert raw.headers["content-type"].startswith("text/event-stream")
        assert "x-compaction-tokens-before" in raw.headers
    assert body.count(b"\nevent: ") + body.startswith(b"event: ") == body.count(b"data: ")
    assert b'"type":"response.completed"' in body and b"echo tool results: ok | ok" in body
    assert_valid_input(upstream.last_request(RESPONSES).json()["input"])
    with proxy.http_client() as http:
        metrics = http.get("/metrics").text
    assert f'compaction_proxy_token_count_calibration_ratio_count{{model="{MODEL}"}}' in metrics


def test_previous_response_id_requests_pass_through_untouched(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    body = orjson.dumps(
        {
            "model": MODEL,
            "previous_response_id": "resp_earlier",
            "input": [{"role": "user", "content": "word " * 3_000}],  # needs compaction alone
            "truncation": "auto",
        }
    )
    with proxy.http_client() as http:
        response = http.post(
            RESPONSES,
            content=body,
            headers={"content-type": "application/json", "x-compaction": "force"},
        )
    assert response.status_code == 200, response.text
    assert "previous_response_id" in response.headers["x-compaction-skipped"]
    assert "cannot see" in response.headers["x-compaction-skipped"]
    assert "x-compaction-tokens-before" not in response.headers
    assert upstream.last_request(RESPONSES).body == body


def test_a_bad_input_gets_an_openai_shaped_error(proxy: ProxyServer) -> None:
    body = {"model": MODEL, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}
    with proxy.http_client() as http:
        response = http.post(RESPONSES, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input[0].call_id" and error["code"] == "invalid_input"


# ------------------------------------------------------------------ a long stateless session


class Session:
    """A stateless agent: one task, then the model's calls and the tool outputs, re-sent
    whole every step, as Codex CLI and the Agents SDK do with ``store: false``."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [TASK]
        self.sent: list[list[dict[str, Any]]] = []  # what the upstream got, per step
        self.headers: list[httpx.Headers] = []
        self.usage: list[int] = []
        self.summarizer_calls = 0
        self.summary_requests: list[Recorded] = []  # the summarizer's chat-completions bodies
        self.facts = ["FACT-TASK"]
        self.lengths: list[int] = []  # how many items the client sent, per step

    def step(self, client: openai.OpenAI, upstream: ResponsesUpstreamServer, n: int) -> None:
        self.lengths.append(len(self.items))
        raw = post_raw(
            client, "/responses", Response, model=MODEL, input=self.items, tools=TOOLS, store=False
        )
        response = raw.parse()
        assert response.usage is not None
        self.usage.append(response.usage.input_tokens)
        self.headers.append(raw.headers)
        recorded = upstream.requests()
        upstream.clear()
        self.summarizer_calls += sum(1 for r in recorded if r.path.endswith("/chat/completions"))
        self.summary_requests += [r for r in recorded if r.path.endswith("/chat/completions")]
        [sent] = [r.json()["input"] for r in recorded if r.path == RESPONSES]
        self.sent.append(sent)
        self.items += [item.model_dump(exclude_none=True) for item in response.output]
        for index, call in enumerate(i for i in response.output if i.type == "function_call"):
            text = tool_output(n, index, 3_000 if n % 2 == 0 and index == 0 else 120)
            if n % 10 == 5 and index == 0:
                self.facts.append(f"FACT-R{n}")
                text = f"Found FACT-R{n} in the config.\n{text}"
            self.items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": text}
            )


@pytest.fixture(scope="module")
def session(proxy: ProxyServer, fake: ResponsesUpstreamServer) -> Session:
    fake.reset()
    fake.control(model_context_windows={MODEL: WINDOW})
    sdk = proxy.openai_client()
    run = Session()
    try:
        for n in range(STEPS):
            run.step(sdk, fake, n)
    finally:
        sdk.close()
        fake.reset()
    return run


def test_every_step_of_a_long_session_is_accepted_under_the_window(session: Session) -> None:
    assert len(session.usage) == STEPS  # the SDK raises on any refusal
    assert all(0 < tokens <= WINDOW for tokens in session.usage)
    tokenizer = TokenizerProvider(EncodingLoader()).get("o200k_base")
    whole = lift({"model": MODEL, "input": session.items, "tools": TOOLS}).messages
    assert tokenizer.count_messages(whole) > 1.4 * WINDOW  # far past the window uncompacted
    assert any(h["x-compaction-checkpoint"] == "new" for h in session.headers)


def test_the_task_the_pairing_and_the_newest_step_survive(session: Session) -> None:
    for n, sent in enumerate(session.sent):
        assert sent[0] == TASK, n
        assert_valid_input(sent)
        if n > 0:  # the newest step: the model's reasoning and calls, and the outputs
            newest = session.items[session.lengths[n - 1] : session.lengths[n]]
            assert sent[-len(newest) :] == newest, n
        reasoning = [i for i, item in enumerate(sent) if item.get("type") == "reasoning"]
        for i in reasoning:  # the fake refuses reasoning cut from its item; checked here too
            assert sent[i + 1]["type"] == "function_call", n


def test_compaction_is_sticky_between_events(session: Session) -> None:
    events = [n for n, h in enumerate(session.headers) if h["x-compaction-checkpoint"] == "new"]
    assert 0 < len(events) <= STEPS // 10
    stable = 0
    for n, (before, after) in enumerate(itertools.pairwise(session.sent), start=1):
        if n in events:
            continue  # a compaction event: the prefix may change here, once
        assert after[: len(before)] == before, n
        stable += 1
    assert stable / (STEPS - 1) >= 0.9
    # a summary call per compaction, not per request (background preparation included)
    assert 0 < session.summarizer_calls <= 2 * len(events)


def test_the_summary_is_a_message_item_that_keeps_the_facts(session: Session) -> None:
    last = session.sent[-1]
    summaries = [
        i
        for i, item in enumerate(last)
        if item.get("type") == "message" and str(item.get("content")).startswith("<summary>")
    ]
    assert summaries == [1]  # "progress so far", right after the task
    text = json.dumps(last)
    missing = [fact for fact in session.facts if fact not in text]
    assert not missing, missing


def test_summary_calls_send_the_transcript_not_the_chat_shaped_view(session: Session) -> None:
    """The adapter's view (``input_text`` parts, custom tool calls, items riding in extra
    fields) is no chat-completions request a strict server accepts, so a Responses request's
    summary is asked for in the transcript form even though the summarizer is the request's own
    upstream and model (where a chat request's summary reuses its prefix)."""
    assert session.summary_requests
    for recorded in session.summary_requests:
        assert_transcript_form(recorded)


def test_the_long_session_streams_compacted(
    session: Session, client: openai.OpenAI, upstream: ResponsesUpstreamServer
) -> None:
    with client.responses.with_streaming_response.create(
        model=MODEL, input=session.items, tools=TOOLS, store=False, stream=True
    ) as raw:
        events = [event.type for event in raw.parse()]
        before = int(raw.headers["x-compaction-tokens-before"])
        after = int(raw.headers["x-compaction-tokens-after"])
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert after < WINDOW < before
    sent = upstream.last_request(RESPONSES).json()
    assert sent["stream"] is True and sent["input"][0] == TASK
    assert_valid_input(sent["input"])


# ------------------------------------------------------------------ overflow, preview, labels


def test_an_overflow_refusal_is_compacted_away_and_retried(
    client: openai.OpenAI, upstream: ResponsesUpstreamServer
) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": "look at every module"}]
    for n in range(24):
        call_id = f"call_{n}"
        items.append(
            {"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"}
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": tool_output(n, 0, 2_400)}
        )
    raw = client.responses.with_raw_response.create(model=LIAR, input=items, tools=TOOLS)
    assert raw.parse().usage.input_tokens <= 12_000  # type: ignore[union-attr]
    assert raw.headers["x-compaction-retry"] == "1"
    refused, accepted = upstream.requests(RESPONSES)
    assert len(accepted.body) < len(refused.body)
    assert_valid_input(accepted.json()["input"])


def test_the_preview_takes_a_responses_body(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    items: list[dict[str, Any]] = [TASK]
    for n in range(6):
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"match {n} " * 50},
        ]
    body = {"model": MODEL, "input": items, "store": False}
    with proxy.http_client() as http:
        preview = http.post("/v1/compaction/preview", json=body, headers={"x-compaction": "force"})
    assert preview.status_code == 200, preview.text
    payload = preview.json()
    assert payload["changed"] is True and payload["request"]["store"] is False
    compacted = payload["request"]["input"]
    assert compacted[0] == TASK and len(compacted) < len(items)
    assert_valid_input(compacted)
    assert upstream.requests(RESPONSES) == []  # nothing forwarded


def test_the_preview_summarizes_a_responses_body_in_transcript_form(
    proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    """The preview shows what the route would forward, so it asks for the summary the way the
    route does: in transcript form, not with the chat-shaped view as a prefix. (The model's
    own messages between the steps are what a prefix would be placed on: the tool results are
    collapsed before summarization folds them.)"""
    items: list[dict[str, Any]] = [TASK]
    for n in range(16):
        output = tool_output(n, 0, 3_000)
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": output},
            {"role": "assistant", "content": f"Step {n} done; searching on."},
        ]
    body = {"model": MODEL, "input": items, "tools": TOOLS, "store": False}
    with proxy.http_client() as http:
        preview = http.post("/v1/compaction/preview", json=body, headers={"x-compaction": "force"})
    assert preview.status_code == 200, preview.text
    assert "summarization" in preview.headers["x-compaction-strategies"].split(",")
    calls = upstream.requests("/v1/chat/completions")
    assert calls
    for recorded in calls:
        assert_transcript_form(recorded)


def test_metrics_and_dashboard_label_the_api(
    client: openai.OpenAI, proxy: ProxyServer, upstream: ResponsesUpstreamServer
) -> None:
    client.responses.create(model=MODEL, input="label me")
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with proxy.http_client() as http:
        metrics = http.get("/metrics").text
        rows = http.get("/dashboard/data").json()["recent"]
    assert 'compaction_proxy_requests_total{route="responses",status="200"}' in metrics
    for api in ("responses", "chat"):
        assert f'compaction_proxy_api_prompt_tokens_total{{api="{api}",stage="before"}}' in metrics
    apis = {row.get("api") for row in rows[:2]}
    assert apis == {"responses", "chat"}, rows[:2]
