"""Who may make the proxy spend an operator credential (an upstream's ``api_key``).

The proxy makes calls of its own: summaries (inline and prepared ahead of time) and the
``GET /models`` that discovers windows. When the upstream they go to has an ``api_key`` in the
config, they are paid with the operator's key, not the caller's, and they are made *before*
the request goes upstream, so the upstream never gets to refuse a caller with a made-up key.
The proxy therefore spends an operator credential only for a caller it knows to be good:

* authenticated by ``server.api_keys`` (the request carried one of them);
* or holding a key an upstream accepted recently: when an upstream without an ``api_key`` of
  its own (so it received the caller's key) and not ``keyless: true`` (so it checks keys)
  answers a request with a 2xx, a hash of the caller's key is remembered for
  :data:`KNOWN_TTL_SECONDS` (:class:`KnownCallers`). A reply to a request that carried the
  operator's key proves nothing about the caller and is not recorded;
* or anyone, when the operator says so: ``server.allow_anonymous_spend: true``.

Everyone else gets the pipeline without the summarizer (the later strategies keep the request
under the window), a warning saying why, and a count in
``compaction_proxy_summaries_withheld_total``. The preview, which returns the summary text,
spends an operator credential only for a caller authenticated by ``server.api_keys``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

KNOWN_TTL_SECONDS = 900.0
"""How long an accepted key counts as known good (each accepted request renews it)."""
MAX_KNOWN = 10_000
"""Known keys kept per process; the least recently accepted go first."""


@dataclass(frozen=True, slots=True)
class Spending:
    """Whether the proxy may spend an operator credential for one request.

    ``reason``: the metric label when it may not (``unknown_caller``,
    ``preview_unauthenticated``); ``note``: what the warning header says then.
    """

    allowed: bool
    reason: str = ""
    note: str = ""


ALLOWED = Spending(True)
"""A caller let in (or the operator's own use: the ``compact`` command)."""

UNKNOWN_CALLER = Spending(
    False,
    "unknown_caller",
    "summarizer not called: it would spend an upstream api_key of the operator's for a caller "
    "the proxy does not know (no key of server.api_keys, no key an upstream accepted "
    "recently); later strategies stood in and nothing was stored",
)

PREVIEW_UNAUTHENTICATED = Spending(
    False,
    "preview_unauthenticated",
    "summarizer not called: the preview spends an upstream api_key of the operator's only for "
    "a caller authenticated by server.api_keys; later strategies stood in",
)


class KnownCallers:
    """Hashes of caller keys an upstream accepted recently; bounded, each with a deadline.

    Only a keyed hash is kept (blake2b under a random per-process key): the memory of this
    process never holds a caller's key, and its hashes are useless to anyone outside it.
    """

    def __init__(
        self,
        *,
        ttl_seconds: float = KNOWN_TTL_SECONDS,
        max_entries: int = MAX_KNOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._clock = clock
        self._secret = os.urandom(32)
        self._expires: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expires)

    def _hash(self, credential: str) -> bytes:
        return hashlib.blake2b(
            credential.encode("utf-8", "surrogateescape"), key=self._secret, digest_size=16
        ).digest()

    def accepted(self, credential: str | None) -> None:
        """An upstream that checks keys accepted a request carrying ``credential``."""
        if not credential:
            return
        key = self._hash(credential)
        self._expires[key] = self._clock() + self.ttl_seconds
        self._expires.move_to_end(key)
        while len(self._expires) > self.max_entries:
            self._expires.popitem(last=False)

    def known(self, credential: str | None) -> bool:
        """Whether ``credential`` was accepted within the last :attr:`ttl_seconds`."""
        if not credential:
            return False
        key = self._hash(credential)
        expires = self._expires.get(key)
        if expires is None:
            return False
        if expires <= self._clock():
            del self._expires[key]
            return False
        return True
