"""Recognise an upstream's refusal of a prompt that does not fit its context window.

The proxy compacts a request and retries only when the upstream said, in so many words, that
the prompt (or prompt plus reserved completion) is longer than the model's window. Every
OpenAI-compatible server words that differently and wraps it in a different JSON shape, so this
module normalises the refusal into one `Overflow` value and reads whatever numbers it states.

It is deliberately conservative: a false positive makes the proxy rewrite and resend a request
that failed for another reason (a bad parameter, a rate limit, a crashed decoder), which hides
the real error from the client. So a refusal counts only when a known phrase or an explicit
error code says "too long"; statuses that mean something else (auth, not found, rate limit) are
never inspected; and a body we cannot fully read (compressed oddly, cut short, too large) is
treated as "not an overflow".

Pure: no I/O, no HTTP library, so the retry logic can be tested with bytes alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from compaction_proxy.wire import RefusalText

from ._codings import decode_content

#: Error bodies longer than this (as received) are not inspected: real refusals are a few
#: hundred bytes, and scanning megabytes on every failed request is not worth it.
MAX_ERROR_BODY: int = 65_536

#: A compressed error body may inflate to at most this many bytes; beyond it we give up instead
#: of letting a small hostile body expand without bound.
MAX_INFLATED: int = 1 << 20

#: `Overflow.message` keeps this many characters: enough for logs, bounded for headers/metrics.
MESSAGE_LIMIT: int = 500


@dataclass(frozen=True, slots=True)
class Overflow:
    """A refusal because the prompt (or prompt plus completion budget) exceeds the window.

    Numbers are in the upstream's own tokens, which need not match the proxy's tokenizer; each
    is None when the refusal does not state it. `prompt_tokens` can be a lower bound
    (`prompt_is_floor`): newer vLLM stops tokenizing once the prompt is known to be too long
    and says "at least", or, in its renderer's wording, states the count where it stopped
    (one past the longest prompt that fits: window - output + 1).
    """

    family: str
    window: int | None
    prompt_tokens: int | None
    output_tokens: int | None
    message: str

    @property
    def prompt_is_floor(self) -> bool:
        """Whether `prompt_tokens` is where the upstream stopped counting, not the count."""
        if "at least" in self.message.lower():
            return True
        window, prompt, output = self.window, self.prompt_tokens, self.output_tokens
        return (
            window is not None
            and prompt is not None
            and output is not None
            and prompt == window - output + 1
        )


# Statuses whose meaning is settled regardless of the body: an auth failure, a missing model or
# a rate limit (whose text often mentions "tokens") must never trigger a compact-and-retry.
_NEVER_OVERFLOW = frozenset({401, 403, 404, 429})

# Statuses on which an explicit error code alone (no wording) is trusted.
_REQUEST_REJECTED = frozenset({400, 413, 422})

# Anthropic's 413 names no count ("Request exceeds the maximum allowed number of bytes."): its
# error type is the signal. Compacting makes the request smaller, which is what it asks for.
_TOO_LARGE_TYPE = "request_too_large"

# A count, with optional thousands separators ("1,048,576"). Bounded so a pathological digit
# run cannot turn into a huge int.
_N = r"(\d{1,3}(?:,\d{3}){1,4}(?!\d)(?!,\d)|\d{1,12}(?!\d)(?!,\d))"


def _rx(pattern: str) -> re.Pattern[str]:
    # `#` stands for a count so the phrase tables below stay readable.
    return re.compile(pattern.replace("#", _N), re.IGNORECASE)


# Number readers: each is anchored on the wording that names the number, never on the number's
# position, because the order differs between servers and even between versions of one server.
# Groups are named w (window), p (prompt tokens), m (output tokens). The first reader that
# yields a field wins, so more specific phrases come first.
_READERS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (_rx(pattern), fields)
    for pattern, fields in (
        # llama.cpp (also carried in structured fields, which take precedence).
        (r"request \(# tokens\) exceeds the available context size \(# tokens\)", ("p", "w")),
        # SGLang (and hosts running it).
        (
            r"the input \(# tokens\) is longer than the model's context length \(# tokens\)",
            ("p", "w"),
        ),
        (r"# tokens from the input messages and # tokens for the completion", ("p", "m")),
        (r"maximum context length of # tokens", ("w",)),
        # TGI.
        (r"must be <= #\. Given: # `inputs` tokens and # `max_new_tokens`", ("w", "p", "m")),
        (r"`inputs` must have less than # tokens\. Given: #", ("w", "p")),
        # Mistral.
        (
            r"prompt contains # tokens(?: and # draft tokens)?, too large for model with # maximum",
            ("p", "", "w"),
        ),
        # LM Studio.
        (r"n_keep: ?# ?>= ?n_ctx: ?#", ("p", "w")),
        (r"trying to keep the first # tokens", ("p",)),
        (r"loaded with context length of only # tokens", ("w",)),
        # Gemini (the counts are sometimes left out).
        (r"input token count \(#\) exceeds the maximum number of tokens allowed \(#\)", ("p", "w")),
        (r"exceeds the maximum number of tokens allowed \(#\)", ("w",)),
        # Anthropic.
        (r"prompt is too long: # tokens > # maximum", ("p", "w")),
        (r"exceed context limit: # \+ # > #", ("p", "m", "w")),
        # Ollama (MLX runner, cloud) and vLLM's renderer wording without the word "tokens".
        (
            r"input length \(#(?: tokens)?\) exceeds (?:the )?model's maximum context length "
            r"\(#(?: tokens)?\)",
            ("p", "w"),
        ),
        (r"the prompt is too long: #, model maximum context length: #", ("p", "w")),
        # Azure's newer models.
        (r"exceed the configured limit of # tokens", ("w",)),
        # vLLM, newest first. "at least": the prompt count is a floor.
        (
            r"requested # output tokens and your prompt contains (?:at least )?# input tokens",
            ("m", "p"),
        ),
        (r"you passed # input tokens and requested # output tokens", ("p", "m")),
        (r"you passed # input characters and requested # output tokens", ("", "m")),
        (r"the model's context length is only # tokens", ("w",)),
        (
            r"is too large: #\. This model's maximum context length is # tokens "
            r"and your request has # input tokens",
            ("m", "w", "p"),
        ),
        (r"your request has # input tokens", ("p",)),
        (r"requested # tokens in the messages", ("p",)),
        # OpenAI chat wording, shared by Azure, DeepSeek and older vLLM.
        (r"requested # tokens \(# in the messages, # in the completion\)", ("", "p", "m")),
        (r"requested # tokens \(# in your prompt; # for the completion\)", ("", "p", "m")),
        (r"resulted in # tokens", ("p",)),
        (r"maximum context length is # tokens", ("w",)),
    )
)

# OpenRouter itemises the prompt: "(10535 of text input, 2000 of tool input, 4096 in the output)".
_OPENROUTER_PARTS = re.compile(r"requested about [\d,]+ tokens \(([^)]*)\)", re.IGNORECASE)
_OPENROUTER_INPUT = _rx(r"# of [a-z ]*input")
_OPENROUTER_OUTPUT = _rx(r"# in the output")

# Family signatures on the message text, most specific first. A message matching none of these
# is not an overflow unless an explicit error code says so.
_SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (family, re.compile(pattern, re.IGNORECASE))
    for family, pattern in (
        ("llama.cpp", r"exceeds the available context size"),
        ("tgi", r"`max_new_tokens` must be <=|`inputs` must have less than \d"),
        (
            "lmstudio",
            r"loaded with context length of only|when context the overflows|"
            r"n_keep: ?\d+ ?>= ?n_ctx",
        ),
        ("mistral", r"too large for model with [\d,]+ maximum context length"),
        (
            "sglang",
            r"is longer than the model's context length|"
            r"requested token count exceeds the model's maximum context length",
        ),
        ("gemini", r"input token count.{0,24} exceeds the maximum number of tokens allowed"),
        ("anthropic", r"prompt is too long: [\d,]+ tokens > [\d,]+ maximum|exceed context limit:"),
        ("azure", r"input tokens exceed the configured limit of [\d,]+ tokens"),
        ("openrouter", r"this endpoint's maximum context length is"),
        (
            "ollama",
            r"the input length exceeds the context length|"
            r"input length \([\d,]+ tokens\) exceeds the model's maximum context length|"
            r"prompt too long; exceeded max context length|"
            r"the prompt is too long: [\d,]+, model maximum context length",
        ),
        (
            "vllm",
            r"'max_completion_tokens' is too large: [\d,]+\. this model's maximum context length|"
            r"your request has [\d,]+ input tokens|"
            r"your prompt contains (?:at least )?[\d,]+ input tokens|"
            r"the model's context length is only [\d,]+ tokens|"
            r"requested [\d,]+ tokens in the messages|"
            r"input length \([\d,]+\) exceeds model's maximum context length",
        ),
        (
            "openai",
            r"this model's maximum context length is [\d,]+ tokens|"
            r"your input exceeds the context window of this model",
        ),
        (
            "generic",
            r"context[ _-](?:length|window)[ _-]exceeded|"
            r"exceeds? (?:the )?(?:model's )?(?:maximum )?context (?:length|window)|"
            r"longer than the (?:model's )?(?:maximum )?context (?:length|window)|"
            r"input is too long for (?:the )?requested model|"
            r"maximum context length is [\d,]+ tokens",
        ),
    )
)

# llama.cpp answers 500 with this when the shared KV cache fills during decoding: the prompt
# itself fitted, so compacting would not help (LM Studio's MLX engine reuses the words, with
# no numbers to go on). Never an overflow.
_KV_POOL_FULL = re.compile(r"context size has been exceeded", re.IGNORECASE)

# Rate limits are counted in tokens too ("tokens per min (TPM)"); whatever the status, such a
# message is about throughput, not the window.
_RATE_LIMIT = re.compile(r"tokens per min|\bTPM\b|rate[ _]?limit", re.IGNORECASE)

# LiteLLM's own classification of an upstream error, which it only assigns after matching the
# upstream's wording against its list of overflow phrases.
_LITELLM_OVERFLOW = re.compile(r"ContextWindowExceededError")
_LITELLM_PREFIX = re.compile(r"^\s*litellm\.\w+", re.IGNORECASE)

# Groq's whole message; too vague on its own, trusted only next to the explicit error code.
_GROQ = re.compile(r"^\s*please reduce the length of the messages or completion", re.IGNORECASE)


@dataclass(slots=True)
class _Refusal:
    """What an error body says, independent of which JSON shape carried it."""

    message: str
    code: str = ""
    type: str = ""
    vllm_shape: bool = False
    openrouter: bool = False
    extra_text: str = ""
    n_ctx: int | None = None
    n_prompt_tokens: int | None = None


def detect_overflow(
    status: int,
    body: bytes,
    content_encoding: str | None = None,
    refusals: Sequence[RefusalText] = (),
) -> Overflow | None:
    """Return what an upstream's error response says about an over-long prompt, else None.

    `content_encoding` is the response's Content-Encoding header: the client may have asked
    for gzip and the proxy relays bodies untouched, so the refusal can arrive compressed.
    `refusals`: the request's wire format's own refusal phrases (`WireFormat.refusals`),
    read before the common ones.
    """
    if status in _NEVER_OVERFLOW or not 400 <= status < 600:
        return None
    if len(body) > MAX_ERROR_BODY:
        return None
    raw = decode_content(body, content_encoding, limit=MAX_INFLATED)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    refusal = _read_refusal(text)
    if refusal is None or _KV_POOL_FULL.search(refusal.message):
        return None
    searched = f"{refusal.message}\n{refusal.extra_text}" if refusal.extra_text else refusal.message
    explicit_code = refusal.code == "context_length_exceeded"
    if _RATE_LIMIT.search(searched) and not explicit_code:
        return None
    own = _own_refusal(refusals, refusal.message)
    if own is not None:
        return own
    family = _family(refusal, searched)
    if family is None and status == 413 and refusal.type == _TOO_LARGE_TYPE:
        family = "anthropic"
    if family is None:
        if not (status in _REQUEST_REJECTED and explicit_code):
            return None
        family = "generic"
    window, prompt, output = _numbers(searched)
    if refusal.n_ctx is not None:
        window = refusal.n_ctx
    if refusal.n_prompt_tokens is not None:
        prompt = refusal.n_prompt_tokens
    return Overflow(
        family=family,
        window=window,
        prompt_tokens=prompt,
        output_tokens=output,
        message=refusal.message.strip()[:MESSAGE_LIMIT],
    )


def _own_refusal(refusals: Sequence[RefusalText], message: str) -> Overflow | None:
    """The first of a format's own refusal phrases ``message`` matches, with the counts its
    ``prompt`` and ``window`` groups state."""
    for own in refusals:
        match = own.pattern.search(message)
        if match is None:
            continue
        counts = match.groupdict()
        return Overflow(
            family=own.family,
            window=_count(counts.get("window")),
            prompt_tokens=_count(counts.get("prompt")),
            output_tokens=None,
            message=message.strip()[:MESSAGE_LIMIT],
        )
    return None


def _count(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


def _read_refusal(text: str) -> _Refusal | None:
    stripped = text.strip()
    if not stripped:
        return None
    if stripped[0] not in "[{":
        return _Refusal(message=stripped)
    try:
        parsed: object = json.loads(stripped)
    except (ValueError, RecursionError):
        return None  # JSON cut short or malformed: the text may be partial, so do not guess
    if isinstance(parsed, list):
        # Gemini's OpenAI route wraps the error object in an array.
        parsed = next((item for item in parsed if isinstance(item, dict)), None)
    if not isinstance(parsed, dict):
        return None
    return _read_object(parsed)


def _read_object(obj: Mapping[str, object]) -> _Refusal | None:
    error = obj.get("error")
    if isinstance(error, dict):
        # OpenAI's shape, also new vLLM, llama.cpp, OpenRouter, Gemini, Anthropic, LiteLLM.
        message = error.get("message")
        if not isinstance(message, str):
            return None
        metadata = error.get("metadata")
        raw = metadata.get("raw") if isinstance(metadata, dict) else None
        return _Refusal(
            message=message,
            code=_code(error.get("code")),
            type=_str(error.get("type")),
            vllm_shape=_str(error.get("type")) == "BadRequestError",
            openrouter=isinstance(metadata, dict) and "provider_name" in metadata,
            extra_text=raw if isinstance(raw, str) else "",
            n_ctx=_positive(error.get("n_ctx")),
            n_prompt_tokens=_positive(error.get("n_prompt_tokens")),
        )
    if isinstance(error, str):
        # LM Studio, and TGI (with "error_type": "validation").
        return _Refusal(message=error, type=_str(obj.get("error_type")))
    message = obj.get("message")
    if isinstance(message, str):
        # Top-level error object: old vLLM, SGLang, Mistral.
        return _Refusal(
            message=message,
            code=_code(obj.get("code")),
            type=_str(obj.get("type")),
            vllm_shape=obj.get("object") == "error" or obj.get("type") == "BadRequestError",
        )
    detail = obj.get("detail")
    if isinstance(detail, str):
        return _Refusal(message=detail)  # FastAPI-style servers
    return None


def _family(refusal: _Refusal, searched: str) -> str | None:
    """Which server shape the refusal matches, or None when nothing says "too long"."""
    if refusal.type == "exceed_context_size_error":
        return "llama.cpp"
    matched: str | None = None
    for family, signature in _SIGNATURES:
        if signature.search(searched):
            matched = family
            break
    if _LITELLM_OVERFLOW.search(refusal.message) or (
        matched is not None and _LITELLM_PREFIX.match(refusal.message)
    ):
        return "litellm"
    if matched is None:
        # Groq states only the code and a bare "please reduce" sentence, no numbers.
        if refusal.code == "context_length_exceeded" and _GROQ.search(refusal.message):
            return "groq"
        return None
    if refusal.openrouter:
        return "openrouter"
    if matched == "openai":
        # The same sentence comes from OpenAI, DeepSeek and older vLLM; the envelope differs.
        if refusal.vllm_shape:
            return "vllm"
        if refusal.code == "invalid_request_error":
            return "deepseek"
    return matched


def _numbers(text: str) -> tuple[int | None, int | None, int | None]:
    found: dict[str, int] = {}
    for pattern, fields in _READERS:
        match = pattern.search(text)
        if match is None:
            continue
        for name, value in zip(fields, match.groups(), strict=True):
            if name and value is not None and name not in found:
                found[name] = int(value.replace(",", ""))
    parts = _OPENROUTER_PARTS.search(text)
    if parts is not None:
        inputs = [int(v.replace(",", "")) for v in _OPENROUTER_INPUT.findall(parts.group(1))]
        outputs = [int(v.replace(",", "")) for v in _OPENROUTER_OUTPUT.findall(parts.group(1))]
        if inputs:
            found.setdefault("p", sum(inputs))
        if outputs:
            found.setdefault("m", outputs[0])
    window = found.get("w")
    prompt = found.get("p")
    return (
        window if window else None,
        prompt if prompt else None,
        found.get("m"),
    )


def _code(value: object) -> str:
    """Error codes are strings for some servers and ints (400) for others."""
    if isinstance(value, bool):
        return ""
    if isinstance(value, str | int):
        return str(value).strip().lower()
    return ""


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
