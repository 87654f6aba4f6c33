"""The proxy's own calls to an upstream (a summary, a model listing), over the transport that
forwards the clients' requests.

One HTTP stack: the same connection pool per upstream, the same ``upstreams[].timeouts`` (each
named when it runs out, :class:`~._transport.UpstreamTimeout`), the same errors
(:data:`~._transport.TRANSPORT_ERRORS`). Unlike a relayed reply, these bodies are read by the
proxy: read whole, bounded, and with a gzip or deflate coding undone (the transports ask for
no coding, but a server may apply one anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.config import Timeouts

from ._codings import decode_content
from ._transport import UpstreamRequest, UpstreamTransport

__all__ = ["CallReply", "ReplyUnreadable", "call_upstream"]


@dataclass(frozen=True, slots=True)
class CallReply:
    """A reply read whole: its status and its body, decoded."""

    status: int
    content: bytes


class ReplyUnreadable(CompactionProxyError):
    """The reply's body is over the call's limit, or in a coding the proxy does not undo."""


async def call_upstream(
    transport: UpstreamTransport,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    timeouts: Timeouts,
    *,
    limit: int,
) -> CallReply:
    """``method url`` with ``headers`` and ``body``; the reply read whole, at most ``limit``
    bytes. Raises what the transport raises for network trouble and timeouts, and
    :class:`ReplyUnreadable`."""
    request = UpstreamRequest(method, url, list(headers.items()), body)
    reply = await transport.send(request, timeouts)
    try:
        data = bytearray()
        async for chunk in reply.chunks():
            data += chunk
            if len(data) > limit:
                raise ReplyUnreadable(f"the reply is over {limit} bytes")
    finally:
        await reply.close()
    decoded = decode_content(bytes(data), reply.header("content-encoding"))
    if decoded is None:
        raise ReplyUnreadable("the reply's content coding is not one the proxy undoes")
    return CallReply(reply.status, decoded)
