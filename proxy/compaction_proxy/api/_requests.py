"""What the routes share: the upstream a request goes to (by the rule of
compaction_proxy/upstream/_routing.py), its headers, the window it is budgeted for, who is
asking (credential, the caller's own key, tenant, whether an operator credential may be spent
for them), and the report headers of its compaction. The body itself is read by
compaction_proxy/wire/; where a caller's key arrives and which header changes a window, the
request's format says (``WireFormat.auth``, ``WireFormat.window_option``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from compaction_proxy.compaction import CompactionResult, Mode
from compaction_proxy.config import UpstreamSettings
from compaction_proxy.http import (
    ALLOWED,
    PREVIEW_UNAUTHENTICATED,
    UNKNOWN_CALLER,
    Scope,
    Spending,
    bad_request,
    header,
)
from compaction_proxy.upstream import ModelRead, Window
from compaction_proxy.wire import BEARER, CallerKey, NativeRequest, UpstreamAuth, View, WireFormat

from ._context import RequestContext

log = logging.getLogger("compaction_proxy.chat")

_MODES = {
    b"off": None,
    b"dry-run": Mode.DRY_RUN,
    b"dry-run-local": Mode.DRY_RUN_LOCAL,
    b"force": Mode.FORCE,
    b"on": Mode.NORMAL,
}


def route(ctx: RequestContext, read: ModelRead) -> UpstreamSettings:
    """The upstream for a body that says ``read`` about its model (sets ``ctx.model``)."""
    if read.model is not None:
        ctx.model = read.model
    return ctx.state.router.route(read)


def readable_encoding(ctx: RequestContext) -> None:
    """Refuse a compressed body when the proxy must read its model (it never inflates)."""
    ctx.state.router.check_encoding(header(ctx.scope, b"content-encoding"))


def compaction_mode(scope: Scope) -> Mode | None:
    """The `X-Compaction` header: off | dry-run | dry-run-local | force (absent: normal).
    None means off."""
    raw = header(scope, b"x-compaction")
    if raw is None:
        return Mode.NORMAL
    value = raw.strip().lower()
    if value not in _MODES:
        raise bad_request(
            "X-Compaction must be one of off, dry-run, dry-run-local, force "
            f"(got {raw.decode('latin-1')!r})",
            param="X-Compaction",
            code="invalid_header",
        )
    return _MODES[value]


def report_headers(result: CompactionResult, mode: Mode) -> list[tuple[bytes, bytes]]:
    report = result.report
    strategies = ",".join(report.changed_by) or "none"
    headers = [
        (b"x-compaction-tokens-before", str(report.tokens_before).encode()),
        (b"x-compaction-tokens-after", str(report.tokens_after).encode()),
        (b"x-compaction-strategies", strategies.encode()),
    ]
    if mode in (Mode.DRY_RUN, Mode.DRY_RUN_LOCAL):
        headers.append((b"x-compaction-dry-run", b"true"))
    limit = report.output_limit
    if limit is not None and limit.lowered:
        # The output limit forwarded (a dry run's: the one that would be); the warning below
        # says what was asked and why.
        headers.append((b"x-compaction-output-limit", str(limit.forwarded).encode()))
    kept = report.summary_kept
    if kept is not None:  # what the summaries this run wrote kept on their own
        headers.append((b"x-compaction-summary-kept", header_safe(kept.figure())))
    for warning in report.warnings:
        headers.append((b"x-compaction-warning", header_safe(warning)))
    return headers


def header_safe(text: str) -> bytes:
    cleaned = " ".join(text.split())
    return cleaned[:500].encode("ascii", "replace")


async def effective_window(
    ctx: RequestContext,
    upstream: UpstreamSettings,
    model: str,
    wire: WireFormat,
    spend: Spending | None = None,
) -> Window:
    """The window to budget `model` for (compaction_proxy/upstream/_windows.py), as the
    request's format reads its headers (`window_option`).

    `spend`: whether a listing may be read with the upstream's own `api_key` for this caller
    (default: :func:`spending`). Never fails the request: a problem here means budgeting with
    the catalog's window.
    """
    scope = ctx.scope
    if spend is None:
        spend = spending(ctx, wire.auth)
    try:
        return await ctx.state.windows.window_for(
            upstream,
            model,
            None if ctx.authenticated else caller_key(scope, wire.auth),
            may_spend=spend.allowed,
            auth=wire.auth,
            option=wire.window_option(model, scope["headers"]),
        )
    except Exception:
        log.exception("window lookup failed; using the catalog's window")
    return Window(ctx.state.compactor.catalog.facts_for(model).context_window, "default")


def credential(ctx: RequestContext) -> str | None:
    """Who is asking, for the checkpoint namespace: the key the client presented to the proxy
    (the header that held a key of `server.api_keys`), or, without proxy keys, the one it
    passes to the upstream (`Authorization`, else `x-api-key`). Hashed before it is used
    anywhere."""
    if ctx.credential is not None:
        return ctx.credential
    value = header(ctx.scope, b"authorization") or header(ctx.scope, b"x-api-key")
    return value.decode("latin-1") if value else None


def caller_key(scope: Scope, auth: UpstreamAuth = BEARER) -> CallerKey | None:
    """The caller's own key, from the first of the headers the request's format takes one in
    (`auth.caller_headers`: `Authorization` for OpenAI's APIs; `x-api-key`, then
    `Authorization`, for Anthropic's). For the summarizer and the window listing, and, hashed,
    for admission; never logged."""
    for name in auth.caller_headers:
        value = header(scope, name.encode("latin-1"))
        if value and value.strip():
            return CallerKey(name, value.decode("latin-1"))
    return None


def tenant(scope: Scope) -> str | None:
    """`X-Compaction-Tenant`: an explicit namespace an app gives each of its end users; part of
    the checkpoint key (compaction_proxy/checkpoints/_keys.py), never forwarded."""
    value = header(scope, b"x-compaction-tenant")
    return value.decode("latin-1") if value and value.strip() else None


def spending(ctx: RequestContext, auth: UpstreamAuth = BEARER) -> Spending:
    """Whether the proxy may spend an operator credential for this request's caller
    (compaction_proxy/http/_admission.py): authenticated by `server.api_keys`, a key an upstream
    accepted recently (read where the request's format takes keys, `auth`), or
    `server.allow_anonymous_spend`."""
    if ctx.authenticated or ctx.state.settings.server.allow_anonymous_spend:
        return ALLOWED
    caller = caller_key(ctx.scope, auth)
    if ctx.state.known_callers.known(None if caller is None else caller.key):
        return ALLOWED
    return UNKNOWN_CALLER


def preview_spending(ctx: RequestContext) -> Spending:
    """The preview returns the summary it makes: an operator credential pays for it only for
    a caller authenticated by `server.api_keys`, whatever else would let the caller in."""
    return ALLOWED if ctx.authenticated else PREVIEW_UNAUTHENTICATED


def native_request(
    scope: Scope, wire: WireFormat, body: Mapping[str, Any], view: View, native: bool = False
) -> NativeRequest | None:
    """The request in its own format's form, for a format whose summary call writes the
    cache-aligned prefix itself (``SummaryCall.prefix``, compaction_proxy/wire/format.py): the
    client's parsed body, the view's way back, and the client's headers that call repeats (its
    betas, which the prefix's content may need). None for every other format."""
    call = wire.summary
    if call is None or call.prefix is None:
        return None
    wanted = {name.encode(): name for name in call.repeats}
    found: dict[str, list[str]] = {}
    for key, value in scope["headers"]:
        name = wanted.get(bytes(key))
        if name is not None:
            found.setdefault(name, []).append(bytes(value).decode("latin-1"))
    if native:
        for name, value in call.native_listed:
            listed = found.setdefault(name, [])
            if value not in ",".join(listed).replace(" ", "").split(","):
                listed.append(value)
    headers = {k: ", ".join(v) for k, v in found.items()}
    return NativeRequest(body, view.lower, headers, native)
