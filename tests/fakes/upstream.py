"""A fake OpenAI-compatible upstream that records what it receives.

It is a real HTTP server (Starlette under uvicorn) rather than a mock, because the proxy's
behaviour we care about lives on the wire: bytes forwarded unchanged, SSE chunks flushed as they
arrive, disconnects propagated, hop-by-hop headers dropped. The same app is the benchmark's
upstream, so the chat hot path stays small: one orjson parse, a cached token count, one dump,
no logging.

Chat replies report ``usage.prompt_tokens_details.cached_tokens`` from a simple prompt cache
(:class:`PrefixCache`): the leading messages (and tools) an earlier prompt started with count as
cached, so a test can see a summary call that reuses the request's prefix hit the cache.

Run it on its own::

    python -m tests.fakes.upstream --host 127.0.0.1 --port 8001 [--context-window 8192]

or build it in-process with :func:`create_app`.

Per-request behaviour is steered by request headers, which pass through the proxy untouched:

- ``X-Fake-Status: 429`` answers with that status and an OpenAI error body
  (``X-Fake-Error-Message`` overrides the message);
- ``X-Fake-Delay-Ms: 250`` waits before sending the response headers;
- ``X-Fake-Hang: 1`` never answers (it records an event when the caller gives up);
- ``X-Fake-Chunks: N`` / ``X-Fake-Chunk-Delay-Ms: M`` stream N content chunks M ms apart, each
  carrying its server-side send time as ``t=<unix ms>;`` so a test can compare send and receive;
- ``X-Fake-Response-Bytes: N`` makes the catch-all route answer with N bytes of a fixed pattern;
  ``X-Fake-Chunks`` on the catch-all route streams N stamped SSE events (Responses-API style);
- ``X-Fake-Tag: anything`` labels the events this request produces;
- ``X-Fake-Cut-After: N`` breaks the reply off: a stream stops after N events, a JSON reply after
  N bytes of its declared length, and the connection closes without a proper end (a
  ``stream_cut`` event is recorded);
- ``X-Fake-Body: html`` answers with an HTML page instead of JSON (status ``X-Fake-Status``,
  default 200), as a misconfigured gateway or a captive portal would.

``summarizer`` (``POST /_control``) picks how summarizer calls are answered: ``ok`` (the FACT
listing of :func:`summarizer_responder`), ``prose`` (:data:`PROSE_SUMMARY`: plausible prose that
copies no exact string it was shown, as a real model's summary often does), or a failure
(``error``, ``hang``, ``empty``, ``oversized``).

``summarizer_hold`` (``POST /_control``) holds every summarizer call until it is set false
again, so a test can tell whether a request waited for one without timing it.

``api_keys`` (``POST /_control``) makes the API routes check keys as a provider does: a request
whose ``Authorization`` is not ``Bearer <one of them>`` gets a 401 ``invalid_api_key`` (None,
the default: every key, and none, is accepted).

A context window (``--context-window``, or ``context_window`` / ``model_context_windows``
through ``POST /_control``) makes chat requests whose prompt plus ``max_tokens`` exceed it fail
with a 400 before any byte of a stream, worded by ``refusal_style`` as that server family
words it: ``openai``, ``vllm`` (<= 0.10.0, top-level error object), ``vllm_new`` (>= 0.10.1,
"at least" wording), ``llamacpp`` (``exceed_context_size_error`` with ``n_ctx``) or ``groq``
(``context_length_exceeded`` with no numbers at all). ``publish_windows`` makes
``GET /v1/models`` state the windows in one server's field: ``none``, ``vllm``
(``max_model_len``), ``openrouter`` (``context_length``) or ``lmstudio`` (the loaded
instance's ``context_length``). ``token_scale`` makes the fake count prompts as a model with
another tokenizer would (1.63: every prompt 63 % longer than the proxy's count), in the window
check, the refusal and ``usage``. Every refusal over the window records a ``refused`` event
(``summarizer``: whether it refused a summary call).

Test-only routes: ``GET|DELETE /_requests``, ``GET|DELETE /_events``, ``GET|POST /_control``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import inspect
import itertools
import math
import os
import re
import struct
import tempfile
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.fakes.recall_policy import QUESTION, RECALL_TOOL, Answer, decide

DEFAULT_MODELS: tuple[str, ...] = ("gpt-4o", "gpt-4o-mini", "fake-model", "text-embedding-3-small")
EMBEDDING_DIMENSIONS = 8
ECHO_LIMIT = 200
RESPONSE_PATTERN = b"0123456789abcdef"
_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_JSON = "application/json"
HTML_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>Bad Gateway</h1><p>The upstream is taking a nap.</p></body></html>\n"
)


# --------------------------------------------------------------------------- token counting


class TokenCounter:
    """Counts prompt tokens close to how OpenAI bills them, cheaply.

    tiktoken is used only when the o200k_base file is already in its local cache: the fake must
    never reach for the network (tests run offline), so otherwise it falls back to 4 characters a
    token. Counts are cached per string because clients resend the same history every turn.
    """

    _CACHE_LIMIT = 16_384
    _EXACT_LIMIT = 200_000  # longer strings (base64 images...) are estimated, not encoded

    def __init__(self) -> None:
        self._encode = _load_o200k()
        self._cache: dict[str, int] = {}

    @property
    def exact(self) -> bool:
        """True when counts come from tiktoken rather than the character estimate."""
        return self._encode is not None

    def text(self, value: str) -> int:
        cached = self._cache.get(value)
        if cached is not None:
            return cached
        if self._encode is not None and len(value) <= self._EXACT_LIMIT:
            count = len(self._encode(value))
        else:
            count = (len(value) + 3) // 4
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[value] = count
        return count

    def messages(self, messages: Sequence[Any], tools: Any = None) -> int:
        """Tokens of a chat prompt: 3 per message, its values, 1 per name, 3 for reply priming."""
        total = 3
        for message in messages:
            total += 3
            if not isinstance(message, dict):
                total += self.text(_dumps_or_repr(message))
                continue
            for key, value in message.items():
                if value is None:
                    continue
                if isinstance(value, str):
                    total += self.text(value)
                else:
                    total += self.text(_dumps_or_repr(value))
                if key == "name":
                    total += 1
        if tools:
            total += self.text(_dumps_or_repr(tools))
        return total


def _dumps_or_repr(value: Any) -> str:
    """JSON text to count; for what orjson refuses (nested past its depth limit, integers past
    64 bits) the repr, so a hostile body costs the fake a rough count rather than a 500."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _load_o200k() -> Callable[[str], list[int]] | None:
    cache_dir = (
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or os.environ.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )
    cache_key = hashlib.sha1(_O200K_URL.encode()).hexdigest()
    if not os.path.isfile(os.path.join(cache_dir, cache_key)):
        return None
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("o200k_base")
    except Exception:  # a corrupt cache file must not take the fake down
        return None
    return encoding.encode_ordinary


# --------------------------------------------------------------------------- replies


@dataclass
class ChatRequest:
    """What a responder sees: the parsed body, the request headers and the counted prompt."""

    body: dict[str, Any]
    headers: dict[str, str]
    prompt_tokens: int

    @property
    def messages(self) -> list[Any]:
        return self.body.get("messages") or []

    @property
    def model(self) -> str:
        model = self.body.get("model")
        return model if isinstance(model, str) else ""


@dataclass
class ChatReply:
    """The assistant turn a responder decided on; the server renders it as JSON or SSE."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    completion_tokens: int | None = None


# A responder returns a reply, or None to let the next one decide. Later tests plug in, e.g., a
# summarizer responder in front of the defaults via ``create_app(responders=[...])``.
Responder = Callable[[ChatRequest], "ChatReply | Awaitable[ChatReply | None] | None"]


def message_text(message: Any) -> str:
    """The text of a chat message: string content, or the text parts of a content list."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None


def tool_call_responder(request: ChatRequest) -> ChatReply | None:
    """Calls every listed tool (parallel calls) when the last user message says "call tool"."""
    tools = request.body.get("tools")
    messages = request.messages
    if not tools or not isinstance(tools, list) or not messages:
        return None
    last = messages[-1]
    if _role(last) != "user" or "call tool" not in message_text(last):
        return None
    calls = []
    for index, tool in enumerate(tools):
        function = tool.get("function", {}) if isinstance(tool, dict) else {}
        name = function.get("name", f"tool_{index}") if isinstance(function, dict) else "tool"
        arguments = orjson.dumps({"index": index, "query": message_text(last)[:40]}).decode()
        calls.append(
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return ChatReply(content=None, tool_calls=calls, finish_reason="tool_calls")


def echo_responder(request: ChatRequest) -> ChatReply:
    """Echoes the last user message, or the trailing tool results after a tool call."""
    messages = request.messages
    trailing_tools: list[str] = []
    for message in reversed(messages):
        if _role(message) != "tool":
            break
        trailing_tools.append(message_text(message))
    if trailing_tools:
        text = "echo tool results: " + " | ".join(reversed(trailing_tools))
        return ChatReply(content=text[: len("echo tool results: ") + ECHO_LIMIT])
    for message in reversed(messages):
        if _role(message) == "user":
            return ChatReply(content="echo: " + message_text(message)[:ECHO_LIMIT])
    return ChatReply(content="echo: ")


FACT = re.compile(r"FACT-[A-Za-z0-9]+")


SUMMARIZER_PREFIX_MARKER = "[compaction-proxy: checkpoint request]"
"""First line of the instruction ending a prefix-form summary call
(compaction_proxy/summarizer/_prefix.py; not imported, so the fake stays independent of the
proxy)."""


def is_prefix_summarizer_call(payload: dict[str, Any]) -> bool:
    """The cache-aligned form: the chat request's own prefix, then our instruction."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return _role(last) == "user" and message_text(last).startswith(SUMMARIZER_PREFIX_MARKER)


def is_summarizer_call(payload: dict[str, Any]) -> bool:
    """The proxy's summarizer frames the conversation in <conversation> tags (transcript form)
    or ends the request's own prefix with its marked instruction (prefix form)."""
    messages = payload.get("messages")
    return isinstance(messages, list) and (
        is_prefix_summarizer_call(payload)
        or any("<conversation>" in message_text(m) for m in messages if _role(m) == "user")
    )


def summarizer_responder(request: ChatRequest) -> ChatReply | None:
    """A deterministic stand-in for the summarizer model.

    It writes a checkpoint whose Critical Context lists every `FACT-...` token it was shown,
    in the previous checkpoint or in the conversation, in first-seen order; so a test can check
    that facts survive rolling updates to the last request.
    """
    if not is_summarizer_call(request.body):
        return None
    # The transcript form carries everything in its user message; the prefix form carries the
    # conversation as itself, every role (system messages hold no facts in the tests).
    roles = ("user",) if not is_prefix_summarizer_call(request.body) else None
    text = "\n".join(
        message_text(m) for m in request.messages if roles is None or _role(m) in roles
    )
    facts = list(dict.fromkeys(FACT.findall(text)))
    summary = "## Goal\nFinish the agent task.\n\n## Critical Context\n" + "\n".join(
        f"- {fact}" for fact in facts
    )
    return ChatReply(content=summary)


PROSE_SUMMARY = (
    "## Goal\nGet the service's build and test suite back to green and keep the user's "
    "conventions while doing it.\n\n"
    "## Progress\n- Read through several modules and ran the tests; a number of them fail.\n"
    "- Looked at a few scripts and benchmark runs; some were slower than hoped.\n"
    "- Tried a couple of fixes; one build step still breaks.\n\n"
    "## Next Steps\n- Fix the remaining failures and run everything again.\n"
    "- Check the slow paths once the tests pass."
)
"""The ``prose`` summarizer's answer: a summary as a model writes one when it keeps the gist and
none of the exact strings (no path, command, number, error line or identifier): the worst case
for what a summary carries."""


def recall_responder(request: ChatRequest) -> ChatReply | None:
    """The scripted model's recall (tests/fakes/recall_policy.py) in chat completions' form."""
    messages = request.messages
    last_user = next(
        (i for i in range(len(messages) - 1, -1, -1) if _role(messages[i]) == "user"), None
    )
    if last_user is None or QUESTION.search(message_text(messages[last_user])) is None:
        return None
    tools = request.body.get("tools")
    tools = tools if isinstance(tools, list) else []
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    recall_calls: set[str] = set()
    recalled: list[str] | None = None
    for message in messages[last_user + 1 :]:
        for call in message.get("tool_calls") or () if isinstance(message, dict) else ():
            if call.get("function", {}).get("name") == RECALL_TOOL:
                recall_calls.add(call.get("id"))
        if _role(message) == "tool" and message.get("tool_call_id") in recall_calls:
            recalled = [*(recalled or []), message_text(message)]
    visible = "\n".join(
        message_text(m)
        for m in messages
        if not (_role(m) == "tool" and m.get("tool_call_id") in recall_calls)
    )
    decision = decide(
        message_text(messages[last_user]),
        visible,
        recalled,
        offered=RECALL_TOOL in names,
        may_call=request.body.get("tool_choice") != "none",
    )
    if decision is None:
        return None
    if isinstance(decision, Answer):
        return ChatReply(content=decision.text)
    calls = [
        {
            "id": f"call_rc{len(messages)}",
            "type": "function",
            "function": {"name": RECALL_TOOL, "arguments": decision.arguments},
        }
    ]
    if decision.with_client_tool:
        own = next((n for n in names if n != RECALL_TOOL), None)
        if own is not None:
            calls.append(
                {
                    "id": f"call_own{len(messages)}",
                    "type": "function",
                    "function": {"name": own, "arguments": "{}"},
                }
            )
    return ChatReply(content=None, tool_calls=calls, finish_reason="tool_calls")


FIND = re.compile(r"^FIND: (.+)$", re.S)
"""A user message ``FIND: <exact string>``: the scripted model looks for the string in its prompt
and, when it is not there and ``compaction_recall`` is offered, recalls it by a query of the
string itself; it answers ``IN PROMPT``, ``RECALLED`` or ``NOT FOUND`` (then the string)."""


def find_responder(request: ChatRequest) -> ChatReply | None:
    """The ``FIND:`` probe (see :data:`FIND`): is an exact string still reachable by the model?"""
    messages = request.messages
    last_user = next(
        (i for i in range(len(messages) - 1, -1, -1) if _role(messages[i]) == "user"), None
    )
    asked = None if last_user is None else FIND.match(message_text(messages[last_user]))
    if asked is None or last_user is None:
        return None
    wanted = asked.group(1)
    later = messages[last_user + 1 :]
    recalled = [message_text(m) for m in later if _role(m) == "tool"]
    if later:
        verdict = "RECALLED" if any(wanted in text for text in recalled) else "NOT FOUND"
        return ChatReply(content=f"{verdict}: {wanted}")
    if any(wanted in message_text(m) for m in messages[:last_user]):
        return ChatReply(content=f"IN PROMPT: {wanted}")
    tools = request.body.get("tools")
    names = [t.get("function", {}).get("name") for t in tools or () if isinstance(t, dict)]
    if RECALL_TOOL not in names:
        return ChatReply(content=f"NOT FOUND: {wanted}")
    call = {
        "id": f"call_find{len(messages)}",
        "type": "function",
        "function": {"name": RECALL_TOOL, "arguments": orjson.dumps({"query": wanted}).decode()},
    }
    return ChatReply(content=None, tool_calls=[call], finish_reason="tool_calls")


DEFAULT_RESPONDERS: tuple[Responder, ...] = (
    summarizer_responder,
    find_responder,
    recall_responder,
    tool_call_responder,
    echo_responder,
)


# --------------------------------------------------------------------------- server state


@dataclass
class Settings:
    """Server-wide knobs; the CLI sets the initial values, ``POST /_control`` changes them."""

    context_window: int | None = None
    model_context_windows: dict[str, int] = field(default_factory=dict)
    delay_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    record: bool = True
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    # How the summarizer persona answers: ok | prose | error (500) | hang | empty | oversized.
    summarizer: str = "ok"
    summarizer_delay_ms: float = 0.0
    # While true, summarizer calls wait at a gate until it is set false again (a test's way to
    # see whether a request waited for one, without a clock).
    summarizer_hold: bool = False
    # How a request over the window is refused (see the module docstring).
    refusal_style: str = "openai"
    # Which server's field `GET /v1/models` states the windows in: none | vllm | openrouter |
    # lmstudio.
    publish_windows: str = "none"
    # The keys the API routes accept (Authorization: Bearer <key>); None: any, or none.
    api_keys: list[str] | None = None
    # The model's tokenizer against the fake's count: prompt tokens are the count times this
    # (rounded up), in the window check, the refusal and `usage` alike (a local model whose
    # tokenizer is not OpenAI's: 1.63 makes every prompt 63 % longer than the proxy counts).
    token_scale: float = 1.0

    def window_for(self, model: str) -> int | None:
        return self.model_context_windows.get(model, self.context_window)


def merged_headers(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-cased header names; repeated headers joined with ", " as HTTP allows."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


@dataclass
class RecordedRequest:
    received_at: float
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def to_json(self) -> dict[str, Any]:
        headers = merged_headers(self.headers)
        try:
            text: str | None = self.body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return {
            "received_at": self.received_at,
            "method": self.method,
            "path": self.path,
            "query": self.query.decode("latin-1"),
            "headers": headers,
            "raw_headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in self.headers],
            "body_len": len(self.body),
            "body_b64": base64.b64encode(self.body).decode(),
            "body_text": text,
        }


class PrefixCache:
    """A prompt cache like OpenAI's, simplified: a prompt that starts with messages (and tools)
    an earlier prompt started with has those leading messages "cached".

    Keys chain the canonical JSON of the tools and each leading message, so one lookup per
    message finds the longest prefix seen before. Bounded: the oldest keys go first.
    """

    LIMIT = 200_000

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def keys(self, messages: Sequence[Any], tools: Any) -> list[bytes]:
        digest = hashlib.blake2b(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), digest_size=16)
        keys = []
        for message in messages:
            digest.update(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
            keys.append(digest.copy().digest())
        return keys

    def hit(self, messages: Sequence[Any], tools: Any) -> int:
        """How many leading messages were seen before; remembers this prompt's prefixes.

        A prompt orjson cannot serialise (nested past its depth limit) is simply not cached:
        a hostile body must get the upstream's ordinary answer, not a 500 from the fake.
        """
        try:
            keys = self.keys(messages, tools)
        except (TypeError, orjson.JSONEncodeError):
            return 0
        found = 0
        for index, key in enumerate(keys):
            if key in self._seen:
                found = index + 1
        for key in keys:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > self.LIMIT:
            self._seen.popitem(last=False)
        return found


class FakeUpstream:
    """Settings, recorded requests and events of one server, plus the responder chain."""

    def __init__(self, settings: Settings, responders: Sequence[Responder], max_recorded: int):
        self.initial = Settings(**asdict(settings))
        self.settings = settings
        self.responders = list(responders) + list(DEFAULT_RESPONDERS)
        self.requests: deque[RecordedRequest] = deque(maxlen=max_recorded)
        self.events: deque[dict[str, Any]] = deque(maxlen=max_recorded)
        self.counter = TokenCounter()
        self.prompt_cache = PrefixCache()
        self._ids = itertools.count(1)
        # Open unless ``summarizer_hold`` is on; summarizer calls wait here.
        self.summarizer_gate = asyncio.Event()
        self.summarizer_gate.set()

    def next_id(self) -> int:
        return next(self._ids)

    def record(self, request: Request, body: bytes) -> None:
        if self.settings.record:
            scope = request.scope
            self.requests.append(
                RecordedRequest(
                    time.time(),
                    scope["method"],
                    scope["path"],
                    scope.get("query_string", b""),
                    list(scope["headers"]),
                    body,
                )
            )

    def event(self, kind: str, request: Request, **details: Any) -> None:
        self.events.append(
            {
                "type": kind,
                "tag": request.headers.get("x-fake-tag"),
                "path": request.url.path,
                "at": time.time(),
                **details,
            }
        )

    async def respond(self, chat: ChatRequest) -> ChatReply:
        for responder in self.responders:
            reply = responder(chat)
            if inspect.isawaitable(reply):
                reply = await reply
            if reply is not None:
                return reply
        raise AssertionError("echo_responder always answers")  # pragma: no cover


# --------------------------------------------------------------------------- responses


def error_response(
    status: int, message: str, type_: str, code: str | None, param: str | None = None
) -> Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return Response(orjson.dumps(body), status_code=status, media_type=_JSON)


REFUSAL_STYLES = ("openai", "vllm", "vllm_new", "llamacpp", "groq")
PUBLISH_STYLES = ("none", "vllm", "openrouter", "lmstudio")


def refusal(style: str, window: int, prompt: int, requested: int) -> Response:
    """The 400 a server of `style` sends for a prompt over its window, as that server words it.

    `requested` is prompt plus completion tokens. The bodies follow each server's own shape
    (OpenAI's error object; vLLM's top-level one before 0.10.1; llama.cpp's extra fields).
    """
    output = requested - prompt
    if style == "vllm":
        body: dict[str, Any] = {
            "object": "error",
            "message": f"This model's maximum context length is {window} tokens. However, you "
            f"requested {requested} tokens ({prompt} in the messages, {output} in the "
            "completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    elif style == "vllm_new":
        # Newer vLLM stops tokenizing once the prompt is known to be too long: "at least".
        floor = min(prompt, window - output + 1)
        body = {
            "error": {
                "message": f"This model's maximum context length is {window} tokens. However, "
                f"you requested {output} output tokens and your prompt contains at least "
                f"{floor} input tokens, for a total of at least {floor + output} tokens. Please "
                "reduce the length of the input prompt or the number of requested output "
                f"tokens. (parameter=input_tokens, value={floor})",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        }
    elif style == "llamacpp":
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
    elif style == "groq":
        body = {
            "error": {
                "message": "Please reduce the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    else:
        # OpenAI words it two ways: with a completion limit in the request, and without.
        message = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{requested} tokens ({prompt} in the messages, {output} in the completion). Please "
            "reduce the length of the messages or completion."
            if output
            else f"This model's maximum context length is {window} tokens. However, your "
            f"messages resulted in {prompt} tokens. Please reduce the length of the messages."
        )
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    return Response(orjson.dumps(body), status_code=400, media_type=_JSON)


def published_entry(name: str, window: int | None, style: str) -> dict[str, Any]:
    """One `GET /v1/models` entry, with the window in the field `style`'s server uses."""
    entry: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "fake",
    }
    if window is None or style == "none":
        return entry
    if style == "vllm":
        entry.update(owned_by="vllm", root=name, parent=None, max_model_len=window)
    elif style == "openrouter":
        entry.update(
            name=name,
            context_length=window,
            top_provider={"context_length": window, "max_completion_tokens": None},
        )
    elif style == "lmstudio":
        # LM Studio: the model's maximum, and the (smaller) context it is loaded with.
        entry.update(
            type="llm",
            max_context_length=window * 2,
            loaded_instances=[{"id": name, "config": {"context_length": window}}],
        )
    return entry


def key_refusal(fake: FakeUpstream, request: Request) -> Response | None:
    """The 401 a provider gives a request without one of its keys (``api_keys``), or None."""
    keys = fake.settings.api_keys
    if keys is None:
        return None
    if request.headers.get("authorization", "") in {f"Bearer {key}" for key in keys}:
        return None
    fake.event("refused_key", request)
    return error_response(
        401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
    )


def _status_error(status: int, message: str | None) -> Response:
    if status == 429:
        type_, code = "requests", "rate_limit_exceeded"
    elif status == 401:
        type_, code = "invalid_request_error", "invalid_api_key"
    elif status >= 500:
        type_, code = "server_error", None
    else:
        type_, code = "invalid_request_error", None
    return error_response(status, message or f"fake upstream error: status {status}", type_, code)


def _json(payload: Any, status: int = 200, request_id: str | None = None) -> Response:
    # Like OpenAI, API answers carry the upstream's own x-request-id; a proxy must not let it
    # collide with the id it gives the client.
    headers = None if request_id is None else {"x-request-id": request_id}
    return Response(orjson.dumps(payload), status_code=status, media_type=_JSON, headers=headers)


def _cut_after(request: Request) -> int | None:
    value = _header_number(request, "x-fake-cut-after")
    return None if value is None else int(value)


def _header_number(request: Request, name: str) -> float | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


async def _wait_for_disconnect(receive: Receive) -> None:
    """Returns once the client has gone (the request body was already read by the handler)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class HangResponse:
    """Never answers; records an event when the caller hangs up (e.g. a proxy timing out)."""

    def __init__(self, fake: FakeUpstream, request: Request):
        self.fake, self.request = fake, request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _wait_for_disconnect(receive)
        self.fake.event("hang_abandoned", self.request)


class CutResponse:
    """Sends a response's headers and only the first ``cut`` bytes of its declared body, then
    returns: uvicorn closes the connection ("returned without completing response"), which is
    what a crashed or restarted upstream looks like from the other end."""

    def __init__(self, fake: FakeUpstream, request: Request, response: Response, cut: int):
        self.fake, self.request, self.response, self.cut = fake, request, response, cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.response
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response.raw_headers,
            }
        )
        await send(
            {"type": "http.response.body", "body": response.body[: self.cut], "more_body": True}
        )
        self.fake.event("stream_cut", self.request, bytes_sent=min(self.cut, len(response.body)))


class EventStreamResponse:
    """Streams SSE events one ASGI send each, and notices a client that hangs up mid-stream.

    Starlette's StreamingResponse only learns of a disconnect on its next failed send under ASGI
    2.4, so the disconnect is watched concurrently here: the producer is cancelled at once (even
    while sleeping between chunks) and a ``stream_cancelled`` event is recorded. With ``cut_after``
    the stream stops after that many events without its end, and the connection is dropped.
    """

    def __init__(
        self,
        fake: FakeUpstream,
        request: Request,
        events: AsyncIterator[bytes],
        cut_after: int | None = None,
    ):
        self.fake, self.request, self.events = fake, request, events
        self.request_id = f"req_fake{fake.next_id()}".encode()
        self.sent = 0
        self.cut_after = cut_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.ensure_future(self._produce(send))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        done, _ = await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if producer in done:
            watcher.cancel()
            if producer.exception() is not None:  # the transport failed under us
                self.fake.event("stream_cancelled", self.request, chunks_sent=self.sent)
            return
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        self.fake.event("stream_cancelled", self.request, chunks_sent=self.sent)

    async def _produce(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", self.request_id),
                ],
            }
        )
        async for event in self.events:
            if self.cut_after is not None and self.sent >= self.cut_after:
                # Returning mid-body makes uvicorn drop the connection: no final chunk.
                self.fake.event("stream_cut", self.request, chunks_sent=self.sent)
                return
            await send({"type": "http.response.body", "body": event, "more_body": True})
            self.sent += 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _split(text: str, size: int = 16) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


async def _chat_events(
    base: dict[str, Any],
    reply: ChatReply,
    usage: dict[str, Any],
    include_usage: bool,
    timed_chunks: int | None,
    chunk_delay: float,
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed completion, in OpenAI's chunk order."""
    if include_usage:
        base = {**base, "usage": None}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _sse({**base, "choices": [choice]})

    if reply.tool_calls:
        yield chunk({"role": "assistant", "content": None, "refusal": None})
        for index, call in enumerate(reply.tool_calls):
            function = call["function"]
            head = {"index": index, "id": call["id"], "type": "function"}
            yield chunk({"tool_calls": [{**head, "function": {"name": function["name"]}}]})
            for piece in _split(function["arguments"]):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    else:
        yield chunk({"role": "assistant", "content": "", "refusal": None})
        if timed_chunks is not None:
            for i in range(timed_chunks):
                if i and chunk_delay:
                    await asyncio.sleep(chunk_delay)
                yield chunk({"content": f"t={time.time() * 1000:.3f};"})
        else:
            for i, piece in enumerate(_split(reply.content or "")):
                if i and chunk_delay:
                    await asyncio.sleep(chunk_delay)
                yield chunk({"content": piece})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield _sse({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


async def _generic_events(count: int, delay: float) -> AsyncIterator[bytes]:
    """A Responses-API-like SSE stream for pass-through routes, stamped like chat chunks."""
    for i in range(count):
        if i and delay:
            await asyncio.sleep(delay)
        stamp = f"t={time.time() * 1000:.3f};"
        yield _sse({"type": "response.output_text.delta", "sequence_number": i, "delta": stamp})
    yield b"data: [DONE]\n\n"


# --------------------------------------------------------------------------- handlers


def create_app(
    *,
    context_window: int | None = None,
    model_context_windows: dict[str, int] | None = None,
    responders: Sequence[Responder] = (),
    record: bool = True,
    models: Sequence[str] = DEFAULT_MODELS,
    max_recorded: int = 10_000,
) -> Starlette:
    """Builds the fake upstream. ``app.state.fake`` is its :class:`FakeUpstream`."""
    fake = FakeUpstream(
        Settings(
            context_window=context_window,
            model_context_windows=dict(model_context_windows or {}),
            record=record,
            models=list(models),
        ),
        responders,
        max_recorded,
    )

    async def prelude(request: Request) -> tuple[bytes, Response | HangResponse | None]:
        """Reads and records the body, then applies the X-Fake-* steering headers."""
        body = await request.body()
        fake.record(request, body)
        refused = key_refusal(fake, request)
        if refused is not None:
            return body, refused
        headers = request.headers
        if headers.get("x-fake-hang"):
            return body, HangResponse(fake, request)
        delay = _header_number(request, "x-fake-delay-ms")
        delay = fake.settings.delay_ms if delay is None else delay
        if delay:
            await asyncio.sleep(delay / 1000)
        status = _header_number(request, "x-fake-status")
        if headers.get("x-fake-body") == "html":
            return body, Response(
                HTML_PAGE,
                status_code=200 if status is None else int(status),
                media_type="text/html",
            )
        if status is not None:
            error = _status_error(int(status), headers.get("x-fake-error-message"))
            error.headers["x-request-id"] = f"req_fake{fake.next_id()}"
            return body, error
        return body, None

    async def chat_completions(request: Request) -> Any:
        body, early = await prelude(request)
        if early is not None:
            return early
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return error_response(
                400,
                "We could not parse the JSON body of your request.",
                "invalid_request_error",
                None,
            )
        if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
            return error_response(
                400, "'messages' is a required property", "invalid_request_error", None, "messages"
            )
        settings = fake.settings
        forced: ChatReply | None = None
        if settings.summarizer_delay_ms and is_summarizer_call(payload):
            await asyncio.sleep(settings.summarizer_delay_ms / 1000)
        if is_summarizer_call(payload):
            await fake.summarizer_gate.wait()
        if settings.summarizer != "ok" and is_summarizer_call(payload):
            failure = _summarizer_failure(fake, request, settings.summarizer)
            if isinstance(failure, ChatReply):
                forced = failure
            elif failure is not None:
                return failure
        model = payload.get("model") if isinstance(payload.get("model"), str) else ""
        prompt_tokens = scaled(
            fake.counter.messages(payload["messages"], payload.get("tools")), settings.token_scale
        )
        window = settings.window_for(model)
        if window is not None:
            completion = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
            requested = prompt_tokens + (completion if isinstance(completion, int) else 0)
            if requested > window:
                fake.event(
                    "refused",
                    request,
                    summarizer=is_summarizer_call(payload),
                    prompt_tokens=prompt_tokens,
                    requested=requested,
                )
                return refusal(settings.refusal_style, window, prompt_tokens, requested)
        reply = forced or await fake.respond(
            ChatRequest(payload, dict(request.headers), prompt_tokens)
        )
        completion_tokens = reply.completion_tokens
        if completion_tokens is None:
            completion_tokens = fake.counter.text(reply.content or "") + sum(
                fake.counter.text(c["function"]["arguments"]) for c in reply.tool_calls
            )
        cached_messages = fake.prompt_cache.hit(payload["messages"], payload.get("tools"))
        # The cached part's count, without the reply priming the whole prompt adds once.
        cached_tokens = (
            scaled(
                fake.counter.messages(payload["messages"][:cached_messages], payload.get("tools"))
                - 3,
                settings.token_scale,
            )
            if cached_messages
            else 0
        )
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": max(0, cached_tokens)},
        }
        base = {
            "id": f"chatcmpl-fake{fake.next_id()}",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fake",
        }
        if payload.get("stream"):
            stream_options = payload.get("stream_options")
            include_usage = isinstance(stream_options, dict) and bool(
                stream_options.get("include_usage")
            )
            chunks = _header_number(request, "x-fake-chunks")
            chunk_delay = _header_number(request, "x-fake-chunk-delay-ms")
            chunk_delay = settings.chunk_delay_ms if chunk_delay is None else chunk_delay
            events = _chat_events(
                {**base, "object": "chat.completion.chunk"},
                reply,
                usage,
                include_usage,
                None if chunks is None else int(chunks),
                chunk_delay / 1000,
            )
            return EventStreamResponse(fake, request, events, _cut_after(request))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content,
            "refusal": None,
        }
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": reply.finish_reason,
        }
        reply_json = _json(
            {**base, "object": "chat.completion", "choices": [choice], "usage": usage},
            request_id=f"req_{base['id']}",
        )
        cut = _cut_after(request)
        return reply_json if cut is None else CutResponse(fake, request, reply_json, cut)

    async def list_models(request: Request) -> Any:
        _, early = await prelude(request)
        if early is not None:
            return early
        settings = fake.settings
        data = [
            published_entry(name, settings.window_for(name), settings.publish_windows)
            for name in settings.models
        ]
        return _json({"object": "list", "data": data}, request_id=f"req_fake{fake.next_id()}")

    async def embeddings(request: Request) -> Any:
        body, early = await prelude(request)
        if early is not None:
            return early
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict) or "input" not in payload:
            return error_response(
                400, "'input' is a required property", "invalid_request_error", None, "input"
            )
        raw = payload["input"]
        inputs = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else raw
        as_base64 = payload.get("encoding_format") == "base64"
        data = []
        tokens = 0
        for index, item in enumerate(inputs):
            vector = embedding_for(item)
            tokens += fake.counter.text(item) if isinstance(item, str) else len(item)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        return _json(
            {
                "object": "list",
                "data": data,
                "model": payload.get("model"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
            request_id=f"req_fake{fake.next_id()}",
        )

    async def echo(request: Request) -> Any:
        body, early = await prelude(request)
        if early is not None:
            return early
        size = _header_number(request, "x-fake-response-bytes")
        if size is not None:
            return Response(pattern_bytes(int(size)), media_type="application/octet-stream")
        chunks = _header_number(request, "x-fake-chunks")
        if chunks is not None:
            delay = _header_number(request, "x-fake-chunk-delay-ms")
            delay = fake.settings.chunk_delay_ms if delay is None else delay
            return EventStreamResponse(
                fake, request, _generic_events(int(chunks), delay / 1000), _cut_after(request)
            )
        echoed = _json(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.scope.get("query_string", b"").decode("latin-1"),
                "headers": merged_headers(request.scope["headers"]),
                "body_len": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
                "body_b64": base64.b64encode(body).decode() if len(body) <= 1 << 20 else None,
            }
        )
        cookie = request.headers.get("x-fake-set-cookie")
        if cookie:  # a provider's cookie (Cloudflare's __cf_bm, say): must not leak onwards
            echoed.headers.append("set-cookie", cookie)
        return echoed

    async def requests_route(request: Request) -> Any:
        if request.method == "DELETE":
            # `?take=1`: the requests cleared, in the same step, so one arriving between a
            # read and a clear is never lost.
            taken = [recorded.to_json() for recorded in fake.requests]
            fake.requests.clear()
            if request.query_params.get("take"):
                return _json(taken)
            return _json({"cleared": True})
        return _json([recorded.to_json() for recorded in fake.requests])

    async def events_route(request: Request) -> Any:
        if request.method == "DELETE":
            fake.events.clear()
            return _json({"cleared": True})
        return _json(list(fake.events))

    async def control_route(request: Request) -> Any:
        if request.method == "POST":
            try:
                changes = orjson.loads(await request.body() or b"{}")
                apply_control(fake, changes)
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                return error_response(
                    400, f"bad control request: {exc}", "invalid_request_error", None
                )
        return _json({**asdict(fake.settings), "exact_token_counts": fake.counter.exact})

    all_methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/{rest:path}", echo, methods=all_methods),
        Route("/_requests", requests_route, methods=["GET", "DELETE"]),
        Route("/_events", events_route, methods=["GET", "DELETE"]),
        Route("/_control", control_route, methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.fake = fake
    return app


def _summarizer_failure(fake: FakeUpstream, request: Request, mode: str) -> Any:
    """A response (500, hang) or a bad reply (empty, oversized) for a summarizer call, or the
    ``prose`` summary."""
    if mode == "prose":
        return ChatReply(content=PROSE_SUMMARY)
    if mode == "error":
        return error_response(500, "The server had an error.", "server_error", None)
    if mode == "hang":
        return HangResponse(fake, request)
    if mode == "empty":
        return ChatReply(content="   ")
    if mode == "oversized":
        return ChatReply(content="word " * 5000, finish_reason="length")
    return None


def scaled(tokens: int, scale: float) -> int:
    """``tokens`` as a model whose tokenizer counts ``scale`` times the fake's would."""
    return tokens if scale == 1.0 else math.ceil(tokens * scale)


def apply_control(fake: FakeUpstream, changes: Any) -> None:
    """Applies a ``POST /_control`` body: ``{"reset": true}`` and/or any :class:`Settings` field."""
    if not isinstance(changes, dict):
        raise TypeError("expected a JSON object")
    if changes.get("reset"):
        fake.settings = Settings(**asdict(fake.initial))
        fake.prompt_cache = PrefixCache()  # a reset server has seen no prompt
    known = {f.name for f in fields(Settings)}
    unknown = set(changes) - known - {"reset"}
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; allowed: {sorted(known)}")
    if changes.get("refusal_style", "openai") not in REFUSAL_STYLES:
        raise ValueError(f"refusal_style must be one of {', '.join(REFUSAL_STYLES)}")
    if changes.get("publish_windows", "none") not in PUBLISH_STYLES:
        raise ValueError(f"publish_windows must be one of {', '.join(PUBLISH_STYLES)}")
    for name in known & set(changes):
        setattr(fake.settings, name, changes[name])
    if fake.settings.summarizer_hold:
        fake.summarizer_gate.clear()
    else:
        fake.summarizer_gate.set()


def embedding_for(item: Any) -> list[float]:
    """A small deterministic vector per input, so a test can compare proxy and direct calls."""
    digest = hashlib.sha256(orjson.dumps(item)).digest()
    return [round((byte - 128) / 128, 6) for byte in digest[:EMBEDDING_DIMENSIONS]]


def pattern_bytes(size: int) -> bytes:
    """The body ``X-Fake-Response-Bytes: size`` answers with."""
    repeats = size // len(RESPONSE_PATTERN) + 1
    return (RESPONSE_PATTERN * repeats)[:size]


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.upstream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--context-window", type=int, default=None)
    parser.add_argument(
        "--no-record", action="store_true", help="do not record requests (long benchmark runs)"
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    app = create_app(context_window=args.context_window, record=not args.no_record)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop=_available("uvloop", "auto"),
        http=_available("httptools", "auto"),
        log_level=args.log_level,
        access_log=False,
        lifespan="off",
    )


def _available(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module


if __name__ == "__main__":
    main()
