"""``HttpSummarizer``: the summary call to an upstream, in its wire format's form.

One non-streaming ``POST`` per transcript chunk, in the form of a
:class:`~compaction_proxy.wire.SummaryCall`: the request's own format's when the summarizer is
the request's own upstream and the format has one, else the form of the API the upstream's
``api`` names (``messages``: Anthropic's ``POST {base_url}/messages``), else the default
format's (chat completions: ``POST {base_url}/chat/completions``; see :mod:`._transcript`),
with our prompts as the system message, ``summarization.parameters`` merged into the body and
``maxSummaryTokens`` as the output limit. Anything short of a usable
summary is a :class:`SummaryError` with a machine-readable reason, because a failed summary must
make the pipeline move on, never become a checkpoint:

* ``timeout``: the call took longer than ``timeout`` seconds (the whole call, not one phase);
* ``error``: transport failure, non-2xx status, a body that is not a chat completion;
* ``empty``: no text, or only whitespace (reasoning models sometimes answer only in reasoning);
* ``oversized``: the completion is over the limit (``usage.completion_tokens`` without
  reasoning tokens, or our own count when usage is absent) or was cut (``finish_reason:
  length``): a truncated checkpoint silently loses its last sections. Our own prompts state
  the limit (a small model may write on until cut); under a prompt the configuration wrote,
  which states none, a cut summary is asked for once more with the limit stated. A reply cut
  although the model was told the limit keeps its complete lines and ends with the core's
  ``CUT_MARK`` (call outcome ``cut``; the report warns); with no complete line, it fails;
* ``overflow``: the upstream refused the call as too long for its window, and its smaller
  retry too (calls are sized by the model's calibration and window, :mod:`._sizing`).

The call's form: by default, when the summarizer is the request's own upstream and model, the
forwarded request's own prefix plus one instruction, so the upstream's prompt cache serves the
conversation (:mod:`._prefix`, ``summarization.reusePrefix``): as chat messages for a chat
request, in the format's own form for a format whose call writes its prefix itself
(``SummaryCall.prefix``: a Messages request's own ``system``, ``tools`` and messages); otherwise,
or when that prefix holds binary content or does not fit, the plain-text transcript.

Which upstream: ``summarization.provider`` names one (case-insensitively; LibreChat configs say
``openAI``), else the request's own upstream. Which model: ``summarization.model``, else the
request's. Credentials: the upstream's own ``api_key`` when it has one (sent the way the call's
format sends it, ``Authorization: Bearer`` or e.g. ``x-api-key``), else the caller's
``Authorization`` value, which the edge hands over with :meth:`HttpSummarizer.bind`. Error
messages name the upstream and the status, never a key or the response body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import orjson

from compaction_proxy.compaction.budget import ModelCatalog, ModelFacts
from compaction_proxy.compaction.settings import SummarizationSettings
from compaction_proxy.compaction.summarizer_contract import SummaryError, SummaryRequest, is_cut
from compaction_proxy.compaction.tokens import CharacterEstimatorTokenizer, Tokenizer
from compaction_proxy.config import ConfigError, Settings, UpstreamSettings, find_upstream
from compaction_proxy.config.preflight import (
    validate_summarization_config,
)
from compaction_proxy.upstream import (
    TRANSPORT_ERRORS,
    ReplyUnreadable,
    Router,
    UpstreamTimeout,
    UpstreamTransport,
    call_upstream,
    detect_overflow,
)
from compaction_proxy.wire import (
    DEFAULT_FORMAT,
    CallerKey,
    PrefixCall,
    RefusalText,
    SummaryCall,
    UpstreamAuth,
    WireFormat,
    api_names,
    format_for_api,
)

from ._parameters import LimitParam, split_parameters
from ._prefix import (
    ForwardedRequest,
    fits,
    has_binary,
    instruction,
    place_stretch,
    prefix_tokens,
    stretch_end,
    tool_choice_for,
)
from ._prompts import PromptSet, cut_note, length_note, own_limit_note
from ._replies import SummaryCut, error_code, read_completion
from ._sizing import SummaryOverflow, SummarySizing, learn_from
from ._stats import SummarizerStats, SummaryCallRecord, SummaryCalls
from ._transcript import SummarizerWindow, TranscriptOptions, fold, plan_chunks, render_blocks

DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_REPLY_BYTES = 8 << 20
"""A summary call's reply is read up to this size (a summary is a few thousand tokens)."""
DEFAULT_MAX_SUMMARY_TOKENS = 4096
"""Output limit when ``maxSummaryTokens`` is unset (LibreChat sends none; an unbounded
checkpoint defeats its purpose). Clamped to the summarizer model's own output limit."""
MAX_CHUNKS = 16
"""At most this many summarizer calls for one stretch: a bigger one is refused, not paid for."""
OFF_LOOP_MESSAGES = 2_000
"""A summary request this long is prepared on a worker thread."""

log = logging.getLogger("compaction_proxy.summaries")


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """Where a summary's calls go and what bounds their answers: the same for every call of
    one summary (the chunks of a fold), so it is settled once."""

    upstream: UpstreamSettings
    model: str
    limit: int
    count: Callable[[str], int]
    call: SummaryCall
    auth: UpstreamAuth
    refusals: Sequence[RefusalText] = ()
    """The call's format's own overflow phrases, read beside the common ones."""
    salvaged: bool = False
    """A reply cut at the limit is kept as its complete lines (the model was told the limit)."""


# ------------------------------------------------------------------ the summarizer


class HttpSummarizer:
    """Implements the core's ``Summarizer`` protocol over the transport that forwards requests
    (one connection pool and the ``upstreams[].timeouts`` of each upstream;
    ``summarization.timeout`` bounds the whole call).

    Build one at start-up; per request call :meth:`bind` with the caller's ``Authorization``
    header value and hand the bound instance to the core. ``facts_for`` gives the summarizer
    model's window and output limit (chunk sizing); ``tokenizer_for`` counts for that model;
    ``sizing`` scales that count by the model's calibration and learns from a refusal
    (:mod:`._sizing`).
    """

    def __init__(
        self,
        settings: SummarizationSettings,
        upstreams: Sequence[UpstreamSettings],
        transport: UpstreamTransport,
        *,
        facts_for: Callable[[str], ModelFacts] | None = None,
        tokenizer_for: Callable[[str], Tokenizer] | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        limit_param: LimitParam | None = None,
        transcript: TranscriptOptions | None = None,
        max_chunks: int = MAX_CHUNKS,
        stats: SummarizerStats | None = None,
        sizing: SummarySizing | None = None,
    ) -> None:
        self._settings = settings
        self._router = Router(upstreams)
        self._provider: UpstreamSettings | None = None
        if settings.provider is not None:
            self._provider = find_upstream(upstreams, settings.provider)
            if self._provider is None:
                raise ConfigError(
                    f"summarization.provider: no upstream named {settings.provider!r}"
                )
            if format_for_api(self._provider.api) is None:
                raise ConfigError(
                    f"upstream {self._provider.name!r}: api {self._provider.api!r} is not an "
                    f"API the proxy speaks; known: {', '.join(api_names())}"
                )
        self._transport = transport
        self._facts_for = facts_for or ModelCatalog().facts_for
        estimator = CharacterEstimatorTokenizer()
        self._tokenizer_for = tokenizer_for or (lambda _model: estimator)
        self._timeout = timeout
        self._transcript = transcript or TranscriptOptions()
        self._max_chunks = max_chunks
        self._sizing = sizing or SummarySizing()
        self.prompts = PromptSet.from_config(settings.prompt, settings.update_prompt)
        self.stats = stats or SummarizerStats()
        self._parameters, self._limit, self._limit_param = split_parameters(
            settings.parameters, settings.max_summary_tokens, limit_param
        )
        self._caller_key: CallerKey | None = None
        self._calls: SummaryCalls | None = None
        self._request: ForwardedRequest | None = None
        self._wire: WireFormat = DEFAULT_FORMAT
        self._wire_upstream: str | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, transport: UpstreamTransport, **options: Any
    ) -> HttpSummarizer:
        """From the whole configuration (validated first)."""
        validate_summarization_config(settings)
        return cls(settings.summarization, settings.upstreams, transport, **options)

    @property
    def prompt_version(self) -> str:
        """Hash of the prompts in effect; part of the checkpoint namespace."""
        return self.prompts.version

    def model_for(self, request_model: str) -> str:
        """The model that writes summaries for a request to ``request_model``."""
        return self._settings.model or request_model

    def upstream_for(self, request_model: str) -> UpstreamSettings:
        """The upstream that writes summaries for a request to ``request_model``."""
        return self._provider or self._router.for_model(request_model)

    def bind(
        self,
        *,
        caller_key: CallerKey | None,
        calls: SummaryCalls | None = None,
        request: ForwardedRequest | None = None,
        wire: WireFormat = DEFAULT_FORMAT,
        upstream: str | None = None,
    ) -> HttpSummarizer:
        """A per-request instance carrying the caller's own key (the header it came in and
        its value), sent on the request's own upstream in the header the summary call's form
        takes keys in (:meth:`CallerKey.sent_with`).

        ``calls``: the request's log, which gets the outcome of every HTTP call this instance
        makes (the shared :attr:`stats` still records each one). ``request``: the chat
        request's messages and tools as they go upstream, from which a :class:`SummaryRequest`
        without a ``prefix`` gets one (:mod:`._prefix`). ``wire``: the request's format, whose
        summary call form (and key header) is used on ``upstream``, the request's own upstream.
        """
        bound = object.__new__(type(self))  # copy.copy's reduce protocol costs more
        bound.__dict__.update(self.__dict__)
        bound._caller_key = caller_key
        bound._calls = calls
        bound._request = request
        bound._wire = wire
        bound._wire_upstream = upstream
        return bound

    def _form(
        self, upstream: UpstreamSettings
    ) -> tuple[SummaryCall, UpstreamAuth, Sequence[RefusalText]]:
        """The summary call's form on ``upstream``, how it takes the operator's key and how
        its refusals are worded: the request's format's on the request's own upstream (the
        request shows what it speaks), else that of the format its ``api`` names, else the
        default format's (a format without a call of its own, such as the Responses API's:
        its upstreams answer chat)."""
        wire = self._wire
        if wire.summary is not None and upstream.name == self._wire_upstream:
            return wire.summary, wire.auth, wire.refusals
        spoken = format_for_api(upstream.api)
        if spoken is not None and spoken.summary is not None:
            return spoken.summary, spoken.auth, spoken.refusals
        default = DEFAULT_FORMAT
        assert default.summary is not None  # the default format always has a summary call
        return default.summary, default.auth, default.refusals

    def _with_prefix(self, request: SummaryRequest) -> SummaryRequest:
        """``request`` with the prefix and tools of the bound chat request, when it lacks them
        and the stretch can be placed in that request."""
        context = self._request
        if request.prefix is not None or context is None:
            return request
        prefix = place_stretch(context.messages, request.messages)
        if prefix is None:
            return request
        tools = tuple(context.tools) if context.tools else None
        return dataclasses.replace(request, prefix=tuple(prefix), tools=request.tools or tools)

    def _same_upstream_and_model(self, request_model: str, upstream: UpstreamSettings) -> bool:
        if self.model_for(request_model) != request_model:
            return False
        context = self._request
        own = context.upstream if context is not None and context.upstream else None
        if own is None:
            own = self._router.for_model(request_model).name
        return upstream.name == own

    def _prefix_body(
        self,
        request: SummaryRequest,
        target: _Target,
        window: SummarizerWindow,
        tokenizer: Tokenizer,
        note: str = "",
    ) -> tuple[dict[str, Any], int] | None:
        """The prefix-form body for ``request`` and its prompt's size by our count, or
        ``None`` for the transcript form."""
        mode = self._settings.reuse_prefix
        if mode == "never":
            return None
        context = self._request
        call = target.call
        native = context.native if context is not None else None
        if call.prefix is not None:
            # Written from the client's own request, which must be in this call's format.
            if native is None or call is not self._wire.summary:
                return None
        elif native is not None:
            return None  # the bound messages are a format's view, not chat completions
        request = self._with_prefix(request)
        prefix = request.prefix
        if not prefix:
            return None
        if mode == "auto" and (
            not self._same_upstream_and_model(request.model, target.upstream) or has_binary(prefix)
        ):
            return None
        final = instruction(self.prompts, request.previous_summary) + note
        if not fits(prefix, request.tools, final, window, tokenizer):
            log.info("summary call: the request's prefix does not fit the summarizer's window")
            return None
        sent = (
            prefix_tokens(prefix, request.tools, tokenizer)
            + tokenizer.count_message({"role": "user", "content": final})
            + tokenizer.reply_priming
        )
        if call.prefix is not None:
            assert native is not None and context is not None
            end = stretch_end(context.messages, request.messages)
            if end is None:
                return None
            position, placed = end
            written = PrefixCall(
                native, context.messages, position, request.messages[placed:], final
            )
            try:
                return call.prefix(self._parameters, target.model, written, target.limit), sent
            except ValueError as exc:
                log.info("summary call: the prefix cannot be sent in its own form (%s)", exc)
                return None
        extra: dict[str, Any] = {}
        tools = request.tools or (context.tools if context is not None else None)
        if tools:
            extra["tools"] = tools
            choice = tool_choice_for(context.tool_choice if context is not None else None)
            if choice is not None:
                extra["tool_choice"] = choice
        if context is not None and context.functions:
            extra["functions"] = context.functions
        messages = [*prefix, {"role": "user", "content": final}]
        body = call.body(
            self._parameters, target.model, messages, extra, self._limit_param, target.limit
        )
        return body, sent

    async def summarize(self, request: SummaryRequest) -> str:
        """The summary of ``request``'s stretch folded into its previous summary, if any."""
        model = self.model_for(request.model)
        upstream = self.upstream_for(request.model)
        facts = self._facts_for(model)
        limit = self._limit
        if limit is None:
            limit = min(
                DEFAULT_MAX_SUMMARY_TOKENS, facts.max_output_tokens or DEFAULT_MAX_SUMMARY_TOKENS
            )
        # The budget the summary must fit bounds it too (the core's `max_tokens`): the model is
        # told, so it writes a shorter checkpoint rather than being cut at the limit. Our own
        # prompts state the limit in any case (a small model writes on until cut); a prompt the
        # configuration wrote is sent as written unless the budget bounds it.
        note = ""
        if request.max_tokens is not None and 0 < request.max_tokens < limit:
            limit = request.max_tokens
            note = length_note(limit)
        elif self.prompts.ours:
            note = own_limit_note(limit)
        tokenizer = self._tokenizer_for(model)
        # Sized in the summarizer model's own tokens: our count times its calibration.
        window = SummarizerWindow(facts.context_window, limit, ratio=self._sizing.ratio(model))
        call, auth, refusals = self._form(upstream)
        target = _Target(
            upstream, model, limit, tokenizer.count_text, call, auth, refusals, bool(note)
        )
        try:
            return await self._sized(request, target, window, tokenizer, note)
        except SummaryCut:
            if note:  # it was told the limit and still ran past it
                raise
            # Cut at its own limit under a configured prompt, which states none (a small model
            # writes on until cut): once more, told the limit, rather than no summary at all.
            log.info("summary cut at %d tokens; asking once more, told the limit", limit)
        target = dataclasses.replace(target, salvaged=True)
        try:
            return await self._sized(request, target, window, tokenizer, cut_note(limit))
        except SummaryCut as again:
            raise SummaryError(
                "oversized", f"{again.message}; cut again when told the limit"
            ) from again

    async def _sized(
        self,
        request: SummaryRequest,
        target: _Target,
        window: SummarizerWindow,
        tokenizer: Tokenizer,
        note: str,
    ) -> str:
        """One summary, sized by ``window``; refused as too long, once more smaller."""
        try:
            return await self._summarize(request, target, window, tokenizer, note)
        except SummaryOverflow as refused:
            upstream, model = target.upstream, target.model
            smaller = await learn_from(refused, window, self._sizing, upstream.name, model)
        try:
            # Once more, smaller: the transcript form, cut into chunks that fit what the
            # refusal taught (the prefix form cannot shrink).
            return await self._summarize(request, target, smaller, tokenizer, note, transcript=True)
        except SummaryOverflow as again:
            raise SummaryError(
                "overflow", f"{again.message}; refused again when retried smaller"
            ) from again

    async def _summarize(
        self,
        request: SummaryRequest,
        target: _Target,
        window: SummarizerWindow,
        tokenizer: Tokenizer,
        note: str,
        *,
        transcript: bool = False,
    ) -> str:
        """One try at the summary: the prefix form when it applies and fits (not with
        ``transcript``), else the transcript folded chunk by chunk."""
        call, model, limit = target.call, target.model, target.limit
        # Counting a long prefix and rendering a long transcript are CPU work: off the loop.
        off_loop = len(request.messages) + len(request.prefix or ()) >= OFF_LOOP_MESSAGES
        prefixed = None
        if not transcript:
            if off_loop:
                prefixed = await asyncio.to_thread(
                    self._prefix_body, request, target, window, tokenizer, note
                )
            else:
                prefixed = self._prefix_body(request, target, window, tokenizer, note)
        if prefixed is not None:
            body, sent = prefixed
            native = self._request.native if self._request is not None else None
            repeated = {}
            if native is not None and call.prefix is not None:
                repeated = {k: v for k, v in native.headers.items() if k in call.repeats}
            return await self._complete(target, body, sent, form="prefix", headers=repeated)
        plan = partial(self._plan, request, window, target.count)
        chunks = await asyncio.to_thread(plan) if off_loop else plan()
        if len(chunks) > self._max_chunks:
            raise SummaryError(
                "oversized",
                f"the stretch to summarize needs {len(chunks)} "
                f"summarizer calls, over the limit of {self._max_chunks}",
            )

        async def one(system: str, user: str) -> str:
            messages = [
                {"role": "system", "content": system + note},
                {"role": "user", "content": user},
            ]
            sent = sum(tokenizer.count_message(m) for m in messages) + tokenizer.reply_priming
            body = call.body(self._parameters, model, messages, {}, self._limit_param, limit)
            return await self._complete(target, body, sent)

        return await fold(chunks, request.previous_summary, self.prompts, one)

    def _plan(
        self, request: SummaryRequest, window: SummarizerWindow, count: Callable[[str], int]
    ) -> list[str]:
        blocks = render_blocks(request.messages, self._transcript)
        return plan_chunks(blocks, request.previous_summary, self.prompts, window, count)

    # -------------------------------------------------------------- one HTTP call

    async def _complete(
        self,
        target: _Target,
        body: dict[str, Any],
        sent: int,
        *,
        form: str = "transcript",
        headers: Mapping[str, str] | None = None,
    ) -> str:
        started = time.monotonic()
        outcome = "error"
        usage: dict[str, int] = {}
        try:
            text = await self._post(target, body, sent, headers or {}, usage)
            outcome = "cut" if is_cut(text) else "ok"
            if outcome == "cut":
                log.warning(
                    "summary cut at %d tokens by %s (%s): kept its complete lines",
                    target.limit,
                    target.upstream.name,
                    target.model,
                )
            return text
        except SummaryError as exc:
            outcome = exc.reason
            raise
        finally:
            calls = self._calls
            if calls is not None:
                calls.outcomes.append(outcome)
            self.stats.record(
                SummaryCallRecord(
                    target.upstream.name,
                    target.model,
                    outcome,
                    time.monotonic() - started,
                    per_request=calls is not None,
                    cached_tokens=usage.get("cached_tokens", 0),
                    form=form,
                )
            )

    async def _post(
        self,
        target: _Target,
        body: dict[str, Any],
        sent: int,
        repeated: Mapping[str, str],
        usage: dict[str, int],
    ) -> str:
        upstream, model, limit = target.upstream, target.model, target.limit
        call, auth = target.call, target.auth
        headers = {"content-type": "application/json", "accept": "application/json"}
        headers.update(call.headers)
        headers.update(repeated)
        if upstream.api_key is not None:
            headers[auth.header] = auth.value(upstream.api_key.get_secret_value())
        elif self._caller_key is not None:
            name, value = self._caller_key.sent_with(auth)
            headers[name] = value
        where = f"summarizer upstream '{upstream.name}'"
        try:
            async with asyncio.timeout(self._timeout):
                response = await call_upstream(
                    self._transport,
                    "POST",
                    f"{upstream.url}{call.path}",
                    headers,
                    orjson.dumps(body),
                    upstream.timeouts,
                    limit=MAX_REPLY_BYTES,
                )
        except UpstreamTimeout as exc:
            raise SummaryError("timeout", f"{where} ({model}): {exc.description}") from exc
        except TimeoutError as exc:
            raise SummaryError(
                "timeout", f"{where} ({model}): no answer within {self._timeout:g} s"
            ) from exc
        except ReplyUnreadable as exc:
            raise SummaryError("error", f"{where} ({model}): {exc}") from exc
        except TRANSPORT_ERRORS as exc:
            raise SummaryError(
                "error", f"{where} ({model}): request failed ({type(exc).__name__})"
            ) from exc
        if not 200 <= response.status < 300:
            failed = f"{where} ({model}): HTTP {response.status}{error_code(response.content)}"
            # The call read the body decoded: no content coding left to undo.
            overflow = detect_overflow(response.status, response.content, None, target.refusals)
            if overflow is not None:
                raise SummaryOverflow(f"{failed}: refused as too long", overflow, sent)
            raise SummaryError("error", failed)
        return read_completion(
            response.content,
            call,
            f"{where} ({model})",
            limit,
            target.count,
            usage,
            salvaged=target.salvaged,
        )
