"""The fake Messages upstream's HTTP surface (Starlette; run under uvicorn by ``__main__``).

Routes: ``POST /v1/messages`` (any query, e.g. Claude Code's ``?beta=true``), ``POST
/v1/messages/count_tokens``, ``GET /v1/models``, and, like the chat fake, ``GET|DELETE
/_requests`` (``DELETE ?take=1`` returns what it clears), ``GET|DELETE /_events`` and ``GET|POST
/_control``. Every other path is recorded
and answered 404 in Anthropic's shape, so a test sees what else a client called.

A request to ``/v1/messages`` goes through, in order: the ``X-Fake-*`` steering headers
(``X-Fake-Status: 529``, ``X-Fake-Delay-Ms``, ``X-Fake-Hang``, ``X-Fake-Cut-After: N`` events,
``X-Fake-Stream-Error: overloaded_error``, ``X-Fake-Tag``), the structural rules
(:mod:`.rules`), fields the server is set not to know (``unsupported_fields``), at most 4
breakpoints, the thinking checks (:mod:`.signing`), the window (:mod:`.errors`), then the
policies (:mod:`.model`), prompt-cache accounting (:mod:`.cache`) and rendering
(:mod:`.render`). ``count_tokens`` runs the same checks but the window, and answers
``{"input_tokens": N}``.

Settings (``POST /_control`` with any of them, ``{"reset": true}`` or ``{"clear_cache": true}``):
``context_window`` / ``model_context_windows``, ``refusal_style`` and ``count_output``,
``cache_min_tokens``, ``thinking`` (``auto``: think when the request enables thinking;
``never``), ``redacted_thinking`` (add a redacted block to each thinking reply),
``thinking_binding`` (``off`` | ``record`` | ``enforce``), ``loop_steps`` / ``loop_lines`` (a
loop for every request with tools), ``unsupported_fields``, ``chunk_delay_ms``, ``count_route``
(False: ``count_tokens`` answers 404), ``record``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes import upstream as base
from tests.fakes.messages import errors, model, render, rules
from tests.fakes.messages.cache import DEFAULT_MIN_TOKENS, PromptCache
from tests.fakes.messages.prompt import (
    Counter,
    Prompt,
    build_prompt,
    extend_chain,
    response_unit_digests,
)
from tests.fakes.messages.signing import (
    BINDING_BETA,
    BINDING_MODES,
    Signer,
    ThinkingCheck,
    betas,
    check_thinking,
    thinking_type,
)

DEFAULT_MODELS = ("claude-sonnet-4-5", "claude-opus-5-5", "fake-model")


@dataclass
class Settings:
    context_window: int | None = None
    model_context_windows: dict[str, int] = field(default_factory=dict)
    refusal_style: str = "anthropic"
    count_output: bool = False
    # What message_delta's usage states: "cumulative" (Anthropic's: the input fields too) or
    # "output" (llama.cpp's: output_tokens alone; the prompt's size is in message_start only).
    delta_usage: str = "cumulative"
    cache_min_tokens: int = DEFAULT_MIN_TOKENS
    thinking: str = "auto"
    redacted_thinking: bool = False
    thinking_binding: str = "off"
    loop_steps: int | None = None
    loop_lines: int = 120
    unsupported_fields: list[str] = field(default_factory=list)
    chunk_delay_ms: float = 0.0
    count_route: bool = True  # False: count_tokens answers 404, as most local servers do
    record: bool = True
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))

    def window_for(self, name: str) -> int | None:
        return self.model_context_windows.get(name, self.context_window)


def validate_settings(settings: Settings) -> None:
    if settings.refusal_style not in errors.REFUSAL_STYLES:
        raise ValueError(f"refusal_style must be one of {', '.join(errors.REFUSAL_STYLES)}")
    if settings.thinking_binding not in BINDING_MODES:
        raise ValueError(f"thinking_binding must be one of {', '.join(BINDING_MODES)}")
    if settings.thinking not in ("auto", "never"):
        raise ValueError("thinking must be auto or never")
    if settings.delta_usage not in render.DELTA_USAGE:
        raise ValueError(f"delta_usage must be one of {', '.join(render.DELTA_USAGE)}")


class MessagesFake:
    """State of one server: settings, recordings (the chat fake's), cache, signer, policies."""

    def __init__(self, settings: Settings, policies: Sequence[model.Policy], max_recorded: int):
        validate_settings(settings)
        self.initial = Settings(**asdict(settings))
        self.settings = settings
        self.policies = list(policies)
        self.recorder = base.FakeUpstream(base.Settings(record=settings.record), (), max_recorded)
        self.counter = Counter(self.recorder.counter)
        self.cache = PromptCache()
        self.signer = Signer()
        self._messages = itertools.count(1)
        self._tools = itertools.count(1)

    def next_message_id(self) -> str:
        return f"msg_fake{next(self._messages):06d}"

    def next_tool_id(self) -> str:
        return f"toolu_fake_0_0_{next(self._tools)}"

    def control(self, changes: Any) -> None:
        if not isinstance(changes, dict):
            raise TypeError("expected a JSON object")
        known = {f.name for f in fields(Settings)}
        unknown = set(changes) - known - {"reset", "clear_cache"}
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; allowed: {sorted(known)}")
        start = self.initial if changes.get("reset") else self.settings
        candidate = Settings(**{**asdict(start), **{k: changes[k] for k in known & set(changes)}})
        validate_settings(candidate)  # nothing changes when a value is refused
        if changes.get("reset") or changes.get("clear_cache"):
            self.cache.clear()
        self.settings = candidate
        self.recorder.settings.record = candidate.record


@dataclass(frozen=True)
class Checked:
    """A request that passed every rule, with its counted prompt."""

    payload: dict[str, Any]
    prompt: Prompt
    thinking: ThinkingCheck


def _header_number(request: Request, name: str) -> float | None:
    raw = request.headers.get(name)
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def create_app(
    *,
    context_window: int | None = None,
    policies: Sequence[model.Policy] = (),
    settings: Settings | None = None,
    max_recorded: int = 10_000,
) -> Starlette:
    """Builds the fake. ``app.state.fake`` is its :class:`MessagesFake`."""
    settings = settings or Settings()
    if context_window is not None:
        settings.context_window = context_window
    fake = MessagesFake(settings, policies, max_recorded)

    async def prelude(request: Request) -> tuple[bytes, Any]:
        body = await request.body()
        fake.recorder.record(request, body)
        if request.headers.get("x-fake-hang"):
            return body, base.HangResponse(fake.recorder, request)
        delay = _header_number(request, "x-fake-delay-ms")
        if delay:
            await asyncio.sleep(delay / 1000)
        status = _header_number(request, "x-fake-status")
        if status is not None:
            return body, errors.status_error(
                int(status), request.headers.get("x-fake-error-message")
            )
        return body, None

    def parse(body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None

    def checked(request: Request, payload: Any, *, needs_max_tokens: bool) -> Checked | str:
        """The counted prompt and thinking check of a valid request, else the API's message."""
        if payload is None:
            return "There was an error parsing the body of your request as JSON."
        problem = rules.structure_problem(payload, needs_max_tokens=needs_max_tokens)
        problem = problem or rules.unsupported_field_problem(
            payload, fake.settings.unsupported_fields
        )
        if problem is not None:
            return problem
        prompt = build_prompt(payload, fake.counter)
        problem = rules.breakpoint_problem(prompt)
        if problem is not None:
            return problem
        beta = betas(dict(request.headers))
        thinking = check_thinking(
            payload, prompt, beta, fake.settings.thinking_binding, fake.signer
        )
        if thinking.problem is not None:
            return thinking.problem
        if thinking.dropped:  # dropped blocks are neither shown to the model nor billed
            prompt = build_prompt(payload, fake.counter, frozenset(thinking.dropped))
        return Checked(payload, prompt, thinking)

    def rejected(request: Request, problem: str) -> Response:
        fake.recorder.event("rejected", request, status=400, message=problem)
        return errors.invalid_request(problem)

    async def messages(request: Request) -> Any:
        body, early = await prelude(request)
        if early is not None:
            return early
        valid = checked(request, parse(body), needs_max_tokens=True)
        if isinstance(valid, str):
            return rejected(request, valid)
        payload, prompt, thinking = valid.payload, valid.prompt, valid.thinking
        settings = fake.settings
        name = payload["model"]
        window = settings.window_for(name)
        if window is not None:
            refusal = errors.overflow(
                settings.refusal_style,
                window,
                prompt.total,
                payload["max_tokens"],
                settings.count_output,
            )
            if refusal is not None:
                fake.recorder.event(
                    "refused",
                    request,
                    status=refusal.status_code,
                    style=settings.refusal_style,
                    input_tokens=prompt.total,
                    max_tokens=payload["max_tokens"],
                    window=window,
                )
                return refusal
        turn = model.Turn(
            payload,
            dict(request.headers),
            prompt.total,
            loop_steps=settings.loop_steps,
            loop_lines=settings.loop_lines,
        )
        reply = await model.decide(fake.policies, turn)
        content = render_content(fake, payload, prompt, reply)
        output_tokens = max(1, sum(fake.counter.block(block) for block in content))
        usage = {
            **fake.cache.account(prompt, settings.cache_min_tokens).as_usage(),
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }
        beta = betas(dict(request.headers))
        transformations = thinking.transformations if BINDING_BETA in beta else None
        message_id = fake.next_message_id()
        fake.recorder.event(
            "answered",
            request,
            message_id=message_id,
            stop_reason=reply.stop,
            usage=usage,
            dropped=thinking.dropped,
            stream=bool(payload.get("stream")),
        )
        if payload.get("stream"):
            opening = render.message(message_id, name, [], None, usage, transformations)
            stream = render.events(
                opening,
                content,
                reply.stop,
                usage,
                settings.chunk_delay_ms / 1000,
                request.headers.get("x-fake-stream-error"),
                delta_usage=settings.delta_usage,
            )
            cut = _header_number(request, "x-fake-cut-after")
            return base.EventStreamResponse(
                fake.recorder, request, stream, None if cut is None else int(cut)
            )
        return Response(
            orjson.dumps(
                render.message(message_id, name, content, reply.stop, usage, transformations)
            ),
            media_type="application/json",
            headers={"request-id": errors.request_id()},
        )

    async def count_tokens(request: Request) -> Any:
        body, early = await prelude(request)
        if early is not None:
            return early
        if not fake.settings.count_route:
            return errors.error_response(404, "not_found_error", "Not Found")
        valid = checked(request, parse(body), needs_max_tokens=False)
        if isinstance(valid, str):
            return rejected(request, valid)
        total = valid.prompt.total
        fake.recorder.event("counted", request, input_tokens=total)
        return Response(orjson.dumps({"input_tokens": total}), media_type="application/json")

    async def list_models(request: Request) -> Any:
        _, early = await prelude(request)
        if early is not None:
            return early
        data = [
            {
                "type": "model",
                "id": name,
                "display_name": name,
                "created_at": "2025-01-01T00:00:00Z",
            }
            for name in fake.settings.models
        ]
        ids = [entry["id"] for entry in data]
        return Response(
            orjson.dumps(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": ids[0] if ids else None,
                    "last_id": ids[-1] if ids else None,
                }
            ),
            media_type="application/json",
        )

    async def not_found(request: Request) -> Any:
        _, early = await prelude(request)
        return early or errors.error_response(404, "not_found_error", "Not Found")

    async def requests_route(request: Request) -> Any:
        if request.method == "DELETE":
            # `?take=1`: the requests cleared in the same step, as the chat fake does, so one
            # arriving between a read and a clear (a background summary call) is never lost.
            taken = [recorded.to_json() for recorded in fake.recorder.requests]
            fake.recorder.requests.clear()
            if request.query_params.get("take"):
                return Response(orjson.dumps(taken), media_type="application/json")
            return Response(orjson.dumps({"cleared": True}), media_type="application/json")
        return Response(
            orjson.dumps([recorded.to_json() for recorded in fake.recorder.requests]),
            media_type="application/json",
        )

    async def events_route(request: Request) -> Any:
        if request.method == "DELETE":
            fake.recorder.events.clear()
            return Response(orjson.dumps({"cleared": True}), media_type="application/json")
        return Response(orjson.dumps(list(fake.recorder.events)), media_type="application/json")

    async def control_route(request: Request) -> Any:
        if request.method == "POST":
            try:
                fake.control(orjson.loads(await request.body() or b"{}"))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                return errors.invalid_request(f"bad control request: {exc}")
        state = {
            **asdict(fake.settings),
            "exact_token_counts": fake.recorder.counter.exact,
            "cache_entries": len(fake.cache),
        }
        return Response(orjson.dumps(state), media_type="application/json")

    every = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    app = Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/_requests", requests_route, methods=["GET", "DELETE"]),
            Route("/_events", events_route, methods=["GET", "DELETE"]),
            Route("/_control", control_route, methods=["GET", "POST"]),
            Route("/{rest:path}", not_found, methods=every),
        ]
    )
    app.state.fake = fake
    return app


def render_content(
    fake: MessagesFake, payload: dict[str, Any], prompt: Prompt, reply: model.Reply
) -> list[dict[str, Any]]:
    """The reply's blocks as the API sends them, thinking signed after the prompt's prefix."""
    blocks: list[model.Block] = list(reply.blocks)
    thinks = fake.settings.thinking == "auto" and thinking_type(payload) in ("enabled", "adaptive")
    if thinks and not any(isinstance(b, model.Thinking) for b in blocks):
        extra: list[model.Block] = [model.Thinking(_thought(reply))]
        if fake.settings.redacted_thinking:
            extra.append(model.RedactedThinking())
        blocks = extra + blocks
    omitted = (
        isinstance(payload.get("thinking"), dict)
        and payload["thinking"].get("display") == "omitted"
    )
    content: list[dict[str, Any]] = []
    origin = [unit.digest for unit in prompt.units]
    start = prompt.content_chain[-1] if prompt.content_chain else prompt.content_before(0)
    for block in blocks:
        chain = extend_chain(start, response_unit_digests(content))
        prefix = chain[-1] if chain else start
        made_after = origin + response_unit_digests(content)
        if isinstance(block, model.Text):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, model.ToolUse):
            tool_id = block.id or fake.next_tool_id()
            content.append(
                {"type": "tool_use", "id": tool_id, "name": block.name, "input": block.input}
            )
        elif isinstance(block, model.Thinking):
            shown = "" if omitted else block.text
            signature = fake.signer.sign(shown, prefix, made_after)
            content.append({"type": "thinking", "thinking": shown, "signature": signature})
        else:
            content.append(
                {"type": "redacted_thinking", "data": fake.signer.sign("", prefix, made_after)}
            )
    if thinks:
        fake.signer.note_thought([b["id"] for b in content if b["type"] == "tool_use"])
    return content


def _thought(reply: model.Reply) -> str:
    uses = [b for b in reply.blocks if isinstance(b, model.ToolUse)]
    if uses:
        return f"I will call {uses[0].name} next; the task is not finished yet."
    return "The task is done; I will answer in text."
