"""Anthropic's side of the wire, piece by piece: which models the 1M-context beta is for
(compaction_proxy/wire/messages/_sizes.py), Claude models in the built-in table
(compaction_proxy/compaction/budget.py), a caller's key (``CallerKey``, ``caller_key``) and the
headers that go upstream with an ``x-api-key`` format (compaction_proxy/upstream/_headers.py).
"""

from __future__ import annotations

import pytest

from compaction_proxy.api import caller_key
from compaction_proxy.compaction.budget import ModelCatalog
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.upstream import upstream_headers, upstream_url
from compaction_proxy.wire import BEARER, CallerKey, UpstreamAuth, WindowOption
from compaction_proxy.wire.messages._sizes import (
    CONTEXT_1M_BETA,
    anthropic_window_option,
    betas,
    supports_1m_beta,
)

X_API_KEY = UpstreamAuth("x-api-key", "")  # what the Messages format declares


# ------------------------------------------------------------------ the 1M-context beta


@pytest.mark.parametrize(
    "model",
    [
        "claude-sonnet-4-20250514",
        "claude-sonnet-4-0",
        "claude-sonnet-4-5",
        "claude-sonnet-4-5-20250929",
        "claude-sonnet-4-5@20250929",  # Vertex
        "anthropic/claude-sonnet-4.5",  # OpenRouter
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",  # Bedrock
        "claude-sonnet-4-6",
        "claude-opus-4-6",
        "claude-opus-4-7",
        "claude-opus-5-5",
        "claude-sonnet-5",
        "claude-fable-5-1",
    ],
)
def test_the_beta_is_for_sonnet_4_on_and_opus_4_6_on(model: str) -> None:
    assert supports_1m_beta(model)


@pytest.mark.parametrize(
    "model",
    [
        "claude-opus-4-20250514",
        "claude-opus-4-1-20250805",
        "claude-opus-4-5",
        "claude-haiku-4-5-20251001",
        "claude-3-7-sonnet-latest",
        "claude-3-5-sonnet-20241022",
        "gpt-4o",
        "local-coder",
        "claude-sonnet",
    ],
)
def test_the_beta_is_not_for_older_or_other_models(model: str) -> None:
    assert not supports_1m_beta(model)


def test_the_option_needs_the_exact_beta_among_the_listed_ones() -> None:
    model = "claude-sonnet-4-5"
    listed = [(b"anthropic-beta", b"claude-code-20250219, context-1m-2025-08-07 ,x")]
    assert anthropic_window_option(model, listed) == WindowOption(1_000_000, CONTEXT_1M_BETA)
    repeated = [(b"anthropic-beta", b"claude-code-20250219"), (b"anthropic-beta", b"x")]
    repeated.append((b"anthropic-beta", CONTEXT_1M_BETA.encode()))
    assert anthropic_window_option(model, repeated) is not None
    assert list(betas(repeated)) == ["claude-code-20250219", "x", CONTEXT_1M_BETA]
    for near in (b"context-1m-2025-08-07x", b"context-1m", b"CONTEXT-1M-2025-08-07"):
        assert anthropic_window_option(model, [(b"anthropic-beta", near)]) is None
    assert anthropic_window_option(model, [(b"x-anthropic-beta", CONTEXT_1M_BETA.encode())]) is None
    assert anthropic_window_option(model, []) is None
    assert anthropic_window_option("claude-opus-4-5", listed) is None


# ------------------------------------------------------------------ the built-in table


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5-20250929", 200_000),
        ("claude-sonnet-4-20250514", 200_000),
        ("claude-opus-4-1-20250805", 200_000),
        ("claude-opus-4-5", 200_000),
        ("claude-haiku-4-5-20251001", 200_000),
        ("claude-3-5-sonnet-20241022", 200_000),
        ("claude-3-haiku-20240307", 200_000),
        ("claude-sonnet-4-6", 1_000_000),
        ("claude-opus-4-6", 1_000_000),
        ("claude-opus-4-7", 1_000_000),
        ("anthropic/claude-opus-4.6", 1_000_000),
        ("claude-opus-5-5", 1_000_000),
        ("claude-sonnet-5-5", 1_000_000),
        ("claude-haiku-5-5", 1_000_000),
        ("claude-fable-5-1", 1_000_000),
    ],
)
def test_claude_models_have_known_windows(model: str, window: int) -> None:
    catalog = ModelCatalog()
    assert catalog.known_windows(model) == (None, window)
    assert catalog.window_source(model) == "builtin"


def test_a_name_that_only_starts_like_claude_is_not_one() -> None:
    assert ModelCatalog().known_windows("claudette-7b") == (None, None)


# ------------------------------------------------------------------ a caller's key


def test_a_callers_key_without_its_scheme_and_never_in_its_repr() -> None:
    bearer = CallerKey("authorization", "Bearer sk-ant-secret-1")
    assert bearer.key == "sk-ant-secret-1"
    assert CallerKey("x-api-key", " sk-ant-secret-2 ").key == "sk-ant-secret-2"
    assert CallerKey("authorization", "Basic dXNlcg==").key == "Basic dXNlcg=="
    assert "secret" not in repr(bearer) and "secret" not in str(bearer)


def test_a_callers_key_goes_as_it_came_where_the_call_takes_it_else_as_bearer() -> None:
    api_key = CallerKey("x-api-key", "sk-ant-1")
    oauth = CallerKey("authorization", "Bearer sk-ant-oat01-2")
    assert api_key.sent_with(X_API_KEY) == ("x-api-key", "sk-ant-1")
    assert oauth.sent_with(X_API_KEY) == ("authorization", "Bearer sk-ant-oat01-2")
    assert api_key.sent_with(BEARER) == ("authorization", "Bearer sk-ant-1")
    assert oauth.sent_with(BEARER) == ("authorization", "Bearer sk-ant-oat01-2")


def _scope(*headers: tuple[str, str]) -> dict[str, object]:
    return {"headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_the_key_is_read_where_the_format_takes_one() -> None:
    both = _scope(("authorization", "Bearer sk-b"), ("x-api-key", "sk-x"))
    assert caller_key(both, X_API_KEY) == CallerKey("x-api-key", "sk-x")
    assert caller_key(both, BEARER) == CallerKey("authorization", "Bearer sk-b")
    only_x = _scope(("x-api-key", "sk-x"))
    assert caller_key(only_x, BEARER) is None  # OpenAI's APIs take keys in Authorization only
    assert caller_key(_scope(("authorization", "Bearer sk-b")), X_API_KEY) == CallerKey(
        "authorization", "Bearer sk-b"
    )
    assert caller_key(_scope(("x-api-key", "  ")), X_API_KEY) is None
    assert X_API_KEY.caller_headers == ("x-api-key", "authorization")
    assert BEARER.caller_headers == ("authorization",)


# ------------------------------------------------------------------ headers upstream


def _upstream(api_key: str | None = None) -> UpstreamSettings:
    return UpstreamSettings(name="u", base_url="http://u.test/v1", api_key=api_key)


CLIENT = [
    (b"x-api-key", b"sk-caller"),
    (b"authorization", b"Bearer sk-caller-2"),
    (b"anthropic-version", b"2023-06-01"),
    (b"anthropic-beta", b"claude-code-20250219,context-1m-2025-08-07"),
    (b"content-type", b"application/json"),
]


def test_an_operator_key_drops_every_caller_key_header_and_goes_as_x_api_key() -> None:
    out = upstream_headers(CLIENT, _upstream("sk-op"), strip_authorization=False, auth=X_API_KEY)
    assert out == [
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "claude-code-20250219,context-1m-2025-08-07"),
        ("content-type", "application/json"),
        ("x-api-key", "sk-op"),
    ]


def test_without_an_operator_key_the_callers_headers_go_as_sent() -> None:
    out = upstream_headers(CLIENT, _upstream(), strip_authorization=False, auth=X_API_KEY)
    assert out == [(n.decode(), v.decode()) for n, v in CLIENT]


def test_the_proxys_own_key_never_travels_whichever_header_it_came_in() -> None:
    out = upstream_headers(CLIENT, _upstream(), strip_authorization=True, auth=X_API_KEY)
    assert {name for name, _ in out} == {"anthropic-version", "anthropic-beta", "content-type"}


def test_the_beta_query_string_passes() -> None:
    scope = {"path": "/v1/messages", "raw_path": b"/v1/messages", "query_string": b"beta=true"}
    assert upstream_url(_upstream(), scope) == "http://u.test/v1/messages?beta=true"
