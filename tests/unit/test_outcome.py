"""What leaves a route is frozen, and the finished request is read from it.

The forwarder's outcome, an attempt and the route's outcome are values: a step that would edit
one after the fact (the access log, the metrics, a retry) fails loudly instead of changing
what another reader saw. The finished request, the one value the access log, metrics and
dashboard read, takes the route's figures from the outcome and the edge's from the context.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from compaction_proxy.api import AppState, RequestContext, RouteOutcome, finished
from compaction_proxy.api._attempts import Attempt
from compaction_proxy.api._outcome import relayed
from compaction_proxy.config import Settings
from compaction_proxy.upstream import Outcome


@pytest.mark.parametrize("cls", [Outcome, Attempt, RouteOutcome])
def test_what_leaves_a_route_is_frozen(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen, f"{cls.__name__} must be frozen"


def test_an_outcome_cannot_be_edited_after_the_fact() -> None:
    outcome = relayed(Outcome(200, bytes_out=5), retries=1, overflow="fixed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.status = 500  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.sent.bytes_out = 0  # type: ignore[misc,union-attr]


def _context() -> RequestContext:
    state = AppState(
        settings=Settings(),
        router=None,  # type: ignore[arg-type]
        compactor=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        transport=None,  # type: ignore[arg-type]
        windows=None,  # type: ignore[arg-type]
        flow=None,  # type: ignore[arg-type]
        telemetry=None,  # type: ignore[arg-type]
    )
    ctx = RequestContext(state, "r1", {"type": "http"}, _never, _never)
    ctx.model, ctx.upstream, ctx.bytes_in = "gpt-4o", "openai", 42
    return ctx


async def _never(*message: Any) -> Any:
    raise AssertionError("the record never reads or sends")


def test_the_finished_request_reads_the_route_outcome() -> None:
    sent = Outcome(
        200,
        bytes_out=7,
        client_gone=True,
        upstream_request_id="up-1",
        upstream_seconds=0.5,
        prompt_tokens=123,
        cut_by_shutdown=True,
    )
    done = finished(_context(), relayed(sent, None, "hit", 2, "refused_again"))
    assert done.status == 499  # the client left before its reply was whole
    assert (done.model, done.upstream, done.bytes_in, done.bytes_out) == ("gpt-4o", "openai", 42, 7)
    assert (done.upstream_request_id, done.upstream_seconds) == ("up-1", 0.5)
    assert done.upstream_prompt_tokens == 123
    assert done.cut_by_shutdown
    assert (done.checkpoint, done.compaction_retries, done.overflow_outcome) == (
        "hit",
        2,
        "refused_again",
    )


def test_without_an_outcome_the_edge_status_is_recorded() -> None:
    ctx = _context()
    ctx.status, ctx.cut_by_shutdown = 503, True
    done = finished(ctx, None)
    assert (done.status, done.cut_by_shutdown, done.bytes_out, done.report) == (503, True, 0, None)
