"""The key recall ids are made with (docs/recall.md, "Whose originals"): a server secret kept
in the archive's own store, and one key per archive namespace derived from it.

A recall id is a keyed digest of its original (``RecallIds``,
compaction_proxy/compaction/archive.py), so nobody without the secret can compute the id of a
guessed message, and one message archived for two end users gets two unrelated ids. The ids
name rows and travel in the forwarded prefix, so the secret must be the same on every replica
and after a restart; it lives where the rows it names live:

* one row (:data:`SECRET_NAMESPACE`, :data:`SECRET_KEY`) holds 32 random bytes, written once
  under a lease (two replicas starting together write one) and kept for years; it never leaves
  the store (no log, header or page shows it);
* each process reads it once and keeps it, and reads it again every :data:`REFRESH_SECONDS`: a
  process that finds it gone (a flushed Redis, an evicted memory row) writes its own back, one
  that finds another adopts it, so replicas that diverged converge;
* a namespace's key is HMAC-SHA256 of the namespace under the secret (:func:`namespace_key`);
* a store that cannot be read before the secret is known raises ``StoreUnavailable``: the flow
  then compacts that request without recall and says so (never with an id anyone could
  compute). It is the recall path's degradation (``health``: the edge's recall
  ``DegradedPath``, compaction_proxy/engine/_degraded.py): one WARNING line when it starts,
  one when the secret is read again, the requests between counted in
  ``compaction_proxy_degraded_requests_total{path="recall"}``.

Without a store (``compaction-proxy compact``) nothing is archived or served: its ids are made
with a key of the namespace alone (:func:`unstored_ids`), so the same file always compacts the
same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

from compaction_proxy.compaction.archive import KEY_BYTES, RecallIds

from ._contract import CheckpointStore, StoreUnavailable
from ._keyvalue import StoredValues

log = logging.getLogger("compaction_proxy.archive")

SECRET_NAMESPACE = "archive-secret"
SECRET_KEY = "v1"
SECRET_TTL_SECONDS = 10 * 365 * 86_400
"""The secret's row outlives every archive row it names (``recall.ttl``) by far."""
REFRESH_SECONDS = 300.0
LEASE = "archive-secret"
LEASE_TTL_SECONDS = 10.0
LEASE_WAIT_SECONDS = 2.0
_CONTEXT = b"cp-recall-namespace\x1f"


class Health(Protocol):
    """Where a failure to read the secret is reported (the edge's recall degraded path)."""

    def failed(self, reason: str) -> None: ...

    def recovered(self) -> None: ...


class _Unwatched:
    def failed(self, reason: str) -> None:
        return None

    def recovered(self) -> None:
        return None


def namespace_key(secret: bytes, namespace: str) -> bytes:
    """The key of ``namespace``'s recall ids under ``secret``."""
    return hmac.new(secret, _CONTEXT + namespace.encode(), hashlib.sha256).digest()[:KEY_BYTES]


def unstored_ids(namespace: str) -> RecallIds:
    """The ids of a run that keeps nothing (no store): keyed by the namespace alone."""
    return RecallIds(namespace_key(b"", namespace))


def _secret_of(value: object) -> bytes | None:
    """The secret a stored row holds, or None (absent, foreign, malformed)."""
    if not isinstance(value, dict):
        return None
    text = value.get("secret")
    if not isinstance(text, str):
        return None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        return None
    return secret if len(secret) == KEY_BYTES else None


class ArchiveKeys:
    """The server secret of one archive store and the namespaces' ids (see the module
    docstring). ``clock``: monotonic seconds, for the refresh."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = REFRESH_SECONDS,
        lease_wait_seconds: float = LEASE_WAIT_SECONDS,
        health: Health | None = None,
    ) -> None:
        self.values = StoredValues(store)
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self.lease_wait_seconds = lease_wait_seconds
        self.health: Health = health if health is not None else _Unwatched()
        self._secret: bytes | None = None
        self._checked = 0.0
        self._loading = asyncio.Lock()

    async def ids(self, namespace: str) -> RecallIds:
        """The recall ids of ``namespace``; ``StoreUnavailable`` while no secret is known."""
        try:
            secret = await self.secret()
        except StoreUnavailable as exc:
            self.health.failed(f"the archive's key could not be read ({exc})")
            raise
        return RecallIds(namespace_key(secret, namespace))

    async def secret(self) -> bytes:
        """The store's secret: the one this process knows, read again (or written) every
        :attr:`refresh_seconds`."""
        known = self._secret
        if known is not None and self.clock() < self._checked + self.refresh_seconds:
            return known
        async with self._loading:
            known = self._secret
            if known is not None and self.clock() < self._checked + self.refresh_seconds:
                return known  # read by the call this one waited for
            try:
                secret = await self._load(known)
            except StoreUnavailable:
                if known is None:
                    raise
                secret = known  # keep the one known; read again after the next interval
            else:
                self.health.recovered()
            self._secret = secret
            self._checked = self.clock()
            return secret

    async def _load(self, known: bytes | None) -> bytes:
        stored = await self._read()
        if stored is None:
            async with self.values.lock(
                LEASE, LEASE_TTL_SECONDS, self.lease_wait_seconds
            ) as acquired:
                stored = await self._read()  # written by the holder this one waited for
                if stored is None:
                    if not acquired:
                        raise StoreUnavailable("the archive's key is being written elsewhere")
                    stored = known if known is not None else os.urandom(KEY_BYTES)
                    await self.values.put(
                        SECRET_NAMESPACE, SECRET_KEY, {"secret": stored.hex()}, SECRET_TTL_SECONDS
                    )
                    log.info(
                        "recall: the archive's key %s the store",
                        "was written back to" if known is not None else "was created in",
                    )
        if known is not None and stored != known:
            log.warning(
                "recall: the store holds another archive key than this process's; adopting it "
                "(the rows archived before keep their ids; what is archived again gets new ones)"
            )
        return stored

    async def _read(self) -> bytes | None:
        found = await self.values.get(SECRET_NAMESPACE, SECRET_KEY)
        return None if found is None else _secret_of(found.value)
