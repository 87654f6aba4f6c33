"""Reading stored values back: the longest valid hit of a lookup (:func:`pick_longest`, shared
by every store), with checkpoints decoded once per process (stored bytes -> the parsed,
checked value).

A checkpoint hit reads the same stored value on every request of a conversation until its
next compaction, and parsing and checking it (``Checkpoint.from_bytes``: orjson plus the
client-message validator) cost ~4 ms for the 1.8 MB value of a 500k-token session. The memo
is keyed by the bytes themselves, not by the store key: the store is still asked on every
request, so a checkpoint that expired or was deleted (a prepared one, used) is never served
from here, and a key rewritten with another value gets that value. Hashing the bytes costs a
tenth of decoding them. Foreign values raise as before and are never remembered.

The decoded messages are shared by the requests that hit them: like a client's parsed body,
the pipeline only reads them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ._contract import Checkpoint, Foreign, ForeignValue

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""Stored bytes the memo holds at most (the decoded objects take a few times that)."""
MIN_BYTES = 4096
"""Smaller values decode in microseconds: not worth an entry."""


class DecodedCheckpoints:
    """A bounded LRU of decoded checkpoints, by the stored bytes' total size."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, Checkpoint] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Stored bytes held."""
        return self._bytes

    def decode(self, data: object) -> Checkpoint:
        """``Checkpoint.from_bytes(data)``, from the memo when these bytes were seen."""
        if type(data) is not bytes or not MIN_BYTES <= len(data) <= self.max_bytes:
            return Checkpoint.from_bytes(data)
        with self._lock:
            found = self._entries.get(data)
            if found is not None:
                self._entries.move_to_end(data)
                return found
        checkpoint = Checkpoint.from_bytes(data)  # ForeignValue propagates, nothing kept
        with self._lock:
            if data not in self._entries:
                self._entries[data] = checkpoint
                self._bytes += len(data)
                while self._bytes > self.max_bytes:
                    old, _ = self._entries.popitem(last=False)
                    self._bytes -= len(old)
        return checkpoint


DECODED = DecodedCheckpoints()
"""The process's memo, shared by every store (the decoding does not depend on which)."""


@dataclass(frozen=True, slots=True)
class Picked:
    """What :func:`pick_longest` made of a lookup's rows."""

    hit: tuple[int, Checkpoint] | None
    foreign: tuple[Foreign, ...] = ()


def pick_longest(keys: Sequence[str], found: Mapping[str, object]) -> Picked:
    """The valid hit with the largest index among ``found`` (key -> stored bytes), and the
    foreign values passed over on the way to it.

    Rows shorter than the hit are not parsed, so only foreign rows that hid a prefix are
    reported; the others are found once they become the longest.
    """
    foreign: list[Foreign] = []
    for index in range(len(keys) - 1, -1, -1):
        key = keys[index]
        data = found.get(key)
        if data is None:
            continue
        try:
            return Picked((index + 1, DECODED.decode(data)), tuple(foreign))
        except ForeignValue as exc:
            if all(item.key != key for item in foreign):  # a chain may repeat a key
                foreign.append(Foreign(key, data, exc.reason))
    return Picked(None, tuple(foreign))


def live_payloads(
    entries: Mapping[tuple[str, str], tuple[float, bytes]],
    namespace: str,
    keys: Sequence[str],
    now: float,
    expire: Callable[[tuple[str, str]], None],
) -> dict[str, bytes]:
    """Of an in-process table of ``(namespace, key) -> (expires, bytes)``, the payloads of
    ``keys`` still alive at ``now`` (what :func:`pick_longest` reads); ``expire`` is called
    with each expired entry met on the way.  The memory store and the held checkpoints share
    it."""
    found: dict[str, bytes] = {}
    for key in keys:
        entry = entries.get((namespace, key))
        if entry is None:
            continue
        if entry[0] <= now:
            expire((namespace, key))
            continue
        found[key] = entry[1]
    return found
