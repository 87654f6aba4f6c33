"""Liveness and readiness, for orchestrators and the compose healthcheck."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from proxy.summaries.stores import StoreBreaker
from proxy.summaries.stores.base import StoreUnavailable

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
    ok = all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
    )
