"""A body's content coding undone, for the replies the proxy reads itself (a refusal, a
summary, a model listing); relayed bodies are never decoded."""

from __future__ import annotations

import zlib

__all__ = ["MAX_DECODED", "decode_content"]

MAX_DECODED: int = 8 << 20
"""A compressed body may inflate to at most this many bytes; beyond it the proxy gives up
rather than let a small hostile body expand without bound."""


def decode_content(
    body: bytes, content_encoding: str | None, *, limit: int = MAX_DECODED
) -> bytes | None:
    """``body`` with gzip/deflate undone (in the order the header lists them), at most
    ``limit`` bytes; None for another coding, a damaged or cut stream, or past the limit."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    data = body
    for coding in reversed([c for c in codings if c and c != "identity"]):
        if coding in ("gzip", "x-gzip"):
            inflated = _inflate(data, (31,), limit)
        elif coding == "deflate":
            # The header means zlib-wrapped deflate, but some servers send the raw stream.
            inflated = _inflate(data, (15, -15), limit)
        else:
            return None  # brotli, zstd, compress...: the proxy asks for no coding at all
        if inflated is None:
            return None
        data = inflated
    return data


def _inflate(data: bytes, window_bits: tuple[int, ...], limit: int) -> bytes | None:
    for bits in window_bits:
        inflater = zlib.decompressobj(bits)
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            return None
        if inflater.eof:
            return out
        # A stream cut short: the message may be cut too, so do not guess from it.
    return None
