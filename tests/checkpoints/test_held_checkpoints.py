"""Checkpoints the store would not take, held in the process (compaction_proxy/checkpoints/
_held.py): found again under exactly the key the store would have had, never across a
namespace, bounded by bytes and by the checkpoint's TTL; the same for every backend behind
:class:`Checkpoints` (a SQLite file that is full, a Redis that is gone, any store whose writes
raise)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from compaction_proxy.checkpoints import (
    Checkpoint,
    Checkpoints,
    MemoryStore,
    RedisStore,
    StoreBreaker,
    StoreUnavailable,
    chain,
)
from compaction_proxy.checkpoints._held import HeldCheckpoints

NS = "ns-alice"


def checkpoint(text: str) -> Checkpoint:
    return Checkpoint(({"role": "user", "content": text},), 1.0)


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "terse"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}"})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    return messages


def test_the_longest_held_checkpoint_is_found_in_its_own_namespace_only() -> None:
    held = HeldCheckpoints()
    keys = ["k1", "k2", "k3"]
    held.put(NS, "k1", checkpoint("one"), 60)
    held.put(NS, "k2", checkpoint("two"), 60)
    found = held.find_longest(NS, keys)
    assert found is not None and found[0] == 2
    assert found[1].messages[0]["content"] == "two"
    assert held.find_longest("ns-bob", keys) is None  # another tenant's chain: nothing


def test_held_checkpoints_are_bounded_by_bytes_oldest_first() -> None:
    one = len(checkpoint("x" * 1_000).to_bytes())
    held = HeldCheckpoints(max_bytes=3 * one)
    for key in ("a", "b", "c", "d"):
        assert held.put(NS, key, checkpoint("x" * 1_000), 60)
    assert len(held) == 3 and held.size <= 3 * one
    assert held.find_longest(NS, ["a"]) is None
    assert held.find_longest(NS, ["d"]) is not None
    assert not held.put(NS, "huge", checkpoint("x" * 10_000), 60)  # larger than the bound


def test_held_checkpoints_expire_with_their_ttl() -> None:
    now = [0.0]
    held = HeldCheckpoints(clock=lambda: now[0])
    held.put(NS, "k", checkpoint("one"), 30)
    assert held.find_longest(NS, ["k"]) is not None
    now[0] = 31.0
    assert held.find_longest(NS, ["k"]) is None
    assert len(held) == 0 and held.size == 0


class _ReadOnly(MemoryStore):
    """A store that answers reads and refuses every write (a full disk, a quota)."""

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl: int) -> None:
        raise StoreUnavailable("database or disk is full")


@pytest.fixture
def dead_redis() -> Iterator[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


@pytest.mark.parametrize("backend", ["writes-refused", "redis-gone"])
async def test_a_refused_write_is_found_by_the_next_lookup(backend: str, dead_redis: str) -> None:
    if backend == "redis-gone":
        inner: Any = RedisStore(dead_redis, socket_timeout=0.5, connect_timeout=0.5, op_timeout=1)
    else:
        inner = _ReadOnly()
    store = StoreBreaker(inner)
    checkpoints = Checkpoints(store, ttl_seconds=60)
    messages = conversation(4)
    lookup = await checkpoints.lookup(NS, messages)
    assert not lookup.hit
    compacted = [messages[0], {"role": "user", "content": "<summary>\nall of it\n</summary>"}]
    error = await checkpoints.save(NS, lookup, compacted, {})
    assert error is not None and error.endswith("kept in this process's memory only"), error

    later = [*messages, {"role": "user", "content": "and now?"}]
    found = await checkpoints.lookup(NS, later)
    assert found.hit and found.held
    assert found.messages == [*compacted, later[-1]]
    if backend == "redis-gone":
        # The store's reads fail too: the response says the checkpoint came from memory.
        assert found.store_error is not None and "kept in this process's memory" in (
            found.store_error
        )
    # Never across a namespace: another tenant's identical conversation finds nothing.
    assert not (await checkpoints.lookup("ns-bob", later)).hit
    await store.close()


async def test_a_stored_checkpoint_longer_than_the_held_one_wins() -> None:
    store = MemoryStore()
    checkpoints = Checkpoints(store, ttl_seconds=60)
    messages = conversation(4)
    rest = messages[1:]
    hashes = chain(NS, rest)
    checkpoints.held.put(NS, hashes[2], checkpoint("held"), 60)
    await store.put(NS, hashes[5], checkpoint("stored"), 60)
    found = await checkpoints.lookup(NS, messages)
    assert found.hit and not found.held and found.covered == 6
