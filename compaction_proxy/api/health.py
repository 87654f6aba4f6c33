"""Liveness and readiness, for orchestrators and the compose healthcheck."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from compaction_proxy.compaction.encodings import BUNDLED_ENCODINGS
from compaction_proxy.compaction.tokenizer_provider import TokenizerProvider
from compaction_proxy.summaries.stores import StoreBreaker
from compaction_proxy.summaries.stores.base import StoreUnavailable

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state.proxy
    checks = {"upstream_client": "ok" if state.ready else "not ready"}
    store = state.store
    if store is not None:
        # Through the breaker: while it holds the store down this answers at once, and once
        # the back-off is over this ping is the probe that can close it again.
        try:
            await store.ping()
            checks[f"store:{store.name}"] = "ok"
        except StoreUnavailable:
            # The breaker's text names the failure's type only: never a path or a host.
            checks[f"store:{store.name}"] = (
                store.readiness().describe() if isinstance(store, StoreBreaker) else "unavailable"
            )
    tokenizer, broken = tokenizer_check(state.compactor.tokenizers)
    checks["tokenizer"] = tokenizer
    ok = not broken and all(value == "ok" for name, value in checks.items() if name != "tokenizer")
    body: dict[str, object] = {"status": "ok" if ok else "unavailable"}
    # Behind server.api_keys a probe without a key gets the status only (compaction_proxy/
    # auth.py): the checks name the store and the encodings.
    if getattr(request.state, "detailed", True):
        body["checks"] = checks
    return JSONResponse(body, status_code=200 if ok else 503)


def tokenizer_check(tokenizers: TokenizerProvider) -> tuple[str, bool]:
    """The tokenizer's line in ``/readyz`` and whether it makes the proxy unready.

    A builtin encoding that does not load means a broken install: every OpenAI model would be
    counted by the estimator, so the instance should leave the rotation (503). An encoding
    named in the config that no file provides is reported but keeps the proxy ready: it was
    asked for, requests still succeed, and restarting would not bring the file.
    """
    estimated = sorted(name for name, est in tokenizers.states().items() if est)
    if not estimated:
        return "ok", False
    broken = [name for name in estimated if name in BUNDLED_ENCODINGS]
    custom = [name for name in estimated if name not in BUNDLED_ENCODINGS]
    parts = []
    if broken:
        parts.append(f"unavailable: {', '.join(broken)} (broken install; reinstall the proxy)")
    if custom:
        parts.append(f"estimating: {', '.join(custom)} (no file; 4 characters a token)")
    return "; ".join(parts), bool(broken)
