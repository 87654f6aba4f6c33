"""Image token pricing without decoding images.

OpenAI bills an ``image_url`` part by its ``detail``: ``low`` is a flat base cost; ``high``
(and ``auto``, treated as high to stay on the safe side) is base + per-tile cost after a resize:
fit within ``max_side`` square, then shrink so the shortest side is at most ``short_side``,
then count ``tile_size`` tiles.  The size is read from the header bytes of a ``data:`` URL
(PNG, JPEG, GIF, WebP) so no imaging library is needed; remote URLs and unreadable data get a
configurable estimate (the default equals a 1024x1024 high-detail image).
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_HEAD_CHARS = 65_536  # base64 characters decoded first; enough for nearly every header


@dataclass(frozen=True, slots=True)
class ImagePricing:
    """Constants of the tile formula; all configurable because models differ."""

    base_tokens: int = 85
    tile_tokens: int = 170
    tile_size: int = 512
    max_side: int = 2048
    short_side: int = 768
    unknown_size_tokens: int = 765

    def tokens_for_size(self, width: int, height: int, detail: str = "high") -> int:
        """Tokens for an image of ``width`` x ``height`` at ``detail``."""
        if detail == "low":
            return self.base_tokens
        w, h = float(width), float(height)
        if w <= 0 or h <= 0:
            return self.unknown_size_tokens
        if max(w, h) > self.max_side:
            scale = self.max_side / max(w, h)
            w, h = w * scale, h * scale
        if min(w, h) > self.short_side:
            scale = self.short_side / min(w, h)
            w, h = w * scale, h * scale
        tiles = math.ceil(w / self.tile_size - 1e-9) * math.ceil(h / self.tile_size - 1e-9)
        return self.base_tokens + self.tile_tokens * tiles

    def tokens_for_part(self, part: Mapping[str, Any]) -> int:
        """Tokens for one ``{"type": "image_url", "image_url": {...}}`` content part."""
        image = part.get("image_url")
        url: object = None
        detail: object = "auto"
        if isinstance(image, Mapping):
            url = image.get("url")
            detail = image.get("detail", "auto")
        elif isinstance(image, str):
            url = image
        if detail == "low":
            return self.base_tokens
        size = image_size_from_url(url) if isinstance(url, str) else None
        if size is None:
            return self.unknown_size_tokens
        return self.tokens_for_size(size[0], size[1], "high")


def image_size_from_url(url: str) -> tuple[int, int] | None:
    """Width and height of a base64 ``data:`` URL image, or ``None`` if unknown."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",")
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    payload = url[comma + 1 :]
    head = payload[: _HEAD_CHARS - _HEAD_CHARS % 4]
    size = image_size(_b64(head))
    if size is None and len(payload) > len(head):
        size = image_size(_b64(payload))  # e.g. a JPEG whose EXIF block precedes the frame
    return size


def _b64(text: str) -> bytes:
    try:
        return binascii.a2b_base64(text.encode("ascii", "ignore"))
    except (binascii.Error, ValueError):
        return b""


def image_size(data: bytes) -> tuple[int, int] | None:
    """Dimensions from the header of PNG, GIF, JPEG or WebP bytes, else ``None``."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


_SOF_MARKERS = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos = 2
    size = len(data)
    while pos + 4 <= size:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker in _SOF_MARKERS:
            if pos + 9 > size:
                return None
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            return width, height
        if length < 2:
            return None
        pos += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        b0, b1, b2, b3 = data[21], data[22], data[23], data[24]
        width = 1 + (b0 | ((b1 & 0x3F) << 8))
        height = 1 + ((b1 >> 6) | (b2 << 2) | ((b3 & 0x0F) << 10))
        return width, height
    if chunk == b"VP8X" and len(data) >= 30:
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return width, height
    return None
