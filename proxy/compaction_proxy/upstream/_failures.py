"""A failure to talk to an upstream (refused, unresolved, cut, too slow) as the client reads it:
502 or 504 with a code that says which, and the upstream's name, never its key."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
import httpx

from compaction_proxy.config import UpstreamSettings

from ._transport import UpstreamTimeout


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """What went wrong talking to an upstream, as the client will read it."""

    status: int
    code: str
    message: str


def classify_error(exc: BaseException, upstream: UpstreamSettings) -> UpstreamFailure:
    """Map a transport exception (httpx or aiohttp) to 502 (unreachable) or 504 (too slow).

    The cause chain decides, not the outer class: httpcore wraps the OSError that says
    whether a connection was refused or its name did not resolve.
    """
    where = f"upstream '{upstream.name}' ({upstream.display_url})"
    chain = list(_cause_chain(exc))
    if any(isinstance(e, socket.gaierror) for e in chain) or any(
        isinstance(e, aiohttp.ClientConnectorDNSError) for e in chain
    ):
        return UpstreamFailure(502, "upstream_dns_error", f"{where}: DNS lookup failed")
    for e in chain:
        if isinstance(e, ConnectionRefusedError) or (
            isinstance(e, aiohttp.ClientConnectorError)
            and not isinstance(e, aiohttp.ClientConnectorDNSError)
        ):
            return UpstreamFailure(
                502, "upstream_unreachable", f"{where}: connection refused or unreachable"
            )
    for e in chain:
        if isinstance(e, aiohttp.ServerDisconnectedError | httpx.RemoteProtocolError):
            return UpstreamFailure(
                502, "upstream_protocol_error", f"{where}: connection closed unexpectedly"
            )
    if any(_is_timeout(e) for e in chain):
        phase = _timeout_phase(chain)
        return UpstreamFailure(504, "upstream_timeout", f"{where}: timed out {phase}")
    if any(isinstance(e, httpx.ConnectError | OSError) for e in chain):
        return UpstreamFailure(502, "upstream_unreachable", f"{where}: cannot connect")
    return UpstreamFailure(502, "upstream_error", f"{where}: {type(exc).__name__}")


def _is_timeout(e: BaseException) -> bool:
    return isinstance(e, httpx.TimeoutException | asyncio.TimeoutError | aiohttp.ServerTimeoutError)


def _timeout_phase(chain: list[BaseException]) -> str:
    for e in chain:
        if isinstance(e, UpstreamTimeout):  # the transport names the timeout that ran out
            return e.description
        if isinstance(e, httpx.ConnectTimeout | aiohttp.ConnectionTimeoutError):
            return "while connecting"
        if isinstance(e, httpx.ReadTimeout | aiohttp.SocketTimeoutError):
            return "waiting for the response"
        if isinstance(e, httpx.PoolTimeout):
            return "waiting for a free connection"
        if isinstance(e, httpx.WriteTimeout):
            return "sending the request"
    return "waiting for the response"


def _cause_chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
