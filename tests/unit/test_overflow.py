"""Recognising upstream refusals of over-long prompts, shape by shape and wording by wording."""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass

import pytest

from compaction_proxy.upstream._overflow import (
    MAX_ERROR_BODY,
    MAX_INFLATED,
    Overflow,
    detect_overflow,
)


def openai_error(
    message: str,
    *,
    type: str | None = "invalid_request_error",
    code: object = None,
    **extra: object,
) -> bytes:
    error: dict[str, object] = {"message": message, "type": type, "param": None, "code": code}
    error.update(extra)
    return json.dumps({"error": error}).encode()


def top_level_error(message: str, *, type: str = "BadRequestError", code: object = 400) -> bytes:
    return json.dumps(
        {"object": "error", "message": message, "type": type, "param": None, "code": code}
    ).encode()


@dataclass(frozen=True)
class Case:
    status: int
    body: bytes
    family: str
    window: int | None
    prompt: int | None
    output: int | None


OPENAI_MESSAGES = (
    "This model's maximum context length is 8192 tokens. However, your messages resulted in "
    "9013 tokens. Please reduce the length of the messages."
)
OPENAI_REQUESTED = (
    "This model's maximum context length is 128000 tokens. However, you requested 131200 tokens "
    "(127104 in the messages, 4096 in the completion). Please reduce the length of the messages "
    "or completion."
)
VLLM_LEGACY_TOTAL = (
    "This model's maximum context length is 4096 tokens. However, you requested 4596 tokens "
    "(4096 in the messages, 500 in the completion). Please reduce the length of the messages or "
    "completion."
)
VLLM_MESSAGES_ONLY = (
    "This model's maximum context length is 32768 tokens. However, you requested 32818 tokens in "
    "the messages, Please reduce the length of the messages. None"
)
VLLM_REQUEST_HAS = (
    "This model's maximum context length is 16384 tokens. However, your request has 17020 input "
    "tokens. Please reduce the length of the input messages. None"
)
VLLM_MAX_TOKENS = (
    "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context "
    "length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None"
)
VLLM_AT_LEAST = (
    "This model's maximum context length is 32768 tokens. However, you requested 2048 output "
    "tokens and your prompt contains at least 30721 input tokens, for a total of at least 32769 "
    "tokens. Please reduce the length of the input prompt or the number of requested output "
    "tokens. (parameter=input_tokens, value=30721)"
)
VLLM_NO_AT_LEAST = VLLM_AT_LEAST.replace("at least ", "")
VLLM_RENDERER = (
    "You passed 40000 input tokens and requested 1024 output tokens. However, the model's context "
    "length is only 32768 tokens, resulting in a maximum input length of 31744 tokens. Please "
    "reduce the length of the input prompt."
)
VLLM_RENDERER_CHARS = (
    "You passed 900000 input characters and requested 1024 output tokens. However, the model's "
    "context length is only 32768 tokens, resulting in a maximum input length of 31744 tokens (at "
    "most 793600 characters). Please reduce the length of the input prompt."
)
LLAMA_CPP = (
    "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it"
)
LLAMA_CPP_OLD = (
    "the request exceeds the available context size, try increasing the context size or enable "
    "context shift"
)
SGLANG_INPUT = "The input (40960 tokens) is longer than the model's context length (32768 tokens)."
SGLANG_REQUESTED = (
    "Requested token count exceeds the model's maximum context length of 131072 tokens. You "
    "requested a total of 135000 tokens: 130000 tokens from the input messages and 5000 tokens "
    "for the completion. Please reduce the number of tokens in the input messages or the "
    "completion to fit within the limit."
)
TGI_TOTAL = (
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 "
    "`inputs` tokens and 200 `max_new_tokens`"
)
TGI_INPUTS = "Input validation error: `inputs` must have less than 4095 tokens. Given: 5120"
MISTRAL = (
    "Prompt contains 40123 tokens and 0 draft tokens, too large for model with 32768 maximum "
    "context length"
)
DEEPSEEK = (
    "This model's maximum context length is 65536 tokens. However, you requested 81920 tokens "
    "(77824 in the messages, 4096 in the completion). Please reduce the length of the messages or "
    "completion."
)
GROQ = "Please reduce the length of the messages or completion."
OPENROUTER = (
    "This endpoint's maximum context length is 131072 tokens. However, you requested about "
    "141607 tokens (10535 of text input, 131072 in the output). Please reduce the length of "
    'either one, or use the "middle-out" transform to compress your prompt automatically.'
)
OPENROUTER_TOOLS = (
    "This endpoint's maximum context length is 200000 tokens. However, you requested about "
    "215000 tokens (190000 of text input, 9000 of tool input, 16000 in the output). Please "
    "reduce the length of either one."
)
LMSTUDIO_KEEP = (
    "Trying to keep the first 6524 tokens when context the overflows. However, the model is "
    "loaded with context length of only 4096 tokens, which is not enough. Try to load the model "
    "with a larger context length, or provide a shorter input"
)
LMSTUDIO_NKEEP = (
    "The number of tokens to keep from the initial prompt is greater than the context length "
    "(n_keep: 18339>= n_ctx: 16384). Try to load the model with a larger context length, or "
    "provide a shorter input."
)
OLLAMA_PLAIN = "the input length exceeds the context length"
OLLAMA_MLX = "input length (9000 tokens) exceeds the model's maximum context length (8192 tokens)"
OLLAMA_CLOUD_BY = "prompt too long; exceeded max context length by 1200 tokens"
OLLAMA_CLOUD_PROMPT = "The prompt is too long: 140000, model maximum context length: 131072"
GEMINI = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
ANTHROPIC_PROMPT = "prompt is too long: 213462 tokens > 200000 maximum"
ANTHROPIC_LIMIT = (
    "input length and `max_tokens` exceed context limit: 190000 + 32000 > 200000, decrease input "
    "length or `max_tokens` and try again"
)
AZURE_NEW = (
    "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 301512 "
    "tokens. Please reduce the length of the messages."
)
RESPONSES = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
LITELLM = (
    "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
    "OpenAIException - " + OPENAI_MESSAGES + "\nmodel=gpt-4. context_window_fallbacks=None."
)

CASES: dict[str, Case] = {
    "openai-messages": Case(
        400,
        openai_error(OPENAI_MESSAGES, code="context_length_exceeded"),
        "openai",
        8192,
        9013,
        None,
    ),
    "openai-requested": Case(
        400,
        openai_error(OPENAI_REQUESTED, code="context_length_exceeded"),
        "openai",
        128000,
        127104,
        4096,
    ),
    "openai-responses-code-and-text": Case(
        400,
        openai_error(RESPONSES, code="context_length_exceeded", param="input"),
        "openai",
        None,
        None,
        None,
    ),
    "azure-same-as-openai": Case(
        400,
        openai_error(OPENAI_MESSAGES, code="context_length_exceeded"),
        "openai",
        8192,
        9013,
        None,
    ),
    "azure-configured-limit": Case(
        400, openai_error(AZURE_NEW, code="context_length_exceeded"), "azure", 272000, 301512, None
    ),
    "vllm-old-top-level-total": Case(
        400, top_level_error(VLLM_LEGACY_TOTAL), "vllm", 4096, 4096, 500
    ),
    "vllm-old-messages-only": Case(
        400, top_level_error(VLLM_MESSAGES_ONLY), "vllm", 32768, 32818, None
    ),
    "vllm-new-envelope-total": Case(
        400,
        openai_error(VLLM_LEGACY_TOTAL, type="BadRequestError", code=400),
        "vllm",
        4096,
        4096,
        500,
    ),
    "vllm-request-has": Case(
        400,
        openai_error(VLLM_REQUEST_HAS, type="BadRequestError", code=400),
        "vllm",
        16384,
        17020,
        None,
    ),
    "vllm-max-tokens-prompt-fits": Case(
        400,
        openai_error(VLLM_MAX_TOKENS, type="BadRequestError", code=400),
        "vllm",
        4096,
        2778,
        8000,
    ),
    "vllm-at-least": Case(
        400,
        openai_error(VLLM_AT_LEAST, type="BadRequestError", code=400, param="input_tokens"),
        "vllm",
        32768,
        30721,
        2048,
    ),
    "vllm-without-at-least": Case(
        400,
        openai_error(VLLM_NO_AT_LEAST, type="BadRequestError", code=400),
        "vllm",
        32768,
        30721,
        2048,
    ),
    "vllm-renderer-tokens": Case(
        400,
        openai_error(VLLM_RENDERER, type="BadRequestError", code=400),
        "vllm",
        32768,
        40000,
        1024,
    ),
    "vllm-renderer-characters-not-a-token-count": Case(
        400,
        openai_error(VLLM_RENDERER_CHARS, type="BadRequestError", code=400, param="input_text"),
        "vllm",
        32768,
        None,
        1024,
    ),
    "vllm-input-length-parenthesised": Case(
        400,
        openai_error(
            "Input length (66,001) exceeds model's maximum context length (65,536).",
            type="BadRequestError",
            code=400,
        ),
        "vllm",
        65536,
        66001,
        None,
    ),
    "llama.cpp-structured": Case(
        400,
        openai_error(
            LLAMA_CPP,
            type="exceed_context_size_error",
            code=400,
            n_prompt_tokens=9000,
            n_ctx=8192,
        ),
        "llama.cpp",
        8192,
        9000,
        None,
    ),
    "llama.cpp-fields-beat-text": Case(
        400,
        openai_error(
            "request (1 tokens) exceeds the available context size (2 tokens), try increasing it",
            type="exceed_context_size_error",
            code=400,
            n_prompt_tokens=5000,
            n_ctx=4096,
        ),
        "llama.cpp",
        4096,
        5000,
        None,
    ),
    "llama.cpp-text-only": Case(
        400, openai_error(LLAMA_CPP, type="invalid_request_error"), "llama.cpp", 8192, 9000, None
    ),
    "llama.cpp-before-counts": Case(
        400,
        openai_error(LLAMA_CPP_OLD, type="invalid_request_error", code=400),
        "llama.cpp",
        None,
        None,
        None,
    ),
    "sglang-input-longer": Case(400, top_level_error(SGLANG_INPUT), "sglang", 32768, 40960, None),
    "sglang-requested-total": Case(
        400, top_level_error(SGLANG_REQUESTED), "sglang", 131072, 130000, 5000
    ),
    "tgi-total": Case(
        422,
        json.dumps({"error": TGI_TOTAL, "error_type": "validation"}).encode(),
        "tgi",
        4096,
        4000,
        200,
    ),
    "tgi-inputs-only": Case(
        422,
        json.dumps({"error": TGI_INPUTS, "error_type": "validation"}).encode(),
        "tgi",
        4095,
        5120,
        None,
    ),
    "mistral": Case(
        400,
        top_level_error(MISTRAL, type="invalid_request_invalid_args", code="3051"),
        "mistral",
        32768,
        40123,
        None,
    ),
    "deepseek": Case(
        400, openai_error(DEEPSEEK, code="invalid_request_error"), "deepseek", 65536, 77824, 4096
    ),
    "groq-code-only": Case(
        400, openai_error(GROQ, code="context_length_exceeded"), "groq", None, None, None
    ),
    "openrouter-text-input": Case(
        400,
        json.dumps(
            {"error": {"message": OPENROUTER, "code": 400, "metadata": {"provider_name": "Chutes"}}}
        ).encode(),
        "openrouter",
        131072,
        10535,
        131072,
    ),
    "openrouter-text-and-tool-input": Case(
        400,
        json.dumps({"error": {"message": OPENROUTER_TOOLS, "code": 400}}).encode(),
        "openrouter",
        200000,
        199000,
        16000,
    ),
    "lmstudio-keep-first": Case(
        400, json.dumps({"error": LMSTUDIO_KEEP}).encode(), "lmstudio", 4096, 6524, None
    ),
    "lmstudio-n-keep": Case(
        400, json.dumps({"error": LMSTUDIO_NKEEP}).encode(), "lmstudio", 16384, 18339, None
    ),
    "ollama-no-numbers": Case(
        400, json.dumps({"error": OLLAMA_PLAIN}).encode(), "ollama", None, None, None
    ),
    "ollama-mlx": Case(400, json.dumps({"error": OLLAMA_MLX}).encode(), "ollama", 8192, 9000, None),
    "ollama-cloud-exceeded-by": Case(
        400, openai_error(OLLAMA_CLOUD_BY), "ollama", None, None, None
    ),
    "ollama-cloud-prompt-too-long": Case(
        400, openai_error(OLLAMA_CLOUD_PROMPT), "ollama", 131072, 140000, None
    ),
    "gemini-native": Case(
        400,
        json.dumps(
            {"error": {"code": 400, "message": GEMINI, "status": "INVALID_ARGUMENT"}}
        ).encode(),
        "gemini",
        1048576,
        1200000,
        None,
    ),
    "gemini-openai-route-array": Case(
        400,
        json.dumps(
            [{"error": {"code": 400, "message": GEMINI, "status": "INVALID_ARGUMENT"}}]
        ).encode(),
        "gemini",
        1048576,
        1200000,
        None,
    ),
    "anthropic-prompt-too-long": Case(
        400,
        json.dumps(
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": ANTHROPIC_PROMPT},
            }
        ).encode(),
        "anthropic",
        200000,
        213462,
        None,
    ),
    "anthropic-context-limit": Case(
        400,
        json.dumps(
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": ANTHROPIC_LIMIT},
            }
        ).encode(),
        "anthropic",
        200000,
        190000,
        32000,
    ),
    "litellm-wrapped": Case(
        400, openai_error(LITELLM, type=None, code="400"), "litellm", 8192, 9013, None
    ),
    "litellm-mid-stream-503": Case(
        503,
        openai_error(
            "litellm.MidStreamFallbackError: litellm.APIConnectionError: APIConnectionError: "
            "OpenAIException - " + SGLANG_REQUESTED,
            type=None,
            code="503",
        ),
        "litellm",
        131072,
        130000,
        5000,
    ),
    "plain-text-body": Case(400, OPENAI_MESSAGES.encode(), "openai", 8192, 9013, None),
    "thousands-separators": Case(
        400,
        openai_error(
            "This model's maximum context length is 1,048,576 tokens. However, your messages "
            "resulted in 1,100,000 tokens.",
            code="context_length_exceeded",
        ),
        "openai",
        1048576,
        1100000,
        None,
    ),
    "code-only-unknown-wording": Case(
        400,
        openai_error("Request rejected.", code="context_length_exceeded"),
        "generic",
        None,
        None,
        None,
    ),
    "generic-wording-413": Case(
        413,
        json.dumps({"detail": "Context length exceeded for this model."}).encode(),
        "generic",
        None,
        None,
        None,
    ),
    "bedrock-style-wording": Case(
        400,
        json.dumps({"message": "Input is too long for requested model."}).encode(),
        "generic",
        None,
        None,
        None,
    ),
    "openrouter-raw-upstream": Case(
        400,
        json.dumps(
            {
                "error": {
                    "message": "Provider returned error",
                    "code": 400,
                    "metadata": {
                        "provider_name": "Anthropic",
                        "raw": json.dumps({"error": ANTHROPIC_PROMPT}),
                    },
                }
            }
        ).encode(),
        "openrouter",
        200000,
        213462,
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_recognised_refusals(case: Case) -> None:
    found = detect_overflow(case.status, case.body)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens, found.output_tokens) == (
        case.family,
        case.window,
        case.prompt,
        case.output,
    )
    assert found.message
    assert len(found.message) <= 500


def test_message_is_the_servers_text() -> None:
    found = detect_overflow(400, openai_error(OPENAI_MESSAGES, code="context_length_exceeded"))
    assert found == Overflow("openai", 8192, 9013, None, OPENAI_MESSAGES)


def test_long_message_is_truncated_to_500_chars() -> None:
    message = OPENAI_MESSAGES + " " + "x" * 2000
    found = detect_overflow(400, openai_error(message, code="context_length_exceeded"))
    assert found is not None
    assert found.message == message[:500]


def test_integer_code_context_length_exceeded_is_not_special() -> None:
    # An int code (vLLM's 400) must not be confused with the string marker.
    assert detect_overflow(400, openai_error("Bad request", code=400)) is None


# --- content encodings -----------------------------------------------------------------------

VLLM_BODY = openai_error(VLLM_REQUEST_HAS, type="BadRequestError", code=400)


def _deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(VLLM_BODY)),
        ("x-gzip", gzip.compress(VLLM_BODY)),
        ("GZIP", gzip.compress(VLLM_BODY)),
        ("deflate", zlib.compress(VLLM_BODY)),
        ("deflate", _deflate_raw(VLLM_BODY)),
        ("identity", VLLM_BODY),
        ("", VLLM_BODY),
        ("gzip, deflate", zlib.compress(gzip.compress(VLLM_BODY))),
    ],
    ids=[
        "gzip",
        "x-gzip",
        "upper-case",
        "deflate-zlib",
        "deflate-raw",
        "identity",
        "empty",
        "stacked",
    ],
)
def test_compressed_bodies_are_read(encoding: str, body: bytes) -> None:
    found = detect_overflow(400, body, encoding)
    assert found is not None
    assert (found.family, found.window, found.prompt_tokens) == ("vllm", 16384, 17020)


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("br", VLLM_BODY),
        ("zstd", VLLM_BODY),
        ("gzip", VLLM_BODY),
        ("deflate", b"\x00\x01garbage\xff"),
        ("gzip", gzip.compress(VLLM_BODY)[:-12]),
        (None, gzip.compress(VLLM_BODY)),
    ],
    ids=[
        "brotli",
        "zstd",
        "gzip-label-plain-body",
        "deflate-garbage",
        "gzip-truncated",
        "gzip-unlabelled",
    ],
)
def test_unreadable_encodings_are_not_overflow(encoding: str | None, body: bytes) -> None:
    assert detect_overflow(400, body, encoding) is None


def test_inflation_is_bounded() -> None:
    padded = openai_error(
        OPENAI_MESSAGES + " " * (MAX_INFLATED + 10), code="context_length_exceeded"
    )
    bomb = gzip.compress(padded)
    assert len(bomb) <= MAX_ERROR_BODY  # small on the wire, too large once inflated
    assert detect_overflow(400, bomb, "gzip") is None


def test_inflation_within_bound_is_read() -> None:
    padded = openai_error(
        OPENAI_MESSAGES + " " * (MAX_INFLATED // 2), code="context_length_exceeded"
    )
    found = detect_overflow(400, gzip.compress(padded), "gzip")
    assert found is not None
    assert found.window == 8192


# --- what must not match ---------------------------------------------------------------------

NOT_OVERFLOW: dict[str, tuple[int, bytes]] = {
    "invalid-json-request": (
        400,
        openai_error(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
            "using your HTTP library correctly.)"
        ),
    ),
    "unknown-parameter": (
        400,
        openai_error("Unrecognized request argument supplied: foo", code="unknown_parameter"),
    ),
    "content-policy": (
        400,
        openai_error(
            "Your request was rejected as a result of our safety system.",
            code="content_policy_violation",
        ),
    ),
    "openai-max-tokens-cap": (
        400,
        openai_error(
            "max_tokens is too large: 100000. This model supports at most 16384 completion tokens, "
            "whereas you provided 100000.",
            param="max_tokens",
            code="invalid_value",
        ),
    ),
    "rate-limit-tpm-429": (
        429,
        openai_error(
            "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit "
            "30000, Used 29500, Requested 1200. Please try again in 1.4s.",
            type="tokens",
            code="rate_limit_exceeded",
        ),
    ),
    "request-too-large-tpm-429": (
        429,
        openai_error(
            "Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit "
            "30000, Requested 45000. The input or output tokens must be reduced in order to run "
            "successfully.",
            type="tokens",
            code="rate_limit_exceeded",
        ),
    ),
    "request-too-large-tpm-413": (
        413,
        openai_error(
            "Request too large for model `llama-3.3-70b-versatile` in organization `org_1` on "
            "tokens per minute (TPM): Limit 6000, Requested 9000, please reduce your message size "
            "and try again.",
            type="tokens",
            code="rate_limit_exceeded",
        ),
    ),
    "overflow-text-on-429": (429, openai_error(OPENAI_MESSAGES, code="context_length_exceeded")),
    "overflow-text-on-401": (401, openai_error(OPENAI_MESSAGES)),
    "overflow-text-on-403": (403, openai_error(OPENAI_MESSAGES)),
    "overflow-text-on-404": (404, openai_error(OPENAI_MESSAGES)),
    "overflow-text-on-200": (200, openai_error(OPENAI_MESSAGES)),
    "code-only-on-500": (500, openai_error("Internal error", code="context_length_exceeded")),
    "llama.cpp-kv-pool-500": (
        500,
        openai_error("Context size has been exceeded.", type="server_error", code=500),
    ),
    "lmstudio-mlx-context-size": (
        400,
        json.dumps({"error": "Context size has been exceeded."}).encode(),
    ),
    "litellm-wrapped-kv-pool-500": (
        500,
        openai_error(
            "litellm.ContextWindowExceededError: litellm.APIError: OpenAIException - Context size "
            "has been exceeded.",
            type=None,
            code="500",
        ),
    ),
    "tpm-message-that-mentions-the-window": (
        400,
        openai_error(
            "Request too large on tokens per min (TPM): Limit 30000, Requested 140000; this also "
            "exceeds the context window.",
            code="rate_limit_exceeded",
        ),
    ),
    "groq-sentence-without-code": (400, openai_error(GROQ)),
    "model-not-found-400": (
        400,
        top_level_error("The model `gpt-5` does not exist.", type="NotFoundError", code=404),
    ),
    "html-413": (413, b"<html><head><title>413 Request Entity Too Large</title></head></html>"),
    "empty-body": (400, b""),
    "json-null": (400, b"null"),
    "json-without-message": (400, b'{"error": {"code": "context_window"}}'),
    "truncated-json": (400, openai_error(OPENAI_MESSAGES, code="context_length_exceeded")[:80]),
    "garbage-bytes": (400, b"\xff\xfe\x00\x81\x92not text\xc3"),
    "litellm-rate-limit": (
        500,
        openai_error(
            "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached on "
            "tokens per min",
            type=None,
            code="429",
        ),
    ),
}


@pytest.mark.parametrize(("status", "body"), list(NOT_OVERFLOW.values()), ids=list(NOT_OVERFLOW))
def test_other_errors_are_not_overflow(status: int, body: bytes) -> None:
    assert detect_overflow(status, body) is None


def test_oversize_body_is_not_inspected() -> None:
    message = OPENAI_MESSAGES + " " * MAX_ERROR_BODY
    body = openai_error(message, code="context_length_exceeded")
    assert len(body) > MAX_ERROR_BODY
    assert detect_overflow(400, body) is None
    # The same refusal just under the limit is read, so the size is what made the difference.
    fitting = openai_error(OPENAI_MESSAGES + " " * 1000, code="context_length_exceeded")
    assert detect_overflow(400, fitting) is not None
