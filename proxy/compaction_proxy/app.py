"""The ASGI application: a thin plain-ASGI front for /v1, FastAPI for everything else.

The forwarding routes sit in front of FastAPI as raw ASGI so the hot path has no routing,
dependency solving or response-class machinery; the pages and JSON endpoints that are not on
the hot path (health, metrics, dashboard) use FastAPI normally. Every request passes the same
key check first: `/v1/*` against `server.api_keys`, every other path (unknown ones included)
through compaction_proxy/http/_auth.py's `side_access`. A path or method no route serves gets a 404
or 405 in OpenAI's error shape, as every error the proxy makes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from compaction_proxy import __version__
from compaction_proxy.api import (
    ARCHIVE_PATH,
    AppState,
    Finished,
    RequestContext,
    RouteOutcome,
    archive_entry,
    caller_key,
    compacted,
    count_tokens,
    dashboard_router,
    finished,
    health_router,
    metrics_router,
    passthrough,
    preview,
    send_unauthorized_page,
)
from compaction_proxy.checkpoints import Archive, StoredValues, make_store
from compaction_proxy.config import Settings, load_settings
from compaction_proxy.config.preflight import validate_summarization_config
from compaction_proxy.engine import (
    Compactor,
    DegradedPath,
    RecallDesk,
    build_flow,
    settle_collector,
)
from compaction_proxy.http import (
    ACCESS,
    Access,
    ArrivedAfterCut,
    ClientGone,
    Drain,
    Message,
    Presented,
    ProxyError,
    Receive,
    Scope,
    Send,
    UnsafePath,
    access_line,
    error_body,
    first_match,
    header,
    needs_normalizing,
    normalize,
    presented_keys,
    retry_after_header,
    send_bytes,
    send_error,
    shutdown_error,
    side_access,
)
from compaction_proxy.observability.telemetry import Telemetry
from compaction_proxy.upstream import Router, UpstreamTransport, WindowBook, make_transport
from compaction_proxy.wire import (
    BEARER,
    WireFormat,
    format_for_count_path,
    format_for_path,
    format_owner_of,
)

log = logging.getLogger("compaction_proxy.app")

# Unique per process start (random) and per request (a counter): no syscall per request.
_ID_PREFIX = os.urandom(11).hex()
_ID_COUNTER = itertools.count(1)
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
_UNAUTHORIZED = (
    "missing or invalid API key for this proxy: send one of the keys in server.api_keys as "
    "'Authorization: Bearer <key>' or 'x-api-key: <key>'"
)
_DASHBOARD_PAGE = "/dashboard"


class ProxyApp:
    """Root ASGI callable: request ids, inbound auth, dispatch, one access-log line."""

    def __init__(self, settings: Settings, edge: AppState | None = None) -> None:
        """`edge`: what `build_edge` made for `settings`; None: built here (in-process tests
        build it themselves, around a client of their own)."""
        self.state = edge if edge is not None else build_edge(settings)
        self.telemetry = self.state.telemetry
        self._api_keys = [k.get_secret_value().encode() for k in settings.server.api_keys]
        self._metrics_keys = [k.get_secret_value().encode() for k in settings.server.metrics_keys]
        self._upstreams = {u.name: u for u in settings.upstreams}
        self.fastapi = _build_fastapi(self.state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fastapi(scope, receive, send)  # lifespan (and websockets, refused)
            return
        ctx = RequestContext(
            state=self.state,
            request_id=_request_id(scope),
            scope=scope,
            receive=receive,
            send=send,
        )
        ctx.response_headers.append((b"x-request-id", ctx.request_id.encode()))
        path: str = scope["path"]
        drain = self.state.drain
        flight = drain.enter()
        outcome: RouteOutcome | None = None  # None: no route answered (errors, side paths)
        try:
            if drain.cutting:
                raise ArrivedAfterCut
            path = _safe_path(scope)
            if path.startswith("/v1/"):
                # The hot path sends straight to the server: every response it makes carries
                # ctx.response_headers (the request id among them), no wrapper per message.
                self._authenticate(ctx, scope)
                if path == "/v1/compaction/preview":
                    outcome = await preview(ctx)
                elif path.startswith(ARCHIVE_PATH):
                    outcome = await archive_entry(ctx)
                else:
                    outcome = await self._forward(ctx)
                    self._note_accepted(ctx, scope, outcome)
            else:
                access = self._side_access(ctx, scope, path)
                if access is Access.DENIED:
                    ctx.status = 401
                    if path == _DASHBOARD_PAGE and self.state.settings.dashboard.enabled:
                        await send_unauthorized_page(send, ctx.response_headers)
                        return
                    raise ProxyError(401, _UNAUTHORIZED, code="invalid_api_key")
                state = scope.setdefault("state", {})
                state["request_context"] = ctx
                state["detailed"] = access is Access.FULL
                await self.fastapi(scope, receive, _with_request_id(ctx, send))
        except ProxyError as error:
            ctx.status = error.status
            headers = ctx.response_headers
            if error.status == 401:
                headers = [*headers, (b"www-authenticate", b"Bearer")]
            await _send_error(send, error, headers, format_owner_of(scope.get("method"), path))
        except ClientGone:
            ctx.status = 499
        except (asyncio.CancelledError, ArrivedAfterCut):
            if not drain.owns(flight):
                raise
            await _answer_cut(ctx, send, scope, path)
        finally:
            drain.leave(flight)
            # The one place a request is recorded: the context's edge facts with the route's
            # frozen outcome.
            done = finished(ctx, outcome)
            self.telemetry.record_request(done, scope.get("method"), path)
            _calibrate(ctx.state, done)
            _access_log(done, scope)

    async def _forward(self, ctx: RequestContext) -> RouteOutcome:
        scope = ctx.scope
        wire = format_for_path(scope["method"], scope["path"])
        if wire is not None:
            return await compacted(wire, ctx)
        counted = format_for_count_path(scope["method"], scope["path"])
        if counted is not None:
            return await count_tokens(counted, ctx)
        return await passthrough(ctx)

    def _authenticate(self, ctx: RequestContext, scope: Scope) -> None:
        """One rule for every `/v1` route: any credential header that holds a key of
        `server.api_keys` lets the request in (compaction_proxy/http/_auth.py). The header that
        held it names the caller's namespaces (`ctx.credential`), so a foreign key beside it
        (a client's own `Authorization`) changes nothing."""
        if not self._api_keys:
            return
        matched = first_match(presented_keys(scope["headers"]), self._api_keys)
        if matched is None:
            raise ProxyError(401, _UNAUTHORIZED, "invalid_request_error", "invalid_api_key")
        ctx.authenticated = True
        ctx.credential = matched.value.decode("latin-1")

    def _side_access(self, ctx: RequestContext, scope: Scope, path: str) -> Access:
        """The key check of every path outside /v1 (compaction_proxy/http/_auth.py). The dashboard
        page also takes `?key=`, so a browser can open it (the page then sends a header)."""
        if not self._api_keys and not self._metrics_keys:
            return Access.FULL
        presented = presented_keys(scope["headers"])
        if path == _DASHBOARD_PAGE:
            query = scope.get("query_string", b"").decode("latin-1")
            key = dict(parse_qsl(query)).get("key", "").encode()
            if key:
                presented.append(Presented(key, key))
        return side_access(path, presented, self._api_keys, self._metrics_keys)

    def _note_accepted(self, ctx: RequestContext, scope: Scope, outcome: RouteOutcome) -> None:
        """Remember the caller's key when an upstream that checks keys accepted it: the proxy
        may then spend an operator's key for this caller (compaction_proxy/http/_admission.py). A
        reply to a request that carried the operator's key, or the proxy's own, proves
        nothing about the caller's. The key is read where the request's format takes one
        (`Authorization`; `x-api-key` too on Anthropic's), and only its keyed hash is kept."""
        if ctx.authenticated or outcome.sent is None or not 200 <= outcome.sent.status < 300:
            return
        upstream = self._upstreams.get(ctx.upstream or "")
        if upstream is None or upstream.api_key is not None or upstream.keyless:
            return
        wire = format_owner_of(scope.get("method"), scope["path"])
        caller = caller_key(scope, BEARER if wire is None else wire.auth)
        self.state.known_callers.accepted(None if caller is None else caller.key)


async def _send_error(
    send: Send, error: ProxyError, headers: list[tuple[bytes, bytes]], wire: WireFormat | None
) -> None:
    """An error the proxy answers itself, in the shape of the path's wire format (OpenAI's
    everywhere else)."""
    if wire is None:
        await send_error(send, error, headers)
        return
    body = wire.error_body(error.message, type=error.type, code=error.code, param=error.param)
    await send_bytes(send, error.status, body, headers)


async def _answer_cut(ctx: RequestContext, send: Send, scope: Scope, path: str) -> None:
    """A request the shutdown cut before it reached the forwarder (reading its body,
    compacting, calling the summarizer): a 503 in the path format's shape with ``Retry-After``
    (compaction_proxy/http/_drain.py). The forwarder answers the ones it was relaying itself."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()
    ctx.status = 503
    ctx.cut_by_shutdown = True
    error = shutdown_error(ctx.state.drain.grace_seconds)
    headers = [*ctx.response_headers, retry_after_header()]
    try:
        await _send_error(send, error, headers, format_owner_of(scope.get("method"), path))
    except RuntimeError:
        # The response had started (the server refuses a second start): nothing more can be
        # said; the server closes the connection, and the client sees the reply cut.
        log.debug("request %s cut by the shutdown after its reply started", ctx.request_id)


def _safe_path(scope: Scope) -> str:
    """Resolve dot segments and duplicate slashes before routing (compaction_proxy/http/_paths.py).

    The scope is rewritten so routing, logs and the forwarded URL all see the same path; a
    path that leaves /v1 is a 400 and never reaches an upstream.
    """
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    if not needs_normalizing(raw):
        return str(scope["path"])
    try:
        safe = normalize(raw)
    except UnsafePath as error:
        raise ProxyError(400, str(error), "invalid_request_error", "invalid_path") from None
    scope["path"] = safe.path
    scope["raw_path"] = safe.raw
    return safe.path


def _calibrate(state: AppState, done: Finished) -> None:
    """Feed the upstream's prompt-token count for a compacted request back to the triggers."""
    report = done.report
    if report is None or not done.upstream_prompt_tokens or report.mode == "dry-run":
        return
    state.compactor.calibrate(report.model, done.upstream_prompt_tokens, report.tokens_after)


def _with_request_id(ctx: RequestContext, send: Send) -> Send:
    """For FastAPI's routes: add the request id to the response and note the status."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            ctx.status = message["status"]
            message["headers"] = [*message["headers"], *ctx.response_headers]
        await send(message)

    return wrapped


def _request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    if given is not None and _REQUEST_ID.match(given):
        return given.decode()
    return f"{_ID_PREFIX}{next(_ID_COUNTER):010x}"


def _access_log(ctx: Finished, scope: Scope) -> None:
    if not ACCESS.isEnabledFor(logging.INFO):
        return
    # Serialized here, once, with orjson: the formatter passes the line through untouched.
    ACCESS.info(
        access_line(
            {
                "request_id": ctx.request_id,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "model": ctx.model,
                "upstream": ctx.upstream,
                "upstream_request_id": ctx.upstream_request_id,
                "status": ctx.status,
                "bytes_in": ctx.bytes_in,
                "bytes_out": ctx.bytes_out,
                "duration_ms": round(ctx.elapsed_ms, 2),
                **({"cut": "shutdown"} if ctx.cut_by_shutdown else {}),
                **_report_fields(ctx),
            }
        )
    )


def _report_fields(ctx: Finished) -> dict[str, object]:
    report = ctx.report
    if report is None:
        return {}
    fields: dict[str, object] = {
        "tokens_before": report.tokens_before,
        "tokens_after": report.tokens_after,
        "strategies": list(report.changed_by),
    }
    if ctx.overflow_outcome is not None:
        fields["overflow"] = ctx.overflow_outcome
        fields["retries"] = ctx.compaction_retries
    return fields


def _build_fastapi(state: AppState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.compactor.warm_up()
        if state.settings.server.allow_anonymous_spend and not state.settings.server.api_keys:
            log.warning(
                "server.allow_anonymous_spend is true: callers the proxy has not authenticated "
                "spend the upstreams' api_keys (requests and summaries); set server.api_keys "
                "unless only your own clients can reach this proxy"
            )
        # Learn when the server's shutdown signal comes, to answer what is still running.
        unwatch = state.drain.watch_signals()
        settle_collector()
        log.info(
            "ready",
            extra={
                "upstreams": [u.name for u in state.settings.upstreams],
                "transport": state.settings.server.upstream_transport,
            },
        )
        try:
            yield
        finally:
            unwatch()
            await close_edge(state)

    app = FastAPI(
        title="compaction-proxy",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.proxy = state
    app.add_exception_handler(StarletteHTTPException, _route_error)
    app.include_router(health_router)
    app.include_router(metrics_router)
    if state.settings.dashboard.enabled:
        app.include_router(dashboard_router)
    return app


async def _route_error(request: Request, exc: Exception) -> Response:
    """A path no route serves (404), or a method its route does not take (405), in OpenAI's
    error shape (the one body every proxy error has); the 405 keeps Starlette's `Allow`."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    where = f"{request.method} {request.url.path[:200]}"
    code: str | None
    if exc.status_code == 404:
        code = "not_found"
        message = (
            f"no route for {where}: the proxy serves /v1/* (forwarded upstream) and its own "
            "/healthz, /readyz, /metrics and /dashboard"
        )
    elif exc.status_code == 405:
        code = "method_not_allowed"
        message = f"method not allowed for {where} (allowed: {headers.get('Allow', '-')})"
    else:
        code, message = None, str(exc.detail)
    body = error_body(message, type="invalid_request_error", code=code)
    return Response(
        body, status_code=exc.status_code, media_type="application/json", headers=headers
    )


async def close_edge(state: AppState) -> None:
    """Close what :func:`build_edge` built, in the order its parts use each other: the
    lifespan's end, and in-process tests that build the edge without a lifespan."""
    state.shutting_down = True
    await state.windows.close()
    await state.flow.preparer.close()
    await state.transport.aclose()
    await state.store.close()
    if state.archive is not None and state.archive.store is not state.store:
        await state.archive.store.close()  # the memory backend's archive of its own
    state.compactor.close()


def build_edge(
    settings: Settings,
    *,
    transport: UpstreamTransport | None = None,
) -> AppState:
    """The whole edge, built in one place; the lifespan only warms it up and closes it.

    Nothing here connects anywhere: the store, the published windows and the aiohttp session
    connect on first use, inside the server's event loop. `transport` carries every call to an
    upstream, the forwarded requests and the proxy's own (the summarizer, published windows);
    None: the configured `server.upstream_transport` (compaction_proxy/upstream/_transport.py).
    """
    if settings.summarization.enabled:
        validate_summarization_config(settings)
    server = settings.server
    compactor = Compactor(settings)
    store = make_store(settings.store)
    if transport is None:
        transport = make_transport(server)
    shared = transport
    windows = WindowBook(settings, StoredValues(store), lambda: shared, catalog=compactor.catalog)
    flow = build_flow(settings, compactor, store, transport, windows)
    archive, desk = _recall(settings, compactor, flow.archive.archive, flow.degraded.recall)
    telemetry = Telemetry(settings, tokenizers=compactor.tokenizers)
    telemetry.watch_windows(windows)
    telemetry.watch_store(store)
    telemetry.watch_degraded(flow.degraded)
    if flow.summarizer is not None:
        telemetry.watch_withheld(flow.withheld)
        telemetry.watch_summarizer(flow.summarizer.stats)
        if flow.preparer.enabled:
            telemetry.watch_preparer(flow.preparer.stats)
    return AppState(
        settings=settings,
        router=Router(settings.upstreams),
        compactor=compactor,
        store=store,
        transport=transport,
        windows=windows,
        flow=flow,
        telemetry=telemetry,
        archive=archive,
        recall_desk=desk,
        drain=Drain(server.graceful_shutdown_seconds),
        proxy_keys=tuple(k.get_secret_value() for k in server.api_keys),
    )


def _recall(
    settings: Settings, compactor: Compactor, archive: Archive | None, health: DegradedPath
) -> tuple[Archive | None, RecallDesk | None]:
    """The archive (the flow's, which writes it: the checkpoints' store, or the memory
    backend's archive store, compaction_proxy/checkpoints/_factory.py) and the recall desk,
    when any compaction block enables recall; answers are counted with the default encoding
    (the desk serves every model, and a page's size is a bound, not a bill)."""
    blocks = [settings.compaction, *(m.compaction for m in settings.models.values())]
    if archive is None or not any(block is not None and block.recall.enabled for block in blocks):
        return None, None
    recall = settings.compaction.recall
    encoding = settings.compaction.tokenizer.default_encoding

    def count(text: str) -> int:
        return compactor.tokenizers.get(encoding).count_text(text)

    return archive, RecallDesk(archive, recall, count, health)


def create_app(settings: Settings | None = None) -> ProxyApp:
    return ProxyApp(settings or load_settings())


def create_app_from_env() -> ProxyApp:
    """Factory for uvicorn workers: each worker process reads the same config file."""
    return ProxyApp(load_settings(os.environ.get("COMPACTION_PROXY_CONFIG") or None))
