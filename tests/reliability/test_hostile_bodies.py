"""Hostile bodies on the two routes that parse a chat request: the chat route and the preview.

Each case of tests/reliability/hostile.py goes, short and padded past a 4k window, first to
``POST /v1/compaction/preview`` and then to ``POST /v1/chat/completions`` of a real proxy in
front of the real fake upstream. JSON objects the openai SDK can express go through the SDK;
the rest (bad bytes, odd JSON, wrong content types) as raw bytes over httpx. For every case:

- no 5xx: the fake upstream answers these bodies without one, so a 5xx is the proxy's;
- every 4xx is OpenAI's error shape with a useful message, and a refusal the case expects comes
  from the proxy itself, naming the ``param`` (``messages[3].content[0]``, ``model``...);
- no traceback text in any body;
- what reached the upstream is the client's bytes unchanged, or a valid request: the same
  fields, system messages first and intact, the newest message untouched, every tool call with
  its result; the preview's answer obeys the same rules;
- the proxy is alive afterwards (``/healthz`` and a normal chat request).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.upstream import is_summarizer_call
from tests.reliability.hostile import (
    ANY,
    BODY,
    MODEL,
    WINDOW,
    Case,
    all_cases,
    expected_param,
    sdk_arguments,
)
from tests.support.assertions import CHAT_PATH
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

PREVIEW_PATH = "/v1/compaction/preview"
CASES = all_cases()
TRACEBACK_MARKERS = (b"Traceback", b'File "')


@pytest.fixture(scope="module")
def hostile_proxy(module_proxy_factory: Any, fake_upstream: UpstreamServer) -> ProxyServer:
    """A proxy whose test model has a 4k window, so the padded builds are compacted."""
    config = proxy_config(
        upstream_entry(fake_upstream),
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 256}},
    )
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy


@pytest.fixture(scope="module")
def sdk(hostile_proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    client = hostile_proxy.openai_client(timeout=120.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw_client(hostile_proxy: ProxyServer) -> Iterator[httpx.Client]:
    with hostile_proxy.http_client(timeout=120.0) as client:
        yield client


# --------------------------------------------------------------------------- sending


def send(
    sdk: openai.OpenAI, raw_client: httpx.Client, case: Case, path: str, body: bytes
) -> httpx.Response:
    """The reply to ``body`` on ``path``: through the SDK when it can say it, else raw."""
    if case.sdk:
        obj = json.loads(body)
        try:
            if path == CHAT_PATH:
                return sdk.chat.completions.with_raw_response.create(
                    **sdk_arguments(obj)
                ).http_response
            return sdk.post(PREVIEW_PATH.removeprefix("/v1"), cast_to=httpx.Response, body=obj)
        except openai.APIStatusError as error:
            return error.response
    return raw_client.post(path, content=body, headers={"Content-Type": case.content_type})


# --------------------------------------------------------------------------- checks


def check_reply(
    response: httpx.Response, case: Case, body: bytes, *, proxy_made: bool, where: str
) -> None:
    """The rules every reply obeys, and the refusal the case expects when it expects one."""
    content = response.content
    status = response.status_code
    assert status < 500, f"{where}: a 5xx for a client's body: {status} {content[:300]!r}"
    for marker in TRACEBACK_MARKERS:
        assert marker not in content, f"{where}: traceback text in the body: {content[:500]!r}"
    expected = expected_param(case, body)
    if expected is not ANY:
        assert status == 400, f"{where}: expected the proxy's 400, got {status} {content[:200]!r}"
        assert proxy_made, f"{where}: the body was forwarded instead of refused"
    if status < 400:
        return
    error = response.json().get("error")
    assert isinstance(error, dict), f"{where}: not OpenAI's error shape: {content[:300]!r}"
    assert {"message", "type", "param", "code"} <= set(error), error
    message = error["message"]
    assert isinstance(message, str) and len(message) >= 10, f"{where}: no useful message: {error}"
    assert isinstance(error["type"], str) and error["type"], error
    if not proxy_made or expected is ANY:
        return
    if expected == BODY:
        assert error["param"] is None, f"{where}: {error}"
        return
    assert isinstance(expected, str)
    param = error["param"]
    assert isinstance(param, str) and param.startswith(expected), (
        f"{where}: param {param!r} does not name {expected!r}: {error}"
    )
    # The message names the same place, so a human can find it without the param.
    assert param.split(".")[0] in message or param in message, f"{where}: {error}"


def check_request(original: dict[str, Any], sent: dict[str, Any], where: str) -> None:
    """A compacted request is still a valid one for the same conversation."""
    assert isinstance(sent, dict), f"{where}: not a JSON object"
    assert set(sent) == set(original), f"{where}: fields changed: {set(sent) ^ set(original)}"
    for key, value in original.items():
        if key != "messages":
            assert sent[key] == value, f"{where}: {key!r} changed"
    before: list[Any] = original["messages"]
    after = sent["messages"]
    assert isinstance(after, list) and after, f"{where}: no messages forwarded"
    system = [m for m in _leading_system(before)]
    assert after[: len(system)] == system, f"{where}: the system messages are not first and intact"
    assert after[-1] == before[-1], f"{where}: the newest message changed"
    _check_tool_pairs(before, after, where)


def _leading_system(messages: list[Any]) -> Iterator[Any]:
    for message in messages:
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            return
        yield message


def _check_tool_pairs(before: list[Any], after: list[Any], where: str) -> None:
    """Every call forwarded has its result after it; no result lost the call it answers."""
    calls_before = _call_ids(before)
    seen_calls: set[str] = set()
    for message in after:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            seen_calls |= _call_ids([message])
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id in calls_before:  # orphans the client sent stay orphans; fine
                assert call_id in seen_calls, f"{where}: result {call_id!r} without its call"
    results_after = {
        m.get("tool_call_id") for m in after if isinstance(m, dict) and m.get("role") == "tool"
    }
    results_before = {
        m.get("tool_call_id") for m in before if isinstance(m, dict) and m.get("role") == "tool"
    }
    for call_id in seen_calls & results_before:
        assert call_id in results_after, f"{where}: call {call_id!r} forwarded without its result"


def _call_ids(messages: list[Any]) -> set[str]:
    ids: set[str] = set()
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
            ids |= {
                call["id"]
                for call in message["tool_calls"]
                if isinstance(call, dict) and isinstance(call.get("id"), str)
            }
    return ids


def check_alive(proxy: ProxyServer, raw_client: httpx.Client) -> None:
    assert raw_client.get("/healthz").status_code == 200
    normal = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}]}
    response = raw_client.post(CHAT_PATH, json=normal)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: still there?"


# --------------------------------------------------------------------------- the test


@pytest.mark.parametrize("padded", [False, True], ids=["short", "padded"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_body(
    hostile_proxy: ProxyServer,
    upstream: UpstreamServer,
    sdk: openai.OpenAI,
    raw_client: httpx.Client,
    case: Case,
    padded: bool,
) -> None:
    body = case.build(padded)
    try:
        original: dict[str, Any] | None = orjson.loads(body)  # the proxy's own reading
    except orjson.JSONDecodeError:
        original = None

    preview = send(sdk, raw_client, case, PREVIEW_PATH, body)
    check_reply(preview, case, body, proxy_made=True, where="preview")
    if preview.status_code == 200:
        assert isinstance(original, dict)
        shown = preview.json()
        if shown["changed"]:
            check_request(original, shown["request"], "preview")

    upstream.clear()  # the preview may have called the summarizer; only the chat counts below
    chat = send(sdk, raw_client, case, CHAT_PATH, body)
    forwarded = [r for r in upstream.requests(CHAT_PATH) if not _summarizer_call(r.body)]
    check_reply(chat, case, body, proxy_made=not forwarded, where="chat")
    assert len(forwarded) <= 1, f"one request, {len(forwarded)} forwards"
    for recorded in forwarded:
        if recorded.body == body:
            continue  # the client's bytes, untouched
        # Rewritten (or sent by the SDK, which serializes on its own): it must parse, and be
        # either the same request or a valid compaction of it.
        assert isinstance(original, dict), "a body the proxy cannot read was rewritten"
        sent = orjson.loads(recorded.body)
        if sent != original:
            check_request(original, sent, "chat forward")
            continue
        if padded and _compactable(original):
            # Twice the window went upstream as it was: only with a warning that says why.
            assert chat.headers.get("x-compaction-warning"), (
                "the padded request went upstream uncompacted and without a warning"
            )
    check_alive(hostile_proxy, raw_client)


def _summarizer_call(body: bytes) -> bool:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and is_summarizer_call(payload)


def _compactable(original: dict[str, Any] | None) -> bool:
    """A padded body of the test model that compaction can work on."""
    return (
        isinstance(original, dict)
        and original.get("model") == MODEL
        and isinstance(original.get("messages"), list)
        and len(original["messages"]) > 10
    )
