"""The upstream and header side of ``/v1/messages``, in-process: usage read from a stream's
first event, windows (discovered, the 1M-context option and what a refusal teaches about it),
the caller's key wherever the format takes one, an operator key sent the format's way.

The format is the registry's ``/v1/messages`` entry when there is one; until the Messages
format is registered, a stand-in defined here (string contents only) carries the members the
generic code asks: ``auth`` (``x-api-key``, then ``Authorization``), ``usage_tokens`` and
``usage_at_start`` (Anthropic's usage), ``window_option`` (the 1M-context beta). With the real
format these tests hold its members to the same contract. respx plays the upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.api import RequestContext
from compaction_proxy.api._requests import effective_window
from compaction_proxy.app import ProxyApp
from compaction_proxy.config import Settings
from compaction_proxy.http import bad_request
from compaction_proxy.upstream import Window
from compaction_proxy.wire import (
    DEFAULT_FORMAT,
    Headers,
    Lowered,
    RefusalText,
    SummaryCall,
    UpstreamAuth,
    WindowOption,
    WireFormat,
    format_for_path,
    parse_json_object,
)
from compaction_proxy.wire.messages._sizes import (
    CONTEXT_1M_BETA,
    anthropic_usage_tokens,
    anthropic_window_option,
)
from compaction_proxy.wire.registry import register, unregister
from tests.fakes.messages import errors, render
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

LOCAL = "http://local.test/v1"
MESSAGES = "/v1/messages"
CALLER = "sk-ant-caller-7c1e"
OPERATOR = "sk-ant-operator-93ab"
CLAUDE_CODE_BETAS = (
    "claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14,"
    "context-management-2025-06-27,prompt-caching-scope-2026-01-05,effort-2025-11-24,"
    "fine-grained-tool-streaming-2025-05-14"
)


# ------------------------------------------------------------------ the stand-in format


def _parse(raw: bytes) -> dict[str, Any]:
    data = parse_json_object(raw)
    if not isinstance(data.get("model"), str) or not isinstance(data.get("messages"), list):
        raise bad_request("'model' and 'messages' are required", code="invalid_request")
    return data


@dataclass(frozen=True)
class _View:
    chat: dict[str, Any]

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        kept = [{"role": m["role"], "content": m["content"]} for m in messages]
        return Lowered([m for m in kept if m["role"] != "system"])


class StandInMessages:
    name = "messages_standin"
    api = "messages"
    paths = (MESSAGES,)
    items = "messages"
    auth = UpstreamAuth("x-api-key", "")
    summary: SummaryCall | None = None
    prefix_summaries = False
    refusals: tuple[RefusalText, ...] = ()
    parse = staticmethod(_parse)
    usage_at_start = True

    def claims(self, body: Mapping[str, Any]) -> bool:
        return False  # the preview's and compact's bodies stay chat's

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return None

    def has_items(self, body: Mapping[str, Any]) -> bool:
        return bool(body.get("messages"))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        return None

    def lift(self, body: dict[str, Any], *, check: bool = True) -> _View:
        system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
        chat = {"model": body["model"], "messages": [*system, *body["messages"]]}
        if isinstance(body.get("max_tokens"), int):
            chat["max_completion_tokens"] = body["max_tokens"]
        return _View(chat)

    def usage_tokens(self, payload: Any) -> int | None:
        return anthropic_usage_tokens(payload)

    def window_option(self, model: str, headers: Headers) -> WindowOption | None:
        return anthropic_window_option(model, headers)

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": type, "message": message}})


@pytest.fixture(scope="module")
def messages_format() -> Iterator[WireFormat]:
    served = format_for_path("POST", MESSAGES)
    if served is not None:
        yield served
        return
    stand_in = StandInMessages()
    register(stand_in)
    try:
        yield stand_in
    finally:
        unregister(stand_in)


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


# ------------------------------------------------------------------ the harness


@dataclass
class Edge:
    app: ProxyApp
    mock: respx.MockRouter
    client: httpx.AsyncClient

    async def messages(
        self, body: dict[str, Any], *, query: str = "", **headers: str
    ) -> httpx.Response:
        return await self.client.post(
            MESSAGES + query,
            content=orjson.dumps(body),
            headers={"content-type": "application/json", **headers},
        )


@pytest.fixture
async def edge_for(messages_format: WireFormat) -> AsyncIterator[Any]:
    built: list[Edge] = []

    def build(**config: Any) -> Edge:
        upstream = {"name": "local", "base_url": LOCAL, **config.pop("upstream", {})}
        settings = Settings(upstreams=[upstream], store={"backend": "memory"}, **config)
        mock = respx.MockRouter(assert_all_called=False, assert_all_mocked=True)
        app = in_process(settings, httpx.AsyncClient(transport=_RespxTransport(mock)))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
        edge = Edge(app, mock, client)
        built.append(edge)
        return edge

    yield build
    for edge in built:
        await edge.client.aclose()
        await edge.app.state.transport.aclose()
        edge.app.state.compactor.close()


def conversation(turns: int, words: int = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"step {i}: " + "look at this " * words})
        messages.append({"role": "assistant", "content": f"done {i}"})
    messages.append({"role": "user", "content": "and now the newest step"})
    return messages


def body(model: str, turns: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 256, "messages": conversation(turns), **extra}


def reply_json(usage: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": "ok"}]
    return render.message("msg_1", "m", content, "end_turn", usage, None)


async def reply_stream(usage: dict[str, Any], *, delta: dict[str, Any]) -> bytes:
    """The fake upstream's stream, its message_delta stating ``delta`` (llama.cpp states only
    the output there), its text long enough that message_start is far from its end."""
    opening = render.message("msg_1", "m", [], None, usage, None)
    content = [{"type": "text", "text": "word " * 4_000}]
    out = []
    async for event in render.events(opening, content, "end_turn", usage):
        if event.startswith(b"event: message_delta\n"):
            data = orjson.loads(event.split(b"data: ", 1)[1])
            event = render.sse("message_delta", {**data, "usage": delta})
        out.append(event)
    return b"".join(out)


def anthropic_refusal(window: int, prompt: int) -> httpx.Response:
    """The fake upstream's own refusal (tests/fakes/messages/errors.py), as respx answers."""
    refusal = errors.overflow("anthropic", window, prompt, 256, False)
    assert refusal is not None
    return httpx.Response(
        refusal.status_code, content=refusal.body, headers={"content-type": "application/json"}
    )


NO_SUMMARIES: dict[str, Any] = {"summarization": {"enabled": False}}


# ------------------------------------------------------------------ windows


LISTINGS = {
    "vllm": {"object": "list", "data": [{"id": "local-coder", "max_model_len": 2048}]},
    "llama.cpp": {
        "models": [{"name": "local-coder", "model": "local-coder"}],
        "data": [{"id": "local-coder", "object": "model", "meta": {"n_ctx_train": 2048}}],
    },
    "lmstudio": {"data": [{"id": "local-coder", "loaded_context_length": 2048}]},
    "anthropic": {"data": [{"type": "model", "id": "local-coder", "max_input_tokens": 2048}]},
}


@pytest.mark.parametrize("server", sorted(LISTINGS))
async def test_a_request_on_v1_messages_is_budgeted_for_the_window_its_server_lists(
    edge_for: Any, server: str
) -> None:
    edge = edge_for(**NO_SUMMARIES)
    listing = edge.mock.get(f"{LOCAL}/models").respond(200, json=LISTINGS[server])
    forward = edge.mock.post(f"{LOCAL}/messages").respond(200, json=reply_json({"input_tokens": 9}))
    sent = body("local-coder", turns=30)
    reply = await edge.messages(sent, **{"x-api-key": CALLER})
    assert reply.status_code == 200, reply.text
    # Without the listing the model's window is the 128k default guess, and nothing is cut.
    before = int(reply.headers["x-compaction-tokens-before"])
    after = int(reply.headers["x-compaction-tokens-after"])
    assert before > 2048 > after
    assert len(orjson.loads(forward.calls.last.request.content)["messages"]) < len(sent["messages"])
    # The listing was read once, with the caller's key as it came.
    assert listing.call_count == 1
    asked = listing.calls.last.request.headers
    assert asked["x-api-key"] == CALLER and "authorization" not in asked
    # Anthropic's API refuses a request without its version header: the listing carries it.
    assert asked["anthropic-version"] == "2023-06-01"


async def _window(edge: Edge, wire: WireFormat, model: str, *headers: tuple[str, str]) -> Window:
    scope = {"headers": [(k.encode(), v.encode()) for k, v in headers]}
    ctx = RequestContext(edge.app.state, "t", scope, _no_receive, _no_send)
    upstream = edge.app.state.settings.upstreams[0]
    return await effective_window(ctx, upstream, model, wire)


async def _no_receive() -> dict[str, Any]:
    raise AssertionError("nothing is read")


async def _no_send(message: dict[str, Any]) -> None:
    raise AssertionError("nothing is sent")


BETA_1M = ("anthropic-beta", f"{CLAUDE_CODE_BETAS},{CONTEXT_1M_BETA}")
OPTION = CONTEXT_1M_BETA


@pytest.mark.parametrize(
    ("model", "headers", "expected"),
    [
        ("claude-sonnet-4-5", (), Window(200_000, "builtin")),
        ("claude-sonnet-4-5", (BETA_1M,), Window(1_000_000, "builtin", OPTION)),
        ("claude-sonnet-4-20250514", (BETA_1M,), Window(1_000_000, "builtin", OPTION)),
        # Repeated headers are one list, as HTTP says.
        (
            "claude-sonnet-4-5",
            (("anthropic-beta", CLAUDE_CODE_BETAS), ("anthropic-beta", CONTEXT_1M_BETA)),
            Window(1_000_000, "builtin", OPTION),
        ),
        # A model the beta is not for keeps its window; so does every other header.
        ("claude-opus-4-5", (BETA_1M,), Window(200_000, "builtin")),
        ("claude-haiku-4-5", (BETA_1M,), Window(200_000, "builtin")),
        ("claude-sonnet-4-5", (("anthropic-beta", CLAUDE_CODE_BETAS),), Window(200_000, "builtin")),
        ("claude-sonnet-4-5", (("x-context-1m", CONTEXT_1M_BETA),), Window(200_000, "builtin")),
        # Models with the 1M window have it either way.
        ("claude-opus-4-6", (), Window(1_000_000, "builtin")),
        ("claude-opus-4-6", (BETA_1M,), Window(1_000_000, "builtin", OPTION)),
    ],
)
async def test_the_window_depends_on_the_headers_only_by_the_1m_beta(
    edge_for: Any,
    messages_format: WireFormat,
    model: str,
    headers: tuple[tuple[str, str], ...],
    expected: Window,
) -> None:
    edge = edge_for(**NO_SUMMARIES, windows={"discover": False})
    assert await _window(edge, messages_format, model, *headers) == expected
    # OpenAI's formats: no header changes a window.
    plain = await _window(edge, messages_format, model)
    assert await _window(edge, DEFAULT_FORMAT, model, *headers) == plain
    assert plain.option == ""


async def test_a_declared_or_a_listed_window_wins_over_the_1m_option(
    edge_for: Any, messages_format: WireFormat
) -> None:
    model = "claude-sonnet-4-5"
    declared = edge_for(**NO_SUMMARIES, models={model: {"context_window": 64_000}})
    assert await _window(declared, messages_format, model, BETA_1M) == Window(64_000, "config")
    listed = edge_for(**NO_SUMMARIES)
    listing = {
        "data": [{"id": model, "max_model_len": 65_536}, {"id": "other", "max_model_len": 8_192}]
    }
    listed.mock.get(f"{LOCAL}/models").respond(200, json=listing)
    # A model nothing else knows waits for the listing; after it the server's word wins.
    assert await _window(listed, messages_format, "other") == Window(8_192, "discovered")
    assert await _window(listed, messages_format, model, BETA_1M) == Window(
        65_536, "discovered", OPTION
    )


async def test_a_refusal_under_the_1m_option_is_learned_apart_from_the_models_window(
    edge_for: Any, messages_format: WireFormat
) -> None:
    model = "claude-sonnet-4-5"
    edge = edge_for(**NO_SUMMARIES, windows={"discover": False})
    edge.mock.post(f"{LOCAL}/messages").mock(return_value=anthropic_refusal(200_000, 250_000))
    reply = await edge.messages(body(model, turns=2), **dict([BETA_1M]), **{"x-api-key": CALLER})
    # Nothing smaller to send (the request is small): the refusal reaches the client as sent.
    assert reply.status_code == 400
    assert "prompt is too long: 250000 tokens > 200000 maximum" in reply.text
    windows = edge.app.state.windows
    assert await windows.learned("local", model, OPTION) == 200_000
    assert await windows.learned("local", model) is None
    # The next request that opts in is budgeted for what was learned; one that does not, for
    # the model's own window.
    assert await _window(edge, messages_format, model, BETA_1M) == Window(
        200_000, "learned", OPTION
    )
    assert await _window(edge, messages_format, model) == Window(200_000, "builtin")


# ------------------------------------------------------------------ usage


def _calibrated(edge: Edge, model: str) -> float:
    return float(edge.app.state.compactor.calibration_for(model).ratio)


async def test_a_stream_calibrates_from_message_start_when_its_end_states_only_the_output(
    edge_for: Any,
) -> None:
    model = "local-coder"
    edge = edge_for(**NO_SUMMARIES, models={model: {"context_window": 100_000}})
    usage = {
        "input_tokens": 40,
        "cache_creation_input_tokens": 1_000,
        "cache_read_input_tokens": 3_000,
        "output_tokens": 1,
    }
    stream = await reply_stream(usage, delta={"output_tokens": 4_000})  # llama.cpp's end
    edge.mock.post(f"{LOCAL}/messages").respond(
        200, content=stream, headers={"content-type": "text/event-stream"}
    )
    reply = await edge.messages(body(model, turns=12, stream=True), **{"x-api-key": CALLER})
    assert reply.status_code == 200
    assert reply.content == stream  # relayed byte for byte
    counted = int(reply.headers["x-compaction-tokens-after"])
    assert counted >= 1_000  # the calibration reads requests of this size
    assert _calibrated(edge, model) == pytest.approx(4_040 / counted)


async def test_a_json_reply_calibrates_with_the_cached_prefix(edge_for: Any) -> None:
    model = "local-coder"
    edge = edge_for(**NO_SUMMARIES, models={model: {"context_window": 100_000}})
    usage = {"input_tokens": 7, "cache_read_input_tokens": 2_500, "output_tokens": 3}
    edge.mock.post(f"{LOCAL}/messages").respond(200, json=reply_json(usage))
    reply = await edge.messages(body(model, turns=12), **{"x-api-key": CALLER})
    counted = int(reply.headers["x-compaction-tokens-after"])
    assert _calibrated(edge, model) == pytest.approx(2_507 / counted)


# ------------------------------------------------------------------ keys and headers


async def test_an_operator_key_replaces_both_caller_key_headers_and_the_rest_passes(
    edge_for: Any,
) -> None:
    edge = edge_for(**NO_SUMMARIES, upstream={"api_key": OPERATOR})
    forward = edge.mock.post(f"{LOCAL}/messages").respond(200, json=reply_json({}))
    reply = await edge.messages(
        body("claude-sonnet-4-5", turns=1),
        query="?beta=true",
        **{
            "x-api-key": CALLER,
            "authorization": "Bearer sk-other-1",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": CLAUDE_CODE_BETAS,
        },
    )
    assert reply.status_code == 200
    sent = forward.calls.last.request
    assert sent.url.query == b"beta=true"
    assert sent.headers.get_list("x-api-key") == [OPERATOR]
    assert "authorization" not in sent.headers
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["anthropic-beta"] == CLAUDE_CODE_BETAS


async def test_without_an_operator_key_the_callers_key_goes_as_it_came(edge_for: Any) -> None:
    edge = edge_for(**NO_SUMMARIES)
    forward = edge.mock.post(f"{LOCAL}/messages").respond(200, json=reply_json({}))
    await edge.messages(body("claude-sonnet-4-5", turns=1), **{"x-api-key": CALLER})
    sent = forward.calls.last.request
    assert sent.headers["x-api-key"] == CALLER and "authorization" not in sent.headers


@pytest.mark.parametrize(
    "sent_as",
    [{"x-api-key": CALLER}, {"authorization": f"Bearer {CALLER}"}],
    ids=["x-api-key", "bearer"],
)
async def test_a_key_the_upstream_accepted_is_known_whichever_header_it_came_in(
    edge_for: Any, sent_as: dict[str, str]
) -> None:
    """Admission (compaction_proxy/http/_admission.py): Claude Code sends x-api-key, the Python
    SDK 2.x Bearer; an upstream that checks keys accepting either lets the caller spend."""
    edge = edge_for(**NO_SUMMARIES)
    edge.mock.post(f"{LOCAL}/messages").respond(200, json=reply_json({}))
    known = edge.app.state.known_callers
    assert not known.known(CALLER)
    reply = await edge.messages(body("claude-sonnet-4-5", turns=1), **sent_as)
    assert reply.status_code == 200
    assert known.known(CALLER)
    assert len(known) == 1


async def test_a_refused_key_is_not_known(edge_for: Any) -> None:
    edge = edge_for(**NO_SUMMARIES)
    forward = edge.mock.post(f"{LOCAL}/messages").respond(
        401, json={"type": "error", "error": {"type": "authentication_error", "message": "no"}}
    )
    reply = await edge.messages(body("claude-sonnet-4-5", turns=1), **{"x-api-key": CALLER})
    # the upstream did see the key and refuse it (not the proxy before it) ...
    assert forward.calls.last.request.headers["x-api-key"] == CALLER
    assert reply.status_code == 401
    assert not edge.app.state.known_callers.known(CALLER)  # ... so it is not admitted


CHAT_SUMMARY = {
    "id": "s1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a summary"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3},
}


@pytest.mark.parametrize(
    ("sent_as", "chat_form", "messages_form"),
    [
        ({"x-api-key": CALLER}, ("authorization", f"Bearer {CALLER}"), ("x-api-key", CALLER)),
        (
            {"authorization": f"Bearer {CALLER}"},
            ("authorization", f"Bearer {CALLER}"),
            ("authorization", f"Bearer {CALLER}"),
        ),
    ],
    ids=["x-api-key", "bearer"],
)
async def test_the_summarizer_sends_the_callers_own_key_in_its_calls_form(
    edge_for: Any,
    sent_as: dict[str, str],
    chat_form: tuple[str, str],
    messages_form: tuple[str, str],
) -> None:
    """A summary on the request's own upstream with the caller's key: Bearer on a
    chat-completions call, as it came on a Messages one (an OAuth token stays in
    Authorization)."""
    model = "local-coder"
    edge = edge_for(models={model: {"context_window": 4_000, "max_output_tokens": 500}})
    chat = edge.mock.post(f"{LOCAL}/chat/completions").respond(200, json=CHAT_SUMMARY)
    text = [{"type": "text", "text": "a summary"}]
    messages = edge.mock.post(f"{LOCAL}/messages").respond(
        200, json=render.message("msg_1", model, text, "end_turn", {"input_tokens": 9}, None)
    )
    reply = await edge.messages(body(model, turns=30), **sent_as)
    assert reply.status_code == 200, reply.text
    summaries = [(c.request, chat_form) for c in chat.calls]
    summaries += [(c.request, messages_form) for c in list(messages.calls)[:-1]]
    assert summaries, "the summarizer was called"
    for request, (name, value) in summaries:
        assert request.headers.get(name) == value
        other = "authorization" if name == "x-api-key" else "x-api-key"
        assert other not in request.headers


# ------------------------------------------------------------------ refusals


def fake_refusal(style: str, window: int, prompt: int, max_tokens: int) -> httpx.Response:
    refusal = errors.overflow(style, window, prompt, max_tokens, False)
    assert refusal is not None
    return httpx.Response(
        refusal.status_code, content=refusal.body, headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize(
    ("style", "learned"),
    [
        ("anthropic", 4_000),
        ("llamacpp", 4_000),
        ("vllm", 4_000),
        ("vllm_old", 4_000),
        ("413", None),
    ],
)
async def test_each_servers_refusal_is_compacted_away_and_its_window_learned(
    edge_for: Any, style: str, learned: int | None
) -> None:
    model = "local-coder"
    edge = edge_for(**NO_SUMMARIES, windows={"discover": False})
    sent = body(model, turns=30)
    forward = edge.mock.post(f"{LOCAL}/messages")
    forward.side_effect = [
        fake_refusal(style, 4_000, 6_000, sent["max_tokens"]),
        httpx.Response(200, json=reply_json({})),
    ]
    reply = await edge.messages(sent, **{"x-api-key": CALLER})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-compaction-retry"] == "1"
    retried = orjson.loads(forward.calls[1].request.content)
    assert len(retried["messages"]) < len(sent["messages"])
    window = await edge.app.state.windows.learned("local", model)
    before = int(reply.headers["x-compaction-tokens-before"])
    if learned is None:  # a 413 states nothing: 0.8 of what was sent and reserved
        assert window == int(0.8 * (before + sent["max_tokens"]))
    else:
        assert window == learned
    assert int(reply.headers["x-compaction-tokens-after"]) < window


@pytest.mark.parametrize(("style", "calibrates"), [("anthropic", True), ("vllm", False)])
async def test_a_stated_prompt_count_calibrates_but_vllms_floor_does_not(
    edge_for: Any, style: str, calibrates: bool
) -> None:
    model = "local-coder"
    edge = edge_for(**NO_SUMMARIES, windows={"discover": False})
    sent = body(model, turns=30)
    forward = edge.mock.post(f"{LOCAL}/messages")
    forward.side_effect = [
        fake_refusal(style, 4_000, 6_000, sent["max_tokens"]),
        httpx.Response(200, json=reply_json({})),
    ]
    reply = await edge.messages(sent, **{"x-api-key": CALLER})
    before = int(reply.headers["x-compaction-tokens-before"])
    ratio = _calibrated(edge, model)
    assert ratio == (pytest.approx(6_000 / before) if calibrates else 1.0)


async def test_a_count_whose_compaction_fails_is_the_upstreams_count_of_the_clients_body(
    edge_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    edge = edge_for(**NO_SUMMARIES)
    counted = edge.mock.post(f"{LOCAL}/messages/count_tokens").respond(
        200, json={"input_tokens": 4321}
    )

    async def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(edge.app.state.flow, "run", explode)
    sent = body("local-coder", turns=30)
    raw = orjson.dumps(sent)
    reply = await edge.client.post(
        MESSAGES + "/count_tokens",
        content=raw,
        headers={"content-type": "application/json", "x-api-key": CALLER},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"input_tokens": 4321}
    assert counted.calls.last.request.content == raw
    assert "compaction failed" in reply.headers["x-compaction-warning"]
