"""Liveness and readiness, for orchestrators and the compose healthcheck."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from proxy.summaries.stores.base import StoreUnavailable

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state.proxy
    checks = {"upstream_client": "ok" if state.ready else "not ready"}
    if state.store is not None:
        try:
            await state.store.ping()
            checks[f"store:{state.store.name}"] = "ok"
        except StoreUnavailable as exc:
            checks[f"store:{state.store.name}"] = f"unavailable: {exc}"
    ok = all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
    )
