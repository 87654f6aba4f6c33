"""A small server-sent-events reader for raw (non-SDK) streaming assertions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """Yields the ``data`` of each event (multi-line data joined with newlines)."""
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def sse_data(body: bytes | str) -> list[str]:
    """The ``data`` payloads of a whole SSE body."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    return list(iter_sse_data(text.replace("\r\n", "\n").split("\n")))
