"""Overflow refusals of the servers that serve ``/v1/messages``, recognised
(compaction_proxy/upstream/_overflow.py), with what each states learned.

The bodies are the fake Messages upstream's own (tests/fakes/messages/errors.py: Anthropic,
llama.cpp, vLLM in both wordings, a 413 in front of the model), so these tests and the
integration tests that drive that server stay in step.
"""

from __future__ import annotations

import gzip

import pytest

from compaction_proxy.upstream import Overflow, detect_overflow, window_after_refusal
from compaction_proxy.wire import DEFAULT_FORMAT
from tests.fakes.messages import errors

W, M = 64_000, 32_000  # Claude Code's max_tokens on a 64k local window


def refused(style: str, prompt: int, *, count_output: bool = False) -> tuple[int, bytes]:
    response = errors.overflow(style, W, prompt, M, count_output)
    assert response is not None, "the fake accepts this request"
    return response.status_code, bytes(response.body)


def detect(status: int, body: bytes, encoding: str | None = None) -> Overflow | None:
    return detect_overflow(status, body, encoding, DEFAULT_FORMAT.refusals)


def test_anthropic_prompt_is_too_long_states_the_prompt_and_the_window() -> None:
    status, body = refused("anthropic", 70_123)
    assert status == 400
    found = detect(status, body)
    assert found == Overflow(
        "anthropic", W, 70_123, None, "prompt is too long: 70123 tokens > 64000 maximum"
    )
    assert not found.prompt_is_floor
    assert window_after_refusal(found, sent_tokens=1, output_reserve=1, requested_output=M) == W


def test_anthropic_input_and_max_tokens_over_the_limit_states_all_three() -> None:
    status, body = refused("anthropic", 40_000, count_output=True)
    found = detect(status, body)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens, found.output_tokens) == (
        "anthropic",
        W,
        40_000,
        M,
    )


def test_llamacpp_on_its_messages_route_answers_in_its_own_shape() -> None:
    status, body = refused("llamacpp", 64_000)  # P >= n_ctx
    found = detect(status, body)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens) == ("llama.cpp", W, 64_000)


def test_vllm_renderer_wording_states_a_floor_and_is_not_taken_as_the_count() -> None:
    status, body = refused("vllm", 50_000)  # P > W - M; vLLM stops counting at W - M + 1
    found = detect(status, body)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens, found.output_tokens) == (
        "vllm",
        W,
        W - M + 1,
        M,
    )
    # One past the longest prompt that fits is where vLLM stopped counting, whatever the
    # prompt: the calibration does not learn from it (it does from the other shapes).
    assert found.prompt_is_floor


def test_vllm_older_wording_in_anthropics_shape() -> None:
    status, body = refused("vllm_old", 50_000)
    found = detect(status, body)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens, found.output_tokens) == (
        "vllm",
        W,
        50_000,
        M,
    )


def test_a_413_request_too_large_in_anthropics_shape_is_an_overflow_without_numbers() -> None:
    status, body = refused("413", 70_000)
    assert status == 413
    found = detect(status, body)
    assert found == Overflow(
        "anthropic", None, None, None, "Request exceeds the maximum allowed number of bytes."
    )
    # Nothing stated: the window is shrunk from what was sent.
    learned = window_after_refusal(found, sent_tokens=60_000, output_reserve=M, requested_output=M)
    assert learned == int(0.8 * (60_000 + M))


def test_a_compressed_refusal_is_read_too() -> None:
    status, body = refused("anthropic", 70_000)
    found = detect(status, gzip.compress(body), "gzip")
    assert found is not None and found.window == W


@pytest.mark.parametrize(
    ("status", "message"),
    [
        # The prompt fits; the output limit is the problem: compacting would not help.
        (400, "max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens"),
        (429, "Number of request tokens has exceeded your per-minute rate limit"),
        (529, "Overloaded"),
        (413, "fake upstream error: status 413 with another type"),
    ],
)
def test_anthropic_errors_that_are_not_overflows(status: int, message: str) -> None:
    response = errors.error_response(
        status, "api_error" if status != 400 else "invalid_request_error", message
    )
    assert detect(status, bytes(response.body)) is None


def test_vllm_max_tokens_past_the_window_is_not_an_overflow() -> None:
    response = errors.overflow("vllm", 8_192, 100, 10_000, False)
    assert response is not None
    assert detect(response.status_code, bytes(response.body)) is None


def test_the_fakes_own_413_status_is_read_as_anthropics() -> None:
    """``X-Fake-Status: 413`` answers Anthropic's type for the status."""
    response = errors.status_error(413)
    found = detect(413, bytes(response.body))
    assert found is not None and found.family == "anthropic"
