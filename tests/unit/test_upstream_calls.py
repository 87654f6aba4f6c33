"""The proxy's own calls to an upstream (a summary, a model listing) over the forwarding
transport: read whole, bounded, a gzip or deflate coding undone, failures named."""

from __future__ import annotations

import gzip
import zlib

import pytest
import respx

from compaction_proxy.config import ServerSettings, Timeouts
from compaction_proxy.upstream import (
    HttpxUpstream,
    ReplyUnreadable,
    call_upstream,
    plain_httpx_client,
)
from compaction_proxy.upstream._codings import decode_content

URL = "http://upstream.test/v1/models"


@pytest.fixture
async def transport() -> HttpxUpstream:
    return HttpxUpstream(plain_httpx_client(ServerSettings()))


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        (None, b'{"data": []}'),
        ("gzip", gzip.compress(b'{"data": []}', mtime=0)),
        ("deflate", zlib.compress(b'{"data": []}')),
    ],
    ids=["identity", "gzip", "deflate"],  # the same on every xdist worker
)
async def test_a_reply_is_read_whole_and_decoded(
    transport: HttpxUpstream, coding: str | None, body: bytes
) -> None:
    headers = {"content-encoding": coding} if coding else {}
    with respx.mock:
        route = respx.get(URL).respond(200, content=body, headers=headers)
        reply = await call_upstream(
            transport, "GET", URL, {"accept": "application/json"}, b"", Timeouts(), limit=1_000
        )
    assert (reply.status, reply.content) == (200, b'{"data": []}')
    sent = route.calls.last.request
    assert sent.headers["accept"] == "application/json"
    assert "accept-encoding" not in sent.headers  # no coding asked for: the transport's rule


@pytest.mark.parametrize(
    ("coding", "body", "limit"),
    [
        (None, b"x" * 101, 100),  # over the call's limit
        ("x-unknown", b"\x00\x01", 1_000),  # a coding the proxy does not undo
    ],
    ids=["over-the-limit", "unknown-coding"],
)
async def test_an_unreadable_reply_is_refused_by_name(
    transport: HttpxUpstream, coding: str | None, body: bytes, limit: int
) -> None:
    headers = {"content-encoding": coding} if coding else {}
    with respx.mock:
        respx.post(URL).respond(200, content=body, headers=headers)
        with pytest.raises(ReplyUnreadable):
            await call_upstream(transport, "POST", URL, {}, b"{}", Timeouts(), limit=limit)


def test_decoding_is_bounded_and_refuses_a_damaged_body() -> None:
    assert decode_content(b"not gzip", "gzip") is None
    assert decode_content(gzip.compress(b"cut short", mtime=0)[:-9], "gzip") is None
    bomb = gzip.compress(b"\x00" * 10_000, mtime=0)
    assert decode_content(bomb, "gzip", limit=10_000) == b"\x00" * 10_000
    assert decode_content(bomb, "gzip", limit=9_999) is None
