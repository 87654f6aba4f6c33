"""Canonical bytes hold no more memory than their length (orjson over-allocates its output)."""

from __future__ import annotations

import tracemalloc

import orjson

from compaction_proxy.compaction.canonical import canonical_bytes, trimmed


def _held(make: object) -> int:
    """Bytes still allocated (as tracemalloc sees them) by what ``make()`` returns."""
    assert callable(make)
    tracemalloc.start()
    try:
        kept = make()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return held


def test_canonical_bytes_of_many_small_messages_hold_about_their_length() -> None:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(10_000)]
    held = _held(lambda: [canonical_bytes(m) for m in messages])
    length = sum(len(canonical_bytes(m)) for m in messages)
    # Each bytes object has ~33 bytes of header; orjson's own buffer is at least 4 KiB.
    assert held < 3 * length + 100 * len(messages), (held, length)


def test_trimmed_keeps_the_bytes_and_drops_the_slack() -> None:
    document = {"content": "x" * 1_000_000}
    data = trimmed(orjson.dumps(document))
    assert data == orjson.dumps(document)
    assert _held(lambda: trimmed(orjson.dumps(document))) < 1.2 * len(data)
