"""Recall ids are keyed per end user (compaction_proxy/checkpoints/_archive_key.py, issue 29):
the secret lives in the archive's store, so replicas and restarts agree; an id reveals nothing
of its content without it; and every field that separates checkpoints separates archives.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from pathlib import Path

import pytest

from compaction_proxy.checkpoints import (
    Archive,
    ArchiveKeys,
    MemoryStore,
    SqliteStore,
    StoredValues,
    StoreUnavailable,
    archive_namespace,
    confined,
    merged_index,
    unstored_ids,
)
from compaction_proxy.checkpoints._archive_key import SECRET_KEY, SECRET_NAMESPACE
from compaction_proxy.compaction.archive import ID_PATTERN, Archived, RecallIds
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.settings import RecallSettings
from compaction_proxy.engine import DegradedPath

MESSAGE = {"role": "tool", "tool_call_id": "c1", "content": "your account PIN is 4242"}
NS = archive_namespace("Bearer sk-app", None, {"user": "alice"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FailingStore(MemoryStore):
    """A memory store whose every call fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def find_longest(self, namespace, keys):  # type: ignore[no-untyped-def]
        if self.down:
            raise StoreUnavailable("down")
        return await super().find_longest(namespace, keys)


# ------------------------------------------------------------------ the ids


def test_ids_are_keyed() -> None:
    one, other = RecallIds(b"k" * 32), RecallIds(b"q" * 32)
    assert one.original(MESSAGE) == one.original(dict(MESSAGE))  # stable under one key
    assert one.original(MESSAGE) != other.original(MESSAGE)
    assert ID_PATTERN.fullmatch(one.original(MESSAGE)) and one.original(MESSAGE)[0] == "r"
    span = one.span(("ra", "rb"), "summary")
    assert span[0] == "s" and span != other.span(("ra", "rb"), "summary")
    # Not the digest anyone could compute before (unkeyed BLAKE2b of the canonical bytes).
    raw = hashlib.blake2b(canonical_bytes(MESSAGE), digest_size=8, person=b"cp-recall").digest()
    unkeyed = "r" + base64.b32encode(raw).decode().lower()[:11]
    assert unkeyed not in {one.original(MESSAGE), other.original(MESSAGE)}
    with pytest.raises(ValueError):
        RecallIds(b"")


# ------------------------------------------------------------------ the namespace


def test_every_field_that_separates_checkpoints_separates_archives() -> None:
    base = archive_namespace("Bearer sk-app", None)
    variants = {
        archive_namespace("Bearer sk-other", None),
        archive_namespace("Bearer sk-app", "tenant-7"),
        archive_namespace("Bearer sk-app", None, {"user": "alice"}),
        archive_namespace("Bearer sk-app", None, {"user": "bob"}),
        archive_namespace("Bearer sk-app", None, {"safety_identifier": "alice"}),
        archive_namespace("Bearer sk-app", None, {"user": "alice", "safety_identifier": "a"}),
    }
    assert base not in variants and len(variants) == 6
    # The same key in either header names the same archive; an empty field names no one; a
    # body's other members play no part.
    assert archive_namespace("sk-app", None) == base
    assert archive_namespace("Bearer sk-app", None, {"user": "", "model": "m"}) == base
    assert archive_namespace("Bearer sk-app", None, {"safety_identifier": None}) == base


# ------------------------------------------------------------------ the secret


async def test_the_secret_is_made_once_and_shared_by_every_process_on_the_store(
    tmp_path: Path,
) -> None:
    """Two processes on one SQLite file (two Archive objects, two connections), started
    together: one secret, the same ids; a restart reads it back."""
    db = tmp_path / "checkpoints.db"
    stores = [SqliteStore(db), SqliteStore(db)]
    archives = [Archive(store, RecallSettings(enabled=True)) for store in stores]
    ids = await asyncio.gather(*(a.recall_ids(NS) for a in archives for _ in range(3)))
    assert len({i.key for i in ids}) == 1
    found = await StoredValues(stores[0]).get(SECRET_NAMESPACE, SECRET_KEY)
    assert found is not None and len(bytes.fromhex(found.value["secret"])) == 32
    for store in stores:
        await store.close()
    restarted = SqliteStore(db)
    again = await Archive(restarted, RecallSettings(enabled=True)).recall_ids(NS)
    assert again == ids[0]
    # Another namespace on the same secret: another key.
    other = await Archive(restarted, RecallSettings(enabled=True)).recall_ids(
        archive_namespace("Bearer sk-app", None, {"user": "bob"})
    )
    assert other.key != again.key
    await restarted.close()


async def test_a_lost_secret_is_written_back_and_another_is_adopted() -> None:
    store = MemoryStore()
    clock = Clock()
    keys = ArchiveKeys(store, clock=clock, refresh_seconds=300)
    first = await keys.ids(NS)
    # The row is lost (a flushed Redis): the next refresh writes the known secret back.
    await store.delete(SECRET_NAMESPACE, SECRET_KEY)
    clock.now = 301
    assert await keys.ids(NS) == first
    assert await StoredValues(store).get(SECRET_NAMESPACE, SECRET_KEY) is not None
    # Another process wrote another one meanwhile: this one adopts it at its next refresh.
    await StoredValues(store).put(SECRET_NAMESPACE, SECRET_KEY, {"secret": "ab" * 32}, 3600)
    clock.now = 400
    assert await keys.ids(NS) == first  # not yet read again
    clock.now = 700
    adopted = await keys.ids(NS)
    assert adopted != first and adopted.key == RecallIds(adopted.key).key


async def test_no_secret_no_ids_then_recovery_is_logged_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FailingStore()
    store.down = True
    health = DegradedPath("recall", "recall archive")
    keys = ArchiveKeys(store, health=health)
    caplog.set_level(logging.WARNING, logger="compaction_proxy.degraded")
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            await keys.ids(NS)
    assert health.degraded and health.total == 3
    store.down = False
    await keys.ids(NS)
    await keys.ids(NS)
    assert not health.degraded and health.episodes == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "could not be read" in lines[0]
    assert "after 3 affected request(s)" in lines[1]
    # Nothing secret in either line.
    found = await StoredValues(store).get(SECRET_NAMESPACE, SECRET_KEY)
    assert found is not None and found.value["secret"] not in " ".join(lines)


async def test_a_known_secret_outlives_a_store_outage() -> None:
    store = FailingStore()
    clock = Clock()
    health = DegradedPath("recall", "recall archive")
    keys = ArchiveKeys(store, clock=clock, refresh_seconds=300, health=health)
    first = await keys.ids(NS)
    store.down = True
    clock.now = 1_000  # a refresh is due, and the store cannot answer it
    assert await keys.ids(NS) == first
    assert health.total == 0 and not health.degraded


def test_without_a_store_ids_are_keyed_by_the_namespace_alone() -> None:
    assert unstored_ids(NS) == unstored_ids(NS)
    assert unstored_ids(NS) != unstored_ids(archive_namespace("Bearer sk-app", None))


# ------------------------------------------------------------------ what a span may list


def test_a_span_lists_only_ids_the_conversation_held() -> None:
    """A client's message or a tool result ending with a mark looks like an older summary to
    the core, which lists the id it names among the new span's members: only ids of the
    conversation's index (or of this run) stay."""
    held_before = {"archive": [["roldaaaaaaaa", 10], ["soldaaaaaaaa", 20]]}
    run = Archived(
        {"rnewaaaaaaaa": MESSAGE},
        {"snewaaaaaaaa": ("roldaaaaaaaa", "soldaaaaaaaa", "rnewaaaaaaaa", "sforeignaaaa")},
        ("rnewaaaaaaaa", "snewaaaaaaaa"),
    )
    kept = confined(run, held_before)
    assert kept.spans["snewaaaaaaaa"] == ("roldaaaaaaaa", "soldaaaaaaaa", "rnewaaaaaaaa")
    assert kept.originals == run.originals and kept.order == run.order
    assert confined(run, None).spans["snewaaaaaaaa"] == ("rnewaaaaaaaa",)
    index = merged_index(held_before, kept, 1_000_000)
    assert "sforeignaaaa" not in [entry[0] for entry in index]
    untouched = Archived({"rnewaaaaaaaa": MESSAGE}, {"snewaaaaaaaa": ("rnewaaaaaaaa",)})
    assert confined(untouched, None) is untouched
