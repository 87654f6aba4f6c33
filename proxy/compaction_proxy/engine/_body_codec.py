"""A parsed JSON body in pieces, so rebuilding it never holds the GIL for long.

A body parsed in the worker process (compaction_proxy/engine/_offload.py) has to come back
as Python objects. Unpickling it whole would hold the GIL as long as parsing it did (orjson
never releases it: 280 ms for 31 MiB of small messages), which is the stall the worker
process exists to avoid. So :func:`encode` cuts the tree into events: any subtree up to
:data:`PIECE_BYTES` of JSON is one, a larger list or object is opened, filled from its
children, and closed. :func:`decode` unpickles one piece at a time, on a
worker thread, and the event loop gets the GIL back between pieces.

The objects are the ones the parser made (pickle keeps every type and key order), so the
body is the same whichever process parsed it.
"""

from __future__ import annotations

import pickle
from typing import Any

import orjson

PIECE_BYTES = 256 * 1024
"""A subtree whose JSON is at most this long travels as one pickle (about a millisecond to
unpickle); a larger list or object is opened, filled from its children, and closed."""

_LEAF, _LIST, _DICT, _CLOSE = 0, 1, 2, 3
_CLOSE_EVENT: tuple[Any, ...] = (_CLOSE,)


def _json_size(node: object) -> int:
    """How large ``node`` is, cheaply: its JSON length (orjson is fast); its pickle's for what
    orjson cannot write (an integer past 64 bits, if the parser ever makes one)."""
    try:
        return len(orjson.dumps(node))
    except TypeError:
        return len(pickle.dumps(node, pickle.HIGHEST_PROTOCOL))


def encode(root: list[Any] | dict[str, Any], piece: int = PIECE_BYTES) -> list[bytes]:
    """``root`` as a list of pickled events (see the module docstring); the root itself is
    always opened, since only a large body is encoded at all."""
    events: list[bytes] = []
    stack: list[tuple[Any, ...]] = [(None, root, True)]
    while stack:
        item = stack.pop()
        if item is _CLOSE_EVENT:
            events.append(_PICKLED_CLOSE)
            continue
        key, node, big = item
        if not big or not isinstance(node, list | dict) or _json_size(node) <= piece:
            events.append(pickle.dumps((_LEAF, key, node), pickle.HIGHEST_PROTOCOL))
            continue
        events.append(pickle.dumps((_LIST if isinstance(node, list) else _DICT, key)))
        stack.append(_CLOSE_EVENT)
        children = node.items() if isinstance(node, dict) else ((None, c) for c in node)
        # A child is measured only when it could be large: a scalar never needs opening.
        stack.extend(reversed([(k, c, isinstance(c, list | dict)) for k, c in children]))
    return _batched(events, piece)


_PICKLED_CLOSE = pickle.dumps(_CLOSE_EVENT, pickle.HIGHEST_PROTOCOL)


def _batched(events: list[bytes], piece: int) -> list[bytes]:
    """Small events joined into pickled lists of about ``piece`` bytes: fewer, larger
    messages between the processes, each still quick to unpickle."""
    out: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for event in events:
        batch.append(event)
        size += len(event)
        if size >= piece:
            out.append(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL))
            batch, size = [], 0
    if batch:
        out.append(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL))
    return out


def decode(pieces: list[bytes]) -> Any:
    """The value :func:`encode` cut into ``pieces``."""
    root: Any = None
    open_: list[Any] = []
    for blob in pieces:
        for pickled in pickle.loads(blob):  # our own worker process made these
            event = pickle.loads(pickled)
            op = event[0]
            if op == _CLOSE:
                open_.pop()
                continue
            value: Any = event[2] if op == _LEAF else [] if op == _LIST else {}
            if open_:
                parent = open_[-1]
                if isinstance(parent, list):
                    parent.append(value)
                else:
                    parent[event[1]] = value
            else:
                root = value
            if op != _LEAF:
                open_.append(value)
    return root
