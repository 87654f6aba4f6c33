"""forward(hold=...): which upstream replies are read before the client sees anything.

A stub transport stands in for the upstream so each reply shape (status, length, chunking)
is exact; the integration tests (tests/integration/test_overflow_retry.py) cover the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.upstream import (
    MAX_ERROR_BODY,
    ReplyHandling,
    UpstreamRequest,
    forward,
    send_held,
)

UPSTREAM = UpstreamSettings(name="up", base_url="http://upstream.test/v1")  # type: ignore[arg-type]
HOLD = frozenset({400, 413, 422})


class Reply:
    def __init__(self, status: int, parts: Sequence[bytes], *, length: bool = True) -> None:
        self.status = status
        self.parts = list(parts)
        self.raw_headers = [(b"content-type", b"application/json")]
        if length:
            self.raw_headers.append((b"content-length", str(sum(map(len, parts))).encode()))
        self.read = 0
        self.closed = False

    def header(self, name: str) -> str | None:
        for key, value in self.raw_headers:
            if key.decode() == name:
                return value.decode()
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            self.read += 1
            yield part

    async def close(self) -> None:
        self.closed = True


class Transport:
    closed = False

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    async def send(self, *args: Any) -> Reply:
        return self.reply

    async def aclose(self) -> None:
        return None


async def _forward(reply: Reply, hold: frozenset[int] | None = HOLD) -> tuple[Any, list[Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {}

    run: Any = forward
    request = UpstreamRequest("POST", "http://upstream.test/v1/chat/completions", [], b"{}")
    handling = ReplyHandling(extra_headers=[(b"x-request-id", b"r1")], hold=hold)
    outcome = await run(Transport(reply), UPSTREAM, receive, send, request, handling)
    return outcome, sent


def _body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_a_small_refusal_is_held_and_nothing_is_sent() -> None:
    reply = Reply(400, [b'{"error":', b'{"message":"too long"}}'])
    outcome, sent = await _forward(reply)
    assert sent == []
    assert outcome.held is not None and outcome.held.status == 400
    assert outcome.held.body == b'{"error":{"message":"too long"}}'
    assert reply.closed

    relayed: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        relayed.append(message)

    relay: Any = send_held
    relayed_bytes = await relay(send, outcome.held, [(b"x-request-id", b"r1")])
    assert relayed_bytes == len(outcome.held.body)
    assert relayed[0]["status"] == 400
    assert (b"x-request-id", b"r1") in relayed[0]["headers"]
    assert _body(relayed) == b'{"error":{"message":"too long"}}'


async def test_success_and_other_statuses_stream_through() -> None:
    for status in (200, 401, 500):
        reply = Reply(status, [b"a", b"b"])
        outcome, sent = await _forward(reply)
        assert outcome.held is None and outcome.status == status
        assert sent[0]["status"] == status and _body(sent) == b"ab"


async def test_nothing_is_held_without_hold() -> None:
    outcome, sent = await _forward(Reply(400, [b"x"]), hold=None)
    assert outcome.held is None and sent[0]["status"] == 400 and _body(sent) == b"x"


async def test_a_long_error_is_relayed_whole() -> None:
    # Announced as too long: not read ahead at all.
    big = [b"x" * 40_000, b"y" * 40_000]
    outcome, sent = await _forward(Reply(400, big))
    assert outcome.held is None and _body(sent) == b"".join(big)
    # Length unknown: read up to the bound, then what was read goes first and the rest follows.
    chunked = [b"a" * 30_000, b"b" * 30_000, b"c" * 30_000, b"d" * 10]
    assert sum(map(len, chunked[:3])) > MAX_ERROR_BODY
    outcome, sent = await _forward(Reply(400, chunked, length=False))
    assert outcome.held is None and outcome.status == 400
    assert sent[0]["status"] == 400
    assert _body(sent) == b"".join(chunked)
    assert outcome.bytes_out == sum(map(len, chunked))


class Unreachable(Transport):
    async def send(self, *args: Any) -> Reply:
        raise ConnectionRefusedError("connection refused")


async def _forward_unreachable(hold_failures: bool) -> tuple[Any, list[Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    run: Any = forward
    request = UpstreamRequest("POST", "http://upstream.test/v1/chat/completions", [], b"{}")
    handling = ReplyHandling(hold=frozenset({200}), hold_failures=hold_failures)
    outcome = await run(Unreachable(Reply(200, [])), UPSTREAM, receive, send, request, handling)
    return outcome, sent


async def test_an_unreachable_upstream_is_held_for_a_caller_that_asks() -> None:
    """The recall loop's hidden rounds (api/_recall.py) hold a 502 instead of sending it: the
    loop has a better answer for the client (the request again, without recall)."""
    outcome, sent = await _forward_unreachable(True)
    assert sent == []
    assert outcome.held is not None and outcome.held.status == 502
    assert b"upstream_error" in outcome.held.body
    outcome, sent = await _forward_unreachable(False)  # everyone else: the 502 goes out
    assert outcome.held is None and outcome.status == 502
    assert sent[0]["status"] == 502
