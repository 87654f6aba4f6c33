"""`WireFormat`: what the edge needs to know about one API it compacts
(compaction_proxy/wire/README.md,
"Wire formats").

The core compacts chat-shaped messages; every API the proxy compacts in flight (chat
completions, the Responses API, and any other) is one value satisfying :class:`WireFormat`,
listed once in :mod:`compaction_proxy.wire.registry`. The routes, the preview, the CLI's
``compact``, the metric labels and the summarizer ask the format, never the path or the body's
keys: what a format is, is said here and only here.

A format holds the knowledge of its API, not the machinery: the generic route
(``api/_compacted.py``) parses with :attr:`WireFormat.parse`, lifts to a :class:`View`, runs
the shared compaction flow on ``view.chat`` and lowers the result back with
:meth:`View.lower`, splicing it into the client's own bytes at :attr:`WireFormat.items`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from compaction_proxy.compaction.errors import CompactionProxyError

from ._amendment import Amendment, UpstreamTraits
from .recall import RecallWire
from .sse import Event

if TYPE_CHECKING:
    from compaction_proxy.compaction import CompactionReport
    from compaction_proxy.compaction.strategies.base import Strategy


__all__ = [
    "BEARER",
    "Amendment",
    "CallerKey",
    "ContextEdits",
    "EditedView",
    "Headers",
    "LowerError",
    "Lowered",
    "NativeRequest",
    "PrefixCall",
    "RefusalText",
    "SummaryCall",
    "SummaryReply",
    "UpstreamAuth",
    "UpstreamTraits",
    "View",
    "WindowOption",
    "WireFormat",
]

Headers = Sequence[tuple[bytes, bytes]]
"""A request's headers as the ASGI scope holds them: lower-case names, raw values."""


@dataclass(frozen=True, slots=True)
class UpstreamAuth:
    """How an upstream of this format takes a key: the header the operator's key goes in (with
    its scheme), and every header a caller's own key may arrive in.

    OpenAI's APIs take ``Authorization: Bearer <key>``; Anthropic's takes ``x-api-key: <key>``,
    and also ``Authorization: Bearer`` (the Python SDK 2.x sends its key that way, OAuth
    tokens always go there). When an upstream has its own ``api_key``, every one of
    :attr:`caller_headers` the client sent is dropped and :attr:`header` is sent instead.
    """

    header: str = "authorization"
    scheme: str = "Bearer "
    also: tuple[str, ...] = ("authorization",)  # where else callers send their key
    version: tuple[tuple[str, str], ...] = ()
    """Headers a request of the proxy's own in this API's form carries (the window listing):
    Anthropic's API refuses one without ``anthropic-version``."""

    def value(self, key: str) -> str:
        return f"{self.scheme}{key}"

    @property
    def caller_headers(self) -> tuple[str, ...]:
        """The headers a caller's key is read from, in order of preference: :attr:`header`,
        then :attr:`also`."""
        return tuple(dict.fromkeys((self.header, *self.also)))


BEARER = UpstreamAuth()


@dataclass(frozen=True, slots=True)
class CallerKey:
    """A caller's own key as it arrived: the header it came in and that header's value.

    The proxy sends it on calls of its own to the caller's upstream (summaries, the window
    listing). It is never logged: the value is left out of ``repr``, and what the proxy keeps
    of it across requests is a keyed hash (compaction_proxy/http/_admission.py).
    """

    header: str
    value: str = field(repr=False)

    @property
    def key(self) -> str:
        """The key itself: an ``Authorization`` value without its ``Bearer`` scheme."""
        value = self.value.strip()
        if self.header == "authorization":
            scheme, _, rest = value.partition(" ")
            if scheme.lower() == "bearer" and rest.strip():
                return rest.strip()
        return value

    def sent_with(self, auth: UpstreamAuth) -> tuple[str, str]:
        """The header and value that carry it on a call whose upstream takes keys the way
        ``auth`` says: as it came when the call takes keys in that header (an OAuth token in
        ``Authorization`` stays there), else in ``auth.header`` with its scheme (an
        ``x-api-key`` on a chat-completions call goes as ``Authorization: Bearer``)."""
        if self.header in auth.caller_headers:
            return self.header, self.value
        return auth.header, auth.value(self.key)


@dataclass(frozen=True, slots=True)
class WindowOption:
    """A window a request's own headers opt into (Anthropic's 1M-context beta).

    ``name`` keeps what is learned about it apart from the model's ordinary window: a refusal
    of a request that opted in teaches nothing about one that did not, and the other way
    round (compaction_proxy/upstream/_windows.py).
    """

    tokens: int
    name: str


@dataclass(frozen=True, slots=True)
class RefusalText:
    """A phrase by which this format's upstreams refuse a prompt that is too long, read beside
    the ones every OpenAI-compatible server uses (compaction_proxy/upstream/_overflow.py).

    ``pattern`` is searched in the refusal's message; its named groups ``prompt`` and
    ``window``, when present, are the counts it states. ``family`` names it in logs and metrics.
    """

    family: str
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class SummaryReply:
    """What a summary call's answer says, read by the format that made the call."""

    text: str
    cut: bool  # stopped at the output limit
    completion_tokens: int | None
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class NativeRequest:
    """A request in its own format's form, for a summary call that sends its prefix as the
    client wrote it (:attr:`SummaryCall.prefix`): the client's parsed body (its members other
    than the rewritten one: ``system``, ``tools``, ...), the view's way back from chat-shaped
    messages to the format's own (:meth:`View.lower`), and the client's headers the call
    repeats (:attr:`SummaryCall.repeats`). ``native``: the request goes to the API's own
    server (:class:`UpstreamTraits`), which checks what that API checks of the prefix too."""

    body: Mapping[str, Any]
    lower: Callable[[Sequence[Mapping[str, Any]]], Lowered]
    headers: Mapping[str, str] = field(default_factory=dict)
    native: bool = False


@dataclass(frozen=True, slots=True)
class PrefixCall:
    """What a prefix-form summary call is made of (compaction_proxy/summarizer/_prefix.py):
    the request; ``forwarded``, the view's chat-shaped messages as the request goes upstream
    (the effective view), of which ``forwarded[:end]`` runs from the start to the stretch's
    last message found there (the part the upstream has cached); ``tail``, the stretch
    messages after that one, in the core's form (ones an earlier strategy made up); and the
    instruction that follows them all.

    The whole of ``forwarded`` is there because a format's lowering may depend on what follows
    a message (the Messages format writes a made-up message as user text before a turn that
    opens with thinking): the cached part is what the whole request lowers to, not what the
    cut lowers to."""

    request: NativeRequest
    forwarded: Sequence[Mapping[str, Any]]
    end: int
    tail: Sequence[Mapping[str, Any]]
    instruction: str

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        """The chat-shaped prefix: the cached part, then the tail."""
        return [*self.forwarded[: self.end], *self.tail]


@dataclass(frozen=True, slots=True)
class SummaryCall:
    """The summary call in this format's form: where it goes and how its body is written and
    its answer read. The summarizer builds chat-shaped messages (a system prompt, a
    transcript, or the request's own prefix and one instruction) and asks the format for the
    rest.

    ``body(parameters, model, messages, extra, limit_param, limit)``: the JSON body, from
    chat-shaped ``messages`` (``extra``: members sent as they are, such as a chat prefix's
    ``tools``); ``read(payload)``: the answer, or ``ValueError`` when it is not one of this
    format's.

    ``prefix(parameters, model, call, limit)``: the body of the cache-aligned call in the
    format's own form, written from the client's own request (``call.request``), for a format
    whose view is not valid chat completions; ``ValueError`` when it cannot be (the summarizer
    then sends the transcript). None: the chat-shaped prefix goes through ``body``.
    ``headers``: sent on every call (``anthropic-version``); ``repeats``: the client's headers
    a prefix-form call sends again, over ``headers`` (the betas its content may need);
    ``native_listed``: values a prefix-form call appends to those comma-separated headers when
    the request goes to the API's own server (the beta a field of ``prefix`` then needs).
    """

    path: str  # under the upstream's base_url, e.g. "/chat/completions"
    body: Callable[
        [Mapping[str, Any], str, list[dict[str, Any]], Mapping[str, Any], str, int],
        dict[str, Any],
    ]
    read: Callable[[Any], SummaryReply]
    what: str = "a chat completion"  # named when an answer is not one
    prefix: Callable[[Mapping[str, Any], str, PrefixCall, int], dict[str, Any]] | None = None
    headers: tuple[tuple[str, str], ...] = ()
    repeats: tuple[str, ...] = ()
    native_listed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Lowered:
    """The pipeline's messages in the format's own form: the elements of the member the
    request rewrites (:attr:`WireFormat.items`), and notes for ``X-Compaction-Warning`` (what
    the client should be told about them). Every format's lowering answers one.

    ``copies``: an element equal to one the client sent may go as the client's bytes
    (compaction_proxy/wire/_forwarded.py)."""

    items: Sequence[Any]
    notes: tuple[str, ...] = ()
    copies: bool = False


class LowerError(CompactionProxyError, ValueError):
    """A compacted message that maps back to nothing the client sent: the format's adapter and
    the core disagree (a bug, never a client's fault), so the edge forwards the client's
    original request instead of a guess."""


class View(Protocol):
    """A request lifted for the core: the chat-shaped body the flow compacts, and the way back."""

    @property
    def chat(self) -> dict[str, Any]:
        """``model``, ``messages``, ``tools`` and the per-user fields that key checkpoints."""
        ...

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        """The compacted ``messages`` in the format's form; raises when they cannot be."""
        ...


class ContextEdits(Protocol):
    """A request's own context edits, applied by the proxy for an upstream that would not
    apply them itself (Anthropic's ``context_management`` sent to a local server;
    docs/context-management.md). The format translates them; the edge runs
    :attr:`strategies` before the configured pipeline, keys checkpoints by :attr:`key` as
    well, forwards the body without the members in :attr:`strip`, and tells the client
    :meth:`notes`."""

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        """The core strategies that stand for the edits, run first, each by its own trigger
        (``CompactionRequest.edits``)."""
        ...

    @property
    def key(self) -> str:
        """The edits in a canonical form: part of the checkpoint namespace, so a checkpoint made
        under other edits (or none) is never taken for one made under these."""
        ...

    @property
    def strip(self) -> tuple[str, ...]:
        """The body's top-level members the forwarded request goes without."""
        ...

    def notes(self, report: CompactionReport | None) -> tuple[str, ...]:
        """``X-Compaction-Warning`` values: what was applied (read from ``report``, the
        request's compaction report) and what was not and why; ``report`` None: nothing was
        applied (the compaction failed, or a dry run forwarded the client's request)."""
        ...


@runtime_checkable
class EditedView(Protocol):
    """A view whose request may carry context edits of its API (a format whose API has
    none, such as chat completions, does not implement this)."""

    def context_edits(self, *, summarizer: bool) -> ContextEdits | None:
        """The request's context edits for the proxy to apply, or None when it asks for none;
        ``summarizer``: whether one is configured (an edit that summarizes needs it). Raises a
        ``ProxyError`` 400 naming a malformed edit."""
        ...


class WireFormat(Protocol):
    """One API the proxy compacts in flight. See the module docstring and "Adding a wire
    format" in compaction_proxy/wire/README.md."""

    @property
    def name(self) -> str:
        """The ``route`` metric label of its requests, e.g. ``chat_completions``."""
        ...

    @property
    def api(self) -> str:
        """The ``api`` metric label of its compacted requests, e.g. ``chat``."""
        ...

    @property
    def paths(self) -> tuple[str, ...]:
        """The ``POST`` paths it serves, e.g. ``("/v1/chat/completions",)``."""
        ...

    @property
    def count_path(self) -> str | None:
        """Its token-counting route, e.g. ``/v1/messages/count_tokens``: answered for what
        the proxy would forward (compaction_proxy/api/_count_tokens.py). None: it has none."""
        ...

    @property
    def items(self) -> str:
        """The body's member a compacted request rewrites (``messages``, ``input``)."""
        ...

    @property
    def output_limits(self) -> tuple[str, ...]:
        """The body's members that limit the answer's tokens, the one the upstream reads
        first first (chat: ``max_completion_tokens``, ``max_tokens``; Responses:
        ``max_output_tokens``; ``()``: none). The lift shows the first one set to the core as
        the chat view's ``max_completion_tokens`` (a chat body is its own view); a limit the
        budget lowers so the prompt and the answer fit the window (docs/compaction.md, "The
        output limit") is written into each of them that asks more, in the client's bytes."""
        ...

    @property
    def auth(self) -> UpstreamAuth:
        """How its upstreams take the operator's key."""
        ...

    @property
    def summary(self) -> SummaryCall | None:
        """The summary call in this format's form; None: the summarizer's default form."""
        ...

    @property
    def prefix_summaries(self) -> bool:
        """Whether ``View.chat`` may be sent to the summarizer as a cache-aligned prefix in its
        chat form (False when the view is not valid chat completions: the transcript form)."""
        ...

    @property
    def recall(self) -> RecallWire | None:
        """Its side of the recall loop (compaction_proxy/wire/recall.py, docs/recall.md): how
        its request declares the ``compaction_recall`` tool, how its reply shows a call to it,
        and how the request is continued with the answers. None: its requests are never
        offered the tool."""
        ...

    @property
    def refusals(self) -> tuple[RefusalText, ...]:
        """Overflow refusals of its own, beside the common ones."""
        ...

    @property
    def parse(self) -> Callable[[bytes], dict[str, Any]]:
        """The body as a dict, or a ``ProxyError`` 400. A module-level function: a large body
        is parsed in a worker process, which imports it by name."""
        ...

    def claims(self, body: Mapping[str, Any]) -> bool:
        """Whether a body sent to the preview or ``compact`` is this format's."""
        ...

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        """The field through which the upstream holds history the proxy cannot see (then the
        request goes as sent), or None."""
        ...

    def has_items(self, body: Mapping[str, Any]) -> bool:
        """Whether there is anything to compact."""
        ...

    def shown(self, body: Mapping[str, Any]) -> str | None:
        """The last user text, for the dashboard (``dashboard.show_content``), before lifting."""
        ...

    def lift(self, body: dict[str, Any], *, check: bool = True) -> View:
        """Validate and lift; a ``ProxyError`` 400 names what is wrong. ``check=False``: only
        what lifting needs (the preview checks the view's messages later, when it compacts)."""
        ...

    def usage_tokens(self, payload: Any) -> int | None:
        """The prompt tokens an upstream's JSON reply, or one SSE event's data, reports."""
        ...

    @property
    def usage_at_start(self) -> bool:
        """Whether a stream states the prompt's usage in its first event(s) (Anthropic's
        ``message_start``), so the relay reads them as well as the stream's last events
        (compaction_proxy/upstream/_usage.py)."""
        ...

    def ends_stream(self, event: Event) -> bool:
        """Whether ``event`` (compaction_proxy/wire/sse.py) is the one that ends this format's
        streams (chat: ``data: [DONE]``; Responses: ``response.completed``, ``.failed`` or
        ``.incomplete``; Messages: ``message_stop``): a client that has it was answered in full
        (compaction_proxy/upstream/_stream_events.py)."""
        ...

    def window_option(self, model: str, headers: Headers) -> WindowOption | None:
        """The window ``model`` gets because of the request's headers (Anthropic's 1M-context
        beta), or None: the request's headers change no window."""
        ...

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        """An error the proxy answers itself on this format's paths, in its shape."""
        ...

    def stream_error(
        self, message: str, *, type: str, code: str | None, param: str | None, sequence: int
    ) -> bytes:
        """The SSE event that ends a stream the proxy must cut (a shutdown), in this format's
        shape; ``sequence``: one past the last event's ``sequence_number`` (0 without one)."""
        ...

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        """What a request whose items compaction changed needs to be accepted by ``upstream``
        (``body``: the client's parsed body; ``items``: the lowered elements going in place of
        its :attr:`items`), or None: nothing. Messages: ``thinking.block_binding`` for
        Anthropic's preserved thinking (docs/messages.md); the OpenAI formats: None."""
        ...
