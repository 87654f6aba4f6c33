"""Canonical bytes and digests for message dicts.

Several parts of the core need one stable byte form of a message: the byte count in the view,
the key of the token-count cache, and the checkpoint hash chain (checkpoints/_keys.py, whose
keys every replica and restart must compute alike).  Producing it in one
place guarantees they agree, and orjson with sorted keys is both deterministic and fast enough
to run over every message of every request.
"""

from __future__ import annotations

import hashlib
import sys

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


def canonical_bytes(value: object) -> bytes:
    """Serialize ``value`` to compact JSON with sorted keys (the canonical form).

    Key order in a client's dict must not change counts or hashes, so keys are sorted.
    """
    return trimmed(orjson.dumps(value, option=_OPTIONS))


def json_text(value: object) -> str:
    """``value`` as compact JSON text, for a lifted tool call's arguments or a non-text
    content value shown as text; ``str(value)`` for what JSON cannot hold."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def trimmed(data: bytes) -> bytes:
    """``data`` in an allocation of its own size.

    orjson (3.12 and later) returns bytes whose allocation is far larger than their length
    and never shrinks it: at least 4 KiB for a 30-byte message, and about 13 times the length
    of a 10 MB document. Canonical bytes are made for every message of a request and held
    while the request is counted and hashed, so a body of 200,000 small messages held 800 MB
    of them. The copy costs a few hundredths of a microsecond for a small message.
    """
    return b"".join((data, b""))


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
