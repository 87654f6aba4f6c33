"""Liveness and readiness, for orchestrators and the compose healthcheck.

Readiness means "can serve". Only what stops this instance from answering requests makes it
unready (503): a shutdown under way, the upstream client closed, a broken tokenizer install.
A checkpoint store that is down does not: every request is still served, compacted without
checkpoints (reads down) or without storing new ones (writes down), so the store is reported
as *degraded* (200, with the detail). Otherwise a Redis outage would take every replica out of
the load balancer's rotation at once, for an optimisation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from compaction_proxy.checkpoints import CheckpointStore, StoreBreaker, StoreUnavailable
from compaction_proxy.compaction.encodings import BUNDLED_ENCODINGS
from compaction_proxy.compaction.tokenizer_provider import TokenizerProvider

from ._context import AppState

router = APIRouter()

Status = Literal["ok", "degraded", "unavailable"]


@dataclass(frozen=True, slots=True)
class Ready:
    """The verdict of ``/readyz``: its status and one line per check."""

    status: Status
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def status_code(self) -> int:
        return 503 if self.status == "unavailable" else 200

    def body(self, *, detailed: bool = True) -> dict[str, object]:
        """``detailed`` False: the status only. Behind server.api_keys a probe without a key
        gets no checks (compaction_proxy/http/_auth.py): they name the store and the encodings."""
        if not detailed:
            return {"status": self.status}
        return {"status": self.status, "checks": self.checks}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    ready = await readiness(request.app.state.proxy)
    detailed = getattr(request.state, "detailed", True)
    return JSONResponse(ready.body(detailed=detailed), status_code=ready.status_code)


async def readiness(state: AppState) -> Ready:
    """What ``/readyz`` answers: unavailable (503) only for what prevents serving."""
    checks: dict[str, str] = {}
    blocking: list[str] = []
    degraded: list[str] = []

    if state.shutting_down or state.drain.begun:
        checks["server"] = "shutting down"
        blocking.append("server")
    else:
        checks["server"] = "ok"
    closed = state.transport.closed
    checks["upstream_client"] = "not ready" if closed else "ok"
    if closed:
        blocking.append("upstream_client")

    name = f"store:{state.store.name}"
    checks[name] = await store_check(state.store)
    if checks[name] != "ok":
        degraded.append(name)

    tokenizer, broken = tokenizer_check(state.compactor.tokenizers)
    checks["tokenizer"] = tokenizer
    if broken:
        blocking.append("tokenizer")

    status: Status = "unavailable" if blocking else "degraded" if degraded else "ok"
    return Ready(status, checks)


async def store_check(store: CheckpointStore) -> str:
    """The store's line: ``ok``, or ``degraded:`` with which side (reads, writes) is down and
    since when. The text names the failure's type only: never a path or a host."""
    try:
        # Through the breaker: while it holds the reads down this answers at once, and once
        # the back-off is over this ping is the probe that can bring them back.
        await store.ping()
    except StoreUnavailable:
        if not isinstance(store, StoreBreaker):
            return "degraded: unavailable"
    if isinstance(store, StoreBreaker):
        return store.readiness().describe()
    return "ok"


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
