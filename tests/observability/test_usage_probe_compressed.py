"""The usage probe on compressed replies: gzip and deflate, JSON and SSE, any chunking.

The SDKs ask for gzip, so an upstream that compresses is the ordinary case; these check the
probe reads the same figure it reads from the identity body, and gives up (None, never an
exception) on anything it cannot read cheaply.
"""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest

from compaction_proxy.upstream import UsageProbe

CHUNK_SIZES = (1, 7, 100, 4096, 1 << 20)


def _feed(probe: UsageProbe, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        probe.feed(data[i : i + size])


def _json_body(prompt_tokens: int = 1234) -> bytes:
    reply = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello " * 300}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5},
    }
    return orjson.dumps(reply)


def _sse_events(prompt_tokens: int = 777, events: int = 300) -> list[bytes]:
    content = {"choices": [{"delta": {"content": "word " * 20}}], "usage": None}
    out = [b"data: " + orjson.dumps(content) + b"\n\n" for _ in range(events)]
    usage = {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3}}
    out.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _gzip_stream(events: list[bytes], wbits: int = 16 + zlib.MAX_WBITS) -> list[bytes]:
    """Compressed the way a server streams: one compressor, a sync flush after each event."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    chunks = [compressor.compress(e) + compressor.flush(zlib.Z_SYNC_FLUSH) for e in events]
    chunks.append(compressor.flush())
    return chunks


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_gzip_json(size: int) -> None:
    body = gzip.compress(_json_body(4321))
    probe = UsageProbe.start("application/json", "gzip", str(len(body)))
    assert probe is not None
    _feed(probe, body, size)
    assert probe.prompt_tokens() == 4321


@pytest.mark.parametrize("coding", ["deflate", "Deflate", " x-gzip "])
def test_deflate_and_x_gzip_json(coding: str) -> None:
    raw = _json_body(99)
    body = gzip.compress(raw) if "gzip" in coding else zlib.compress(raw)
    probe = UsageProbe.start("application/json; charset=utf-8", coding, None)
    assert probe is not None
    _feed(probe, body, 50)
    assert probe.prompt_tokens() == 99


@pytest.mark.parametrize("size", CHUNK_SIZES)
def test_gzip_stream_as_the_server_flushed_it(size: int) -> None:
    chunks = _gzip_stream(_sse_events(777))
    stream = b"".join(chunks)
    probe = UsageProbe.start("text/event-stream; charset=utf-8", "gzip", None)
    assert probe is not None
    _feed(probe, stream, size)
    assert probe.prompt_tokens() == 777


def test_gzip_stream_fed_chunk_by_chunk_without_usage() -> None:
    events = [*_sse_events(5)[:-2], b"data: [DONE]\n\n"]  # no usage chunk
    probe = UsageProbe.start("text/event-stream", "gzip", None)
    assert probe is not None
    for chunk in _gzip_stream(events):
        probe.feed(chunk)
    assert probe.prompt_tokens() is None


def test_deflate_stream() -> None:
    probe = UsageProbe.start("text/event-stream", "deflate", None)
    assert probe is not None
    _feed(probe, b"".join(_gzip_stream(_sse_events(31), wbits=zlib.MAX_WBITS)), 333)
    assert probe.prompt_tokens() == 31


def test_corrupt_or_cut_bodies_give_none() -> None:
    body = gzip.compress(_json_body())
    cut = UsageProbe.start("application/json", "gzip", None)
    assert cut is not None
    cut.feed(body[: len(body) // 2])
    assert cut.prompt_tokens() is None
    garbage = UsageProbe.start("application/json", "gzip", None)
    assert garbage is not None
    garbage.feed(b"this is not gzip at all")
    assert garbage.prompt_tokens() is None
    stream = UsageProbe.start("text/event-stream", "gzip", None)
    assert stream is not None
    stream.feed(b"\x1f\x8b but then nonsense " * 10)
    stream.feed(b"".join(_gzip_stream(_sse_events(12))))  # too late: it gave up
    assert stream.prompt_tokens() is None


def test_a_json_bomb_is_not_inflated_past_the_limit() -> None:
    """2 MiB of zeros compress to ~2 KiB: the probe stops at its 1 MiB limit."""
    padding = b" " * (2 << 20)
    body = gzip.compress(b'{"usage": {"prompt_tokens": 5}, "pad": "' + padding + b'"}')
    assert len(body) < 64 << 10
    probe = UsageProbe.start("application/json", "gzip", str(len(body)))
    assert probe is not None
    probe.feed(body)
    assert probe.prompt_tokens() is None


def test_compressed_json_over_the_limit_is_not_kept() -> None:
    probe = UsageProbe.start("application/json", "gzip", None)
    assert probe is not None
    probe.feed(b"\x00" * ((1 << 20) + 1))
    assert probe.prompt_tokens() is None
