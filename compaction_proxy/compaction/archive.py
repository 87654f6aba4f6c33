"""Recall ids and the marks that name them (docs/recall.md).

With ``compaction.recall`` on, nothing the pipeline removes is lost: each removed or rewritten
message is archived under a *recall id*, and what stands in for it in the forwarded request
names that id, so the model can ask for the original back (the ``compaction_recall`` tool).

An id is a digest of the original's canonical bytes, so it is the same on every request, every
replica and after a restart: a tool result cleared again on the next request (its checkpoint
expired) gets the same placeholder, byte for byte, and the forwarded prefix stays stable.

* an original's id: ``r`` and 11 base32 characters (55 bits: collisions within one tenant's
  archive are negligible at millions of entries);
* a span's id: ``s`` and 11 characters, for what one summary (or one collapsed group) stands
  for: the ids of the messages it replaced;
* the mark: `` [recall id r…]`` at the end of a placeholder's text, ``[... recall id s…]`` at
  the end of a summary. A message that ends with a mark is a *stub*: its original is already
  archived, under the id the mark names.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .canonical import canonical_bytes

__all__ = [
    "ID_PATTERN",
    "Archived",
    "mark_of",
    "original_id",
    "span_id",
]

Message = Mapping[str, Any]

ID_LENGTH = 12
ID_PATTERN = re.compile(r"\b[rs][a-z2-7]{11}\b")
"""A recall id anywhere in a text (the tool's ``ids`` are checked against it)."""
MARK = re.compile(r"\[(?:[^\[\]]*?)recall id ([rs][a-z2-7]{11})\]\s*$")
"""A mark at the end of a text: the id it names is group 1."""


def _short(kind: str, data: bytes) -> str:
    raw = hashlib.blake2b(data, digest_size=8, person=b"cp-recall").digest()
    return kind + base64.b32encode(raw).decode("ascii").lower()[: ID_LENGTH - 1]


def original_id(message: Message) -> str:
    """The recall id of an original message: stable across requests and replicas."""
    return _short("r", canonical_bytes(message))


def span_id(members: tuple[str, ...] | list[str], text: str = "") -> str:
    """The recall id of a span: what a summary (``text``) stands for, the ``members``' ids."""
    return _short("s", canonical_bytes([text, list(members)]))


def mark_of(text: str) -> str | None:
    """The recall id a text's closing mark names, or None: not a stub."""
    if "recall id " not in text:
        return None
    match = MARK.search(text)
    return None if match is None else match.group(1)


@dataclass(frozen=True, slots=True)
class Archived:
    """What one compaction run removed, to keep beside its checkpoint.

    ``originals``: recall id -> the original message, as the pipeline saw it (a client's
    message, or one of a checkpoint's); ``spans``: span id -> the ids it stands for (originals
    of this run, stubs' ids, older spans folded into a new summary). ``order``: every id this
    run archived or referred to, oldest first (the conversation's index appends them).
    """

    originals: Mapping[str, Message] = field(default_factory=dict)
    spans: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.originals or self.spans)
