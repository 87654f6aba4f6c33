"""Canonical bytes and digests for message dicts.

Several parts of the core need one stable byte form of a message: the byte count in the view,
the key of the token-count cache, and (later) the checkpoint hash chain.  Producing it in one
place guarantees they agree, and orjson with sorted keys is both deterministic and fast enough
to run over every message of every request.
"""

from __future__ import annotations

import hashlib

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


def canonical_bytes(value: object) -> bytes:
    """Serialize ``value`` to compact JSON with sorted keys (the canonical form).

    Key order in a client's dict must not change counts or hashes, so keys are sorted.
    """
    return orjson.dumps(value, option=_OPTIONS)


def digest(data: bytes) -> bytes:
    """A 16-byte blake2b digest: collision-safe for cache keys, cheaper than sha256."""
    return hashlib.blake2b(data, digest_size=16).digest()
