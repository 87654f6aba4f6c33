"""Keys go only where they belong: routing by model at any size and framing, and a model no
upstream serves refused.

Three real fake upstreams, each with its own key, behind one proxy under ``serve``:
``chat`` (``gpt-4o*``, ``o1*``, listed first), ``embed`` (``text-embedding-*``) and ``audio``
(``whisper-*``). Every test checks what each upstream received, byte for byte, and with which
key: a request the proxy sent to the wrong one would carry a key meant for another provider.
Uploads that an HTTP client would reframe go over a raw socket (tests/reliability/rawhttp.py).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.reliability.rawhttp import RawResponse, post, post_chunked
from tests.support.assertions import CHAT_PATH
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

KEYS = {"chat": "sk-chat-key", "embed": "sk-embed-key", "audio": "sk-audio-key"}
PATTERNS = {"chat": ["gpt-4o*", "o1*"], "embed": ["text-embedding-*"], "audio": ["whisper-*"]}
EMBEDDINGS = "/v1/embeddings"
TRANSCRIPTIONS = "/v1/audio/transcriptions"


@pytest.fixture(scope="module")
def servers(upstream_factory_module: Any) -> dict[str, UpstreamServer]:
    return {name: upstream_factory_module() for name in KEYS}


@pytest.fixture(scope="module")
def routed(servers: dict[str, UpstreamServer], module_proxy_factory: Any) -> ProxyServer:
    entries = [
        upstream_entry(servers[name], name=name, api_key=KEYS[name], models=PATTERNS[name])
        for name in KEYS
    ]
    proxy: ProxyServer = module_proxy_factory(proxy_config(*entries, allow_anonymous_spend=True))
    return proxy


@pytest.fixture
def fakes(servers: dict[str, UpstreamServer]) -> Iterator[dict[str, UpstreamServer]]:
    for server in servers.values():
        server.reset()
    yield servers
    for server in servers.values():
        server.reset()


def only_reached(fakes: dict[str, UpstreamServer], name: str, path: str) -> Any:
    """The one request ``name`` received on ``path``, sent with its own key; the others
    received nothing at all."""
    for other, server in fakes.items():
        if other != name:
            assert server.requests() == [], f"{other} received a request meant for {name}"
    (recorded,) = fakes[name].requests(path)
    assert recorded.headers["authorization"] == f"Bearer {KEYS[name]}"
    return recorded


def nothing_reached(fakes: dict[str, UpstreamServer]) -> None:
    for name, server in fakes.items():
        assert server.requests() == [], f"{name} received a request"


def big_embeddings_body() -> bytes:
    """~300 KB, the model after the input (as any client may order them)."""
    body = orjson.dumps({"input": [f"text {i} " + "x" * 990 for i in range(300)]})
    return body[:-1] + b',"model":"text-embedding-3-small"}'


# --------------------------------------------------------------------------- item 1: size, framing


def test_a_300_kb_embeddings_body_reaches_the_upstream_serving_its_model(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    body = big_embeddings_body()
    assert len(body) > 300_000
    with routed.http_client() as client:
        response = client.post(
            EMBEDDINGS, content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 200, response.text
    assert only_reached(fakes, "embed", EMBEDDINGS).body == body


def test_a_2_kb_chunked_body_reaches_the_upstream_serving_its_model(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    body = orjson.dumps({"model": "text-embedding-3-small", "input": ["y" * 2000]})
    chunks = [body[:700], body[700:1400], body[1400:]]
    response = post_chunked(routed.port, EMBEDDINGS, chunks, {"Content-Type": "application/json"})
    assert response is not None and response.status == 200, response
    assert only_reached(fakes, "embed", EMBEDDINGS).body == body


def test_a_json_body_without_a_content_type_is_routed_by_its_model(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    body = b'\n  {"input": "hello", "model": "text-embedding-3-small"}'
    response = post(routed.port, EMBEDDINGS, body)
    assert response is not None and response.status == 200, response
    assert only_reached(fakes, "embed", EMBEDDINGS).body == body


def multipart(fields: list[tuple[str, bytes, str | None]], boundary: str) -> bytes:
    """A multipart/form-data body: (name, value, filename) in the order given."""
    out = b""
    for name, value, filename in fields:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename is not None:
            out += b"Content-Type: audio/wav\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


AUDIO = b"RIFF" + bytes(range(256)) * 2048  # 512 KB of "audio", CRLFs and dashes included


def test_a_multipart_upload_is_routed_by_its_model_field(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    """As the SDK sends it: the fields, then the file, with a Content-Length."""
    with routed.http_client() as client:
        response = client.post(
            TRANSCRIPTIONS,
            data={"model": "whisper-1", "language": "en"},
            files={"file": ("speech.wav", AUDIO, "audio/wav")},
        )
    assert response.status_code == 200, response.text
    recorded = only_reached(fakes, "audio", TRANSCRIPTIONS)
    assert AUDIO in recorded.body and b'name="model"\r\n\r\nwhisper-1\r\n' in recorded.body
    assert response.json()["body_len"] == len(recorded.body)


def test_a_chunked_multipart_upload_with_its_model_after_the_file_is_routed(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    boundary = "----cp-boundary-7d1"
    body = multipart(
        [("file", AUDIO, "speech.wav"), ("model", b"whisper-large-v3", None)], boundary
    )
    chunks = [body[i : i + 65_536] for i in range(0, len(body), 65_536)]
    response = post_chunked(
        routed.port,
        TRANSCRIPTIONS,
        chunks,
        {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert response is not None and response.status == 200, response
    assert only_reached(fakes, "audio", TRANSCRIPTIONS).body == body


def test_a_request_without_a_model_goes_to_the_first_upstream(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    """Documented: no body, or a body that names no model, goes to the first upstream."""
    with routed.http_client() as client:
        assert client.get("/v1/models").status_code == 200
        batch = client.post("/v1/batches", json={"input_file_id": "file-1", "endpoint": "x"})
        assert batch.status_code == 200
    (models,) = fakes["chat"].requests("/v1/models")
    (batches,) = fakes["chat"].requests("/v1/batches")
    for recorded in (models, batches):
        assert recorded.headers["authorization"] == f"Bearer {KEYS['chat']}"
    assert fakes["embed"].requests() == [] and fakes["audio"].requests() == []


@pytest.mark.parametrize(
    ("body", "content_type", "problem"),
    [
        (b'{"model": ["text-embedding-3-small"], "input": "x"}', "application/json", "string"),
        (b'{"model": "text-embedding-3-small", "input": ', "application/json", "JSON object"),
    ],
    ids=["model-not-a-string", "truncated-json"],
)
def test_a_model_the_proxy_cannot_read_is_refused_not_guessed(
    routed: ProxyServer,
    fakes: dict[str, UpstreamServer],
    body: bytes,
    content_type: str,
    problem: str,
) -> None:
    response = post(routed.port, EMBEDDINGS, body, {"Content-Type": content_type})
    error = openai_error(response, 400)
    assert error["code"] == "invalid_model" and error["param"] == "model"
    assert problem in str(error["message"])
    nothing_reached(fakes)


def test_a_compressed_body_is_refused_when_its_model_must_be_read(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    body = gzip.compress(orjson.dumps({"model": "text-embedding-3-small", "input": "x"}))
    response = post(
        routed.port,
        EMBEDDINGS,
        body,
        {"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    error = openai_error(response, 415)
    assert error["code"] == "unsupported_content_encoding"
    nothing_reached(fakes)


# ------------------------------------------------------------------- item 2: model_not_found


def openai_error(response: RawResponse | httpx.Response | None, status: int) -> dict[str, Any]:
    assert response is not None, "the proxy closed without an answer"
    code = response.status if isinstance(response, RawResponse) else response.status_code
    content = response.body if isinstance(response, RawResponse) else response.content
    assert code == status, (code, content[:300])
    body = orjson.loads(content)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def assert_model_not_found(error: dict[str, Any], model: str, route: str) -> None:
    assert error["code"] == "model_not_found", route
    assert error["type"] == "invalid_request_error" and error["param"] == "model", route
    message = str(error["message"])
    assert repr(model) in message, route
    for name in KEYS:
        assert name in message, (route, name)


def _nope_requests(proxy: ProxyServer) -> list[tuple[str, httpx.Response]]:
    chat = {"model": "gpt-nope", "messages": [{"role": "user", "content": "hi"}]}
    sent: list[tuple[str, httpx.Response]] = []
    sdk = proxy.openai_client()
    try:
        sdk.chat.completions.create(**chat)  # type: ignore[call-overload]
    except openai.NotFoundError as exc:
        sent.append(("chat (SDK)", exc.response))
    try:
        sdk.responses.create(model="gpt-nope", input="hi")
    except openai.NotFoundError as exc:
        sent.append(("responses (SDK)", exc.response))
    try:
        sdk.embeddings.create(model="gpt-nope", input="hi")
    except openai.NotFoundError as exc:
        sent.append(("embeddings (SDK)", exc.response))
    sdk.close()
    with proxy.http_client() as client:
        sent.append(
            (
                "chat, X-Compaction: off",
                client.post(CHAT_PATH, json=chat, headers={"X-Compaction": "off"}),
            )
        )
        sent.append(("preview", client.post("/v1/compaction/preview", json=chat)))
        sent.append(
            (
                "transcription",
                client.post(
                    TRANSCRIPTIONS,
                    data={"model": "gpt-nope"},
                    files={"file": ("a.wav", b"RIFF", "audio/wav")},
                ),
            )
        )
    return sent


def test_a_model_no_upstream_serves_is_refused_on_every_route(
    routed: ProxyServer, fakes: dict[str, UpstreamServer]
) -> None:
    sent = _nope_requests(routed)
    assert [name for name, _ in sent] == [
        "chat (SDK)",
        "responses (SDK)",
        "embeddings (SDK)",
        "chat, X-Compaction: off",
        "preview",
        "transcription",
    ]
    for name, response in sent:
        error = openai_error(response, 404)
        assert_model_not_found(error, "gpt-nope", name)
    nothing_reached(fakes)


def test_a_catch_all_is_explicit(
    servers: dict[str, UpstreamServer], fakes: dict[str, UpstreamServer], proxy_factory: Any
) -> None:
    """``models: ["*"]`` (what an upstream that lists nothing gets) takes every model."""
    proxy: ProxyServer = proxy_factory(
        proxy_config(
            upstream_entry(servers["chat"], name="chat", api_key=KEYS["chat"], models=["gpt-4o"]),
            {
                "name": "audio",
                "base_url": servers["audio"].base_url,
                "api_key": KEYS["audio"],
            },  # no `models`: the catch-all
            allow_anonymous_spend=True,
        )
    )
    with proxy.openai_client() as sdk:
        sdk.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
    recorded = only_reached(fakes, "audio", CHAT_PATH)
    assert recorded.json()["model"] == "gpt-nope"
