"""Numbers (and everything else) go upstream as the client wrote them.

A real proxy under ``serve`` in front of two fake upstreams that record the exact bytes they
get. Bodies are written by hand, with what a parser does not keep: an integer past 64 bits
(``"seed": 2**70``), ``1.10``, ``1E0``, ``-0.0``, ``-100.000``, escapes (``\\u00e9``,
``\\/``) and odd spacing, at the top level and (in one variant; the other writes them as the
SDKs do) in every message. After compaction fired (the first request of a conversation past
its 8k window) and on a checkpoint hit (the next one), on chat completions and on the
Responses API:

- every top-level member but ``messages``/``input`` is the client's text, byte for byte;
- every message or item the proxy forwards unchanged is the client's own text;
- only what the proxy made (the summary) or edited is its own.

With ``X-Compaction: off`` the body goes upstream byte for byte, routed by its model, even
when it is JSON the proxy's parser refuses: a UTF-8 BOM, ``1e400``, a lone surrogate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.fakes.upstream import is_summarizer_call
from tests.reliability.rawhttp import post
from tests.support.assertions import CHAT_PATH
from tests.support.servers import (
    ProxyServer,
    Recorded,
    UpstreamServer,
    proxy_config,
    upstream_entry,
)

MODEL = "exact-8k"
OTHER = "other-1"
RESPONSES = "/v1/responses"
SEED = 2**70
# Top-level members as a client may write them; none of them survives orjson as written.
TOP = [
    f'"seed":{SEED}',
    '"temperature" :  1.10',
    '"top_p":1E0',
    '"logit_bias":{"50256":-100.000,"1":1e2}',
    '"metadata":{"note":"caf\\u00e9 \\/ ok","n":"-0.0"}',
]
EXACT = '{"big":1180591620717411303424,"ratio":1.10,"neg":-9223372036854775809,"z":-0.0}'
PLACEHOLDER = '"@exact@"'


@pytest.fixture(scope="module")
def servers(upstream_factory_module: Any) -> dict[str, UpstreamServer]:
    return {"main": upstream_factory_module(), "other": upstream_factory_module()}


@pytest.fixture(scope="module")
def proxy(servers: dict[str, UpstreamServer], module_proxy_factory: Any) -> ProxyServer:
    config = proxy_config(
        upstream_entry(servers["main"], name="main", models=["exact-*"]),
        upstream_entry(servers["other"], name="other", models=["other-*"]),
        models={MODEL: {"context_window": 8_000, "max_output_tokens": 1_000}},
        summarization={"enabled": True, "maxSummaryTokens": 600, "timeout": 10},
    )
    started: ProxyServer = module_proxy_factory(config)
    return started


@pytest.fixture
def fakes(servers: dict[str, UpstreamServer]) -> Iterator[dict[str, UpstreamServer]]:
    for server in servers.values():
        server.reset()
    yield servers
    for server in servers.values():
        server.reset()


def written(value: dict[str, Any], exotic: bool = True) -> str:
    """One message or item as the client writes it: its own fields, then (``exotic``) numbers
    orjson would not write back as written. Without them the array is exactly what orjson
    writes (what the SDKs send), which the proxy splices in one piece."""
    if not exotic:
        return orjson.dumps(value).decode()
    return orjson.dumps({**value, "x_exact": "@exact@"}).decode().replace(PLACEHOLDER, EXACT)


def body_text(key: str, elements: list[str]) -> bytes:
    return (
        f'{{"model":"{MODEL}", "{key}":[' + ",".join(elements) + "]," + ",".join(TOP) + "}"
    ).encode()


def chat_conversation(tag: str) -> list[dict[str, Any]]:
    """Past an 8k window: a task, then tool steps with long results, a user turn every four."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task {tag}: fix the parser."},
    ]
    for step in range(12):
        call = {
            "id": f"c{tag}{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": f"{tag} {step} " + "z " * 700}
        )
        if step % 4 == 3:
            messages.append({"role": "user", "content": f"Continue {tag} {step}."})
    return messages


def responses_conversation(tag: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": f"Task {tag}: fix the parser."},
    ]
    for step in range(12):
        call_id = f"call_{tag}{step}"
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "read_file",
                "arguments": '{"path": "a.py"}',
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": "z " * 700 + tag}
        )
        if step % 4 == 3:
            items.append({"type": "message", "role": "user", "content": f"Continue {step}."})
    return items


def exact(raw: bytes) -> Any:
    """A body parsed keeping every number's spelling (as text)."""
    return json.loads(raw, parse_float=str, parse_int=str)


def forwarded(server: UpstreamServer, path: str) -> Recorded:
    """The last request on ``path`` that was the client's, not a summary call."""
    own = [r for r in server.requests(path) if not is_summarizer_call(r.json())]
    assert own, f"nothing was forwarded on {path}"
    return own[-1]


def assert_exact(sent: bytes, elements: list[str], key: str, received: bytes) -> int:
    """``received`` keeps ``sent``'s bytes everywhere the proxy changed nothing; returns how
    many of the forwarded elements were the proxy's own (made or edited)."""
    for member in TOP:
        assert member.encode() in received, f"{member} was not forwarded as written"
    assert b"e+21" not in received and b"1.1," not in received
    mine, theirs = exact(received), exact(sent)
    assert {k: v for k, v in mine.items() if k != key} == {
        k: v for k, v in theirs.items() if k != key
    }
    made = 0
    kept = 0
    for element in orjson.loads(received)[key]:
        same = [text for text in elements if orjson.loads(text) == element]
        if not same:
            made += 1
            continue
        # A message the proxy forwards unchanged is the client's own text, numbers and all.
        assert any(text.encode() in received for text in same), element
        kept += 1
    assert kept >= 2
    return made


def send(proxy: ProxyServer, path: str, body: bytes, **headers: str) -> dict[str, str]:
    response = post(proxy.port, path, body, {"Content-Type": "application/json", **headers})
    assert response is not None and response.status == 200, response
    return response.headers


# --------------------------------------------------------------------------- compacted routes


def _follow_up(elements: list[str], responses: bool, exotic: bool) -> list[str]:
    """The next request of the conversation: the model's answer and a new user message."""
    answer: dict[str, Any] = {"role": "assistant", "content": "Done with that."}
    question: dict[str, Any] = {"role": "user", "content": "Now the tests."}
    if responses:
        answer = {**answer, "type": "message", "content": [{"type": "output_text", "text": "ok"}]}
        question = {**question, "type": "message"}
    return [*elements, written(answer, exotic), written(question, exotic)]


@pytest.mark.parametrize("messages", ["exotic-messages", "sdk-messages"])
@pytest.mark.parametrize("moment", ["compaction", "checkpoint-hit"])
@pytest.mark.parametrize("route", ["chat", "responses"])
def test_numbers_are_forwarded_as_written_when_the_proxy_rewrites_the_body(
    proxy: ProxyServer, fakes: dict[str, UpstreamServer], route: str, moment: str, messages: str
) -> None:
    responses = route == "responses"
    exotic = messages == "exotic-messages"
    path, key = (RESPONSES, "input") if responses else (CHAT_PATH, "messages")
    tag = f"{route}-{moment}-{messages}"
    conversation = responses_conversation(tag) if responses else chat_conversation(tag)
    elements = [written(element, exotic) for element in conversation]
    body = body_text(key, elements)
    headers = send(proxy, path, body)
    # The conversation is past its window: compaction fired and made a new checkpoint.
    assert headers["x-compaction-checkpoint"] == "new", headers
    assert headers["x-compaction-strategies"] != "none"
    if moment == "checkpoint-hit":
        elements = _follow_up(elements, responses, exotic)
        body = body_text(key, elements)
        headers = send(proxy, path, body)
        assert headers["x-compaction-checkpoint"] == "hit", headers
    made = assert_exact(body, elements, key, forwarded(fakes["main"], path).body)
    assert made >= 1  # the summary is the proxy's own
    assert fakes["other"].requests() == []


# --------------------------------------------------------------------------- X-Compaction: off

REFUSED_BY_ORJSON = {
    "bom": b'\xef\xbb\xbf{"model":"%s","%s":[{"role":"user","content":"hi"}]}',
    "1e400": b'{"%s":[{"role":"user","content":"hi"}],"seed":1e400,"model":"%s"}',
    "lone-surrogate": b'{"model":"%s","%s":[{"role":"user","content":"\\ud800 x"}]}',
}


def _off_body(case: str, key: str) -> bytes:
    template = REFUSED_BY_ORJSON[case]
    if case == "1e400":
        return template % (key.encode(), OTHER.encode())
    return template % (OTHER.encode(), key.encode())


@pytest.mark.parametrize("case", sorted(REFUSED_BY_ORJSON))
@pytest.mark.parametrize(("path", "key"), [(CHAT_PATH, "messages"), (RESPONSES, "input")])
def test_off_forwards_json_the_parser_refuses_byte_for_byte(
    proxy: ProxyServer, fakes: dict[str, UpstreamServer], case: str, path: str, key: str
) -> None:
    body = _off_body(case, key)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    response = post(
        proxy.port, path, body, {"Content-Type": "application/json", "X-Compaction": "off"}
    )
    assert response is not None and response.status < 500, response
    (recorded,) = fakes["other"].requests(path)  # routed by the model read leniently
    assert recorded.body == body
    assert fakes["main"].requests() == []
