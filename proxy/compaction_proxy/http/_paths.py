"""The request path, made safe before it is routed or forwarded.

Everything under ``/v1`` goes upstream as the client sent it, and the upstream (or a gateway in
front of it) may resolve ``..`` itself: ``/v1/../../admin`` would then reach a path the proxy
was never meant to expose.  So dot segments are resolved here, whether written plainly or
percent-encoded (``%2e%2e``), duplicate slashes are collapsed, and a path that would leave
``/v1`` once resolved is refused with a 400.  Encoded slashes and backslashes inside a segment
hiding a dot segment (``..%2f..%2fadmin``) are refused too: some servers decode them into
separators, which would reopen the same hole; an encoded slash on its own (a model id such as
``meta-llama%2FLlama-3.1-8B``) passes.

The result keeps each segment's original percent-encoding (only the structure changes), so an
id with an encoded character reaches the upstream exactly as the client wrote it.  The query
string is not part of the path and passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from compaction_proxy.compaction.errors import CompactionProxyError

API_PREFIX = "/v1"


class UnsafePath(CompactionProxyError, ValueError):
    """The path cannot be forwarded; the message says why (no path echoed back)."""


@dataclass(frozen=True, slots=True)
class SafePath:
    """A normalised path: ``path`` decoded (for routing), ``raw`` as sent (for forwarding)."""

    path: str
    raw: bytes


def needs_normalizing(raw_path: bytes) -> bool:
    """False for the common path that has nothing to resolve (a few byte scans, no parsing)."""
    return (
        b"." in raw_path
        or b"%" in raw_path
        or b"//" in raw_path
        or b"\\" in raw_path
        or not raw_path.startswith(b"/")
    )


def normalize(raw_path: bytes) -> SafePath:
    """Resolve ``raw_path`` (the request target's path, still percent-encoded).

    Raises :class:`UnsafePath` for a path that escapes ``/v1`` once resolved, a segment that
    decodes to a slash or backslash, or a path that is not absolute.
    """
    text = raw_path.decode("latin-1")
    if not text.startswith("/"):
        raise UnsafePath("the request path must start with '/'")
    if "\\" in text:
        raise UnsafePath("backslashes are not allowed in the request path")
    under_api = _segments_start_with_api(text)
    kept: list[str] = []
    segments = text.split("/")[1:]
    for position, segment in enumerate(segments):
        decoded = unquote(segment) if "%" in segment else segment
        if decoded not in (".", "..") and _hides_dot_segment(decoded):
            raise UnsafePath("the request path hides '..' behind an encoded slash")
        if decoded == ".":
            continue
        if decoded == "..":
            if kept:
                kept.pop()
            continue
        if segment == "" and position < len(segments) - 1:
            continue  # a duplicate slash
        kept.append(segment)
    raw = "/" + "/".join(kept)
    path = unquote(raw)
    if under_api and not (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
        raise UnsafePath("the request path leaves /v1 once its '..' segments are resolved")
    return SafePath(path=path, raw=raw.encode("latin-1"))


def _hides_dot_segment(decoded: str) -> bool:
    """True for a segment like ``..%2fadmin``: harmless as one segment, but a server that
    decodes ``%2F`` (or ``%5C``) into a separator would resolve it out of ``/v1``.  An encoded
    slash alone is fine: model ids such as ``meta-llama%2FLlama-3.1-8B`` need it."""
    if "/" not in decoded and "\\" not in decoded:
        return False
    parts = decoded.replace("\\", "/").split("/")
    return any(part in (".", "..") for part in parts)


def _segments_start_with_api(text: str) -> bool:
    """True when the path, as sent, is addressed to the API (``/v1`` or ``/v1/...``)."""
    first = text.split("/", 2)[1] if text.count("/") >= 1 else ""
    return unquote(first).lower() == API_PREFIX[1:]
