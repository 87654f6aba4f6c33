"""parse_chat_body: every way a chat request can be malformed is a 400 in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from compaction_proxy.http import ProxyError, bad_request, error_body
from compaction_proxy.wire import parse_chat_body


def error_of(raw: bytes) -> ProxyError:
    with pytest.raises(ProxyError) as info:
        parse_chat_body(raw)
    return info.value


def assert_openai_shape(error: ProxyError) -> dict[str, object]:
    body = orjson.loads(error.body())
    assert list(body) == ["error"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t"])
def test_empty_body(raw: bytes) -> None:
    error = error_of(raw)
    assert error.status == 400
    shape = assert_openai_shape(error)
    assert shape["code"] == "invalid_json"
    assert "empty" in str(shape["message"])


@pytest.mark.parametrize("raw", [b"{", b'{"model": "x",}', b"not json", b"\xff\xfe"])
def test_invalid_json(raw: bytes) -> None:
    error = error_of(raw)
    assert error.status == 400
    shape = assert_openai_shape(error)
    assert shape["code"] == "invalid_json"
    assert "not valid JSON" in str(shape["message"])
    assert shape["param"] is None


@pytest.mark.parametrize(
    ("raw", "kind"), [(b"[]", "list"), (b'"text"', "str"), (b"42", "int"), (b"null", "NoneType")]
)
def test_body_not_object(raw: bytes, kind: str) -> None:
    error = error_of(raw)
    assert error.status == 400
    shape = assert_openai_shape(error)
    assert shape["code"] == "invalid_json"
    assert f"not {kind}" in str(shape["message"])


def test_missing_messages() -> None:
    error = error_of(b'{"model": "gpt-4o"}')
    assert error.status == 400
    shape = assert_openai_shape(error)
    assert shape["param"] == "messages"
    assert shape["code"] == "missing_required_parameter"


@pytest.mark.parametrize(
    ("messages", "kind"), [("{}", "dict"), ('"hi"', "str"), ("null", "NoneType"), ("1", "int")]
)
def test_messages_not_list(messages: str, kind: str) -> None:
    error = error_of(f'{{"model": "gpt-4o", "messages": {messages}}}'.encode())
    shape = assert_openai_shape(error)
    assert error.status == 400
    assert shape["param"] == "messages"
    assert shape["code"] == "invalid_type"
    assert f"not {kind}" in str(shape["message"])


@pytest.mark.parametrize("model", [None, "null"])
def test_missing_model(model: str | None) -> None:
    body = '{"messages": []' + (f', "model": {model}' if model else "") + "}"
    error = error_of(body.encode())
    shape = assert_openai_shape(error)
    assert shape["param"] == "model"
    assert shape["code"] == "missing_required_parameter"


@pytest.mark.parametrize(("model", "kind"), [("4", "int"), ("[]", "list"), ("true", "bool")])
def test_model_not_string(model: str, kind: str) -> None:
    error = error_of(f'{{"messages": [], "model": {model}}}'.encode())
    shape = assert_openai_shape(error)
    assert shape["param"] == "model"
    assert shape["code"] == "invalid_type"
    assert f"not {kind}" in str(shape["message"])


def test_messages_checked_before_model() -> None:
    assert error_of(b"{}").param == "messages"


def test_valid_body_returned_with_unknown_fields() -> None:
    raw = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "x_extra": 1}'
    data = parse_chat_body(raw)
    assert data["model"] == "gpt-4o"
    assert data["messages"] == [{"role": "user", "content": "hi"}]
    assert data["x_extra"] == 1


def test_empty_messages_list_accepted() -> None:
    assert parse_chat_body(b'{"model": "m", "messages": []}')["messages"] == []


def test_error_body_shape() -> None:
    body = orjson.loads(error_body("boom", type="server_error", code="c", param="p"))
    assert body == {"error": {"message": "boom", "type": "server_error", "param": "p", "code": "c"}}


def test_bad_request_defaults() -> None:
    error = bad_request("nope")
    assert error.status == 400
    assert orjson.loads(error.body())["error"] == {
        "message": "nope",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request",
    }


def test_proxy_error_survives_a_context_manager() -> None:
    # httpx re-raises through @contextmanager, which assigns __traceback__: a frozen
    # dataclass turned that into a TypeError and a 413 into a 500.
    import contextlib

    @contextlib.contextmanager
    def wrapper() -> Iterator[None]:
        yield

    with pytest.raises(ProxyError) as info, wrapper():
        raise bad_request("x")
    assert info.value.status == 400
    assert info.value.__traceback__ is not None
    assert len({info.value, bad_request("x")}) == 2  # hashable, by identity
