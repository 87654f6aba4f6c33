"""Canonical bytes and digests for message dicts.

Several parts of the core need one stable byte form of a message: the byte count in the view,
the key of the token-count cache, and the checkpoint hash chain.  Producing it in one place
guarantees they agree, and orjson with sorted keys is both deterministic and fast enough to run
over every message of every request.

One request serializes each message up to three times (the hash chain, the worker thread's
count, the view); inside :func:`shared_serializations` each dict is serialized once and the
bytes (and their cached hash) are shared by every pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
from collections.abc import Iterator

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


_shared: dict[int, tuple[object, bytes]] | None = None
_sharing = 0
_sharing_lock = threading.Lock()
SHARED_LIMIT = 16_384
"""Dicts the memo holds at most; past it, it starts afresh (the dicts of finished requests
must not stay alive, nor make the cyclic GC's full passes longer, under steady load)."""


def canonical_bytes(value: object) -> bytes:
    """Serialize ``value`` to compact JSON with sorted keys (the canonical form).

    Key order in a client's dict must not change counts or hashes, so keys are sorted.  Inside
    :func:`shared_serializations`, a dict serialized before (the same object) gets its earlier
    bytes back.
    """
    shared = _shared
    if shared is None or type(value) is not dict:
        return orjson.dumps(value, option=_OPTIONS)
    entry = shared.get(id(value))
    if entry is not None and entry[0] is value:
        return entry[1]
    data = orjson.dumps(value, option=_OPTIONS)
    if len(shared) >= SHARED_LIMIT:
        shared.clear()
    # The entry holds the dict itself, so its id cannot be reused while the entry lives.
    shared[id(value)] = (value, data)
    return data


@contextlib.contextmanager
def shared_serializations() -> Iterator[None]:
    """Serialize each message dict once while the block runs (one request), whatever the
    thread: the hash chain, the worker thread's count and the view then share the bytes (and
    the hash CPython caches in them, the count cache's key).

    For the proxy's edge, around one request: its dicts are parsed from the body and only
    read, never changed in place (a dict changed in place would keep its stale bytes).  The
    blocks of the requests in flight share one memo, dropped when the last of them ends.
    """
    global _shared, _sharing
    with _sharing_lock:
        _sharing += 1
        if _shared is None:
            _shared = {}
    try:
        yield
    finally:
        with _sharing_lock:
            _sharing -= 1
            if not _sharing:
                _shared = None


def digest(data: bytes) -> bytes:
    """A 16-byte blake2b digest: collision-safe for cache keys, cheaper than sha256."""
    return hashlib.blake2b(data, digest_size=16).digest()


_HASH_RANDOMIZED = bool(sys.flags.hash_randomization)


def cache_key(data: bytes) -> int:
    """A cheap in-process cache key for canonical bytes (the token-count cache's key).

    It packs the byte length with CPython's ``hash(bytes)``: SipHash-1-3, 64 bits, keyed with a
    per-process random secret, about 8x cheaper than :func:`digest` (blake2b has a fixed cost
    of ~0.5 µs per call).  Two different messages share a key only if they have the same length
    *and* a 64-bit hash collision: ~1e-10 for a full 65,536-entry cache, and not steerable by a
    client because the hash key is secret.  The key is never persisted or compared across
    processes.  When hash randomization is off (``PYTHONHASHSEED=0``) the hash key is public,
    so the blake2b digest is used instead.
    """
    if _HASH_RANDOMIZED:
        return (len(data) << 64) | (hash(data) & 0xFFFF_FFFF_FFFF_FFFF)
    return int.from_bytes(digest(data), "big")
