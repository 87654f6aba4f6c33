"""Error answers: Anthropic's shape, and the overflow refusals of the servers that serve
``/v1/messages``, each in that server's own words and shape.

``refusal_style`` picks one; P is the prompt's tokens, M the request's ``max_tokens``, W the
window:

- ``anthropic``: 400 ``invalid_request_error`` "prompt is too long: P tokens > W maximum" when
  P > W. With ``count_output`` also "input length and `max_tokens` exceed context limit: P + M >
  W, decrease input length or `max_tokens` and try again" when P + M > W (the API's other
  wording, which Claude Code tells apart from the first).
- ``llamacpp``: llama-server answers ``/v1/messages`` errors in its OpenAI-like shape, 400
  ``exceed_context_size_error`` with ``n_prompt_tokens`` and ``n_ctx``, when P >= W (it checks
  the prompt alone against the slot's context and caps generation instead).
- ``vllm``: vLLM's Messages router wraps its engine error in Anthropic's shape with type
  ``BadRequestError``; its renderer refuses P > W - M as "You passed P input tokens and requested
  M output tokens. However, the model's context length is only W tokens, resulting in a maximum
  input length of W-M tokens. ... (parameter=input_tokens, value=P)", where P is a floor
  (tokenizing stops at W-M+1). M > W is refused too (in words of the fake's own).
- ``vllm_old``: older vLLM wording in the same wrapper, "This model's maximum context length is
  W tokens. However, you requested P+M tokens (P in the messages, M in the completion). ..."
- ``413``: a size limit in front of the model answers 413 with Anthropic's ``request_too_large``
  error (no token numbers), when P > W.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from starlette.responses import Response

REFUSAL_STYLES = ("anthropic", "llamacpp", "vllm", "vllm_old", "413")

_ids = itertools.count(1)


def request_id() -> str:
    return f"req_fake{next(_ids):08d}"


def error_response(status: int, type_: str, message: str) -> Response:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}`` as the API sends it."""
    rid = request_id()
    body = {"type": "error", "error": {"type": type_, "message": message}, "request_id": rid}
    return Response(
        orjson.dumps(body),
        status_code=status,
        media_type="application/json",
        headers={"request-id": rid},
    )


def invalid_request(message: str) -> Response:
    return error_response(400, "invalid_request_error", message)


STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def status_error(status: int, message: str | None = None) -> Response:
    """What ``X-Fake-Status: N`` answers: that status with the API's error type for it."""
    type_ = STATUS_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return error_response(status, type_, message or f"fake upstream error: status {status}")


def overflow(style: str, window: int, prompt: int, max_tokens: int, count_output: bool) -> Any:
    """The refusal of ``style`` when the request does not fit ``window``; None when it fits."""
    if style == "anthropic":
        if prompt > window:
            return invalid_request(f"prompt is too long: {prompt} tokens > {window} maximum")
        if count_output and prompt + max_tokens > window:
            return invalid_request(
                f"input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > "
                f"{window}, decrease input length or `max_tokens` and try again"
            )
        return None
    if style == "llamacpp":
        if prompt < window:
            return None
        body = {
            "error": {
                "code": 400,
                "message": f"request ({prompt} tokens) exceeds the available context size "
                f"({window} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": window,
            }
        }
        return Response(orjson.dumps(body), status_code=400, media_type="application/json")
    if style in ("vllm", "vllm_old"):
        return _vllm(style, window, prompt, max_tokens)
    if style == "413":
        if prompt <= window:
            return None
        return error_response(
            413, "request_too_large", "Request exceeds the maximum allowed number of bytes."
        )
    raise ValueError(f"unknown refusal style {style!r}")


def _vllm(style: str, window: int, prompt: int, max_tokens: int) -> Response | None:
    if max_tokens > window:
        message = (
            f"max_tokens={max_tokens} cannot be greater than max_model_len={window}. "
            "Please request fewer output tokens."
        )
    elif prompt > window - max_tokens:
        limit = window - max_tokens
        if style == "vllm":
            seen = min(prompt, limit + 1)
            message = (
                f"You passed {seen} input tokens and requested {max_tokens} output tokens. "
                f"However, the model's context length is only {window} tokens, resulting in a "
                f"maximum input length of {limit} tokens. Please reduce the length of the input "
                f"prompt. (parameter=input_tokens, value={seen})"
            )
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {prompt + max_tokens} tokens ({prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion."
            )
    else:
        return None
    body = {"type": "error", "error": {"type": "BadRequestError", "message": message}}
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")
