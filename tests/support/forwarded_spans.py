"""The exact bytes of each message of a recorded request body, for byte-identity checks.

Parsing and comparing objects would call two requests equal whose bytes differ (key order,
escapes, number forms), and the upstream's prompt cache compares bytes: so the body's
`messages` array is split into the raw text of each element, as it was sent.
"""

from __future__ import annotations

import json

_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _expect(text: str, at: int, char: str) -> int:
    at = _skip(text, at)
    if text[at : at + 1] != char:
        raise ValueError(f"expected {char!r} at {at}, found {text[at : at + 20]!r}")
    return at + 1


def message_spans(body: bytes) -> list[bytes]:
    """The raw bytes of each element of the top-level `messages` array of a JSON body."""
    text = body.decode("utf-8")
    at = _expect(text, 0, "{")
    while True:
        key, at = _DECODER.raw_decode(text, _skip(text, at))
        at = _skip(text, _expect(text, at, ":"))
        if key == "messages":
            return _elements(text, at)
        _, at = _DECODER.raw_decode(text, at)
        at = _expect(text, at, ",")


def _elements(text: str, at: int) -> list[bytes]:
    at = _expect(text, at, "[")
    spans: list[bytes] = []
    if text[_skip(text, at)] == "]":
        return spans
    while True:
        start = _skip(text, at)
        _, at = _DECODER.raw_decode(text, start)
        spans.append(text[start:at].encode("utf-8"))
        at = _skip(text, at)
        if text[at] == "]":
            return spans
        at = _expect(text, at, ",")
