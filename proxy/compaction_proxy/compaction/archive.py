"""Recall ids and the marks that name them (docs/recall.md).

With ``compaction.recall`` on, nothing the pipeline removes is lost: each removed or rewritten
message is archived under a *recall id*, and what stands in for it in the forwarded request
names that id, so the model can ask for the original back (the ``compaction_recall`` tool).

An id is a *keyed* digest of the original's canonical bytes (:class:`RecallIds`): the key is
the archive namespace's own (one per API key, tenant and end user, derived by the edge from a
server secret, compaction_proxy/checkpoints/_archive.py), so an id reveals nothing about its
content to anyone without the secret (nobody can compute the id of a guessed message), and the
same message archived for two end users gets two unrelated ids. With one key it is the same on
every request, every replica and after a restart: a tool result cleared again on the next
request (its checkpoint expired) gets the same placeholder, byte for byte, and the forwarded
prefix stays stable. The core holds no key: the request hands it in
(``CompactionRequest.recall``).

* an original's id: ``r`` and 11 base32 characters (55 bits: collisions within one end user's
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
    "RecallIds",
    "mark_of",
]

Message = Mapping[str, Any]

ID_LENGTH = 12
ID_PATTERN = re.compile(r"\b[rs][a-z2-7]{11}\b")
"""A recall id anywhere in a text (the tool's ``ids`` are checked against it)."""
MARK = re.compile(r"\[(?:[^\[\]]*?)recall id ([rs][a-z2-7]{11})\]\s*$")
"""A mark at the end of a text: the id it names is group 1."""


_PERSON = b"cp-recall-k1"
KEY_BYTES = 32
"""The length of a namespace's key (BLAKE2b takes up to 64 bytes)."""


@dataclass(frozen=True, slots=True)
class RecallIds:
    """How one archive namespace names what it keeps: BLAKE2b keyed by ``key``.

    ``key`` is the namespace's own (:data:`KEY_BYTES`, derived by the edge from a server
    secret and the namespace): without it an id cannot be computed from content, and the same
    original gets an unrelated id in another namespace. With it the id is the same on every
    request, replica and restart (see the module docstring)."""

    key: bytes

    def __post_init__(self) -> None:
        if not 1 <= len(self.key) <= 64:
            raise ValueError("a recall id key is 1 to 64 bytes")

    def _short(self, kind: str, data: bytes) -> str:
        raw = hashlib.blake2b(data, digest_size=8, key=self.key, person=_PERSON).digest()
        return kind + base64.b32encode(raw).decode("ascii").lower()[: ID_LENGTH - 1]

    def original(self, message: Message) -> str:
        """The recall id of an original message."""
        return self._short("r", canonical_bytes(message))

    def span(self, members: tuple[str, ...] | list[str], text: str = "") -> str:
        """The recall id of a span: what a summary (``text``) stands for, the ``members``'
        ids."""
        return self._short("s", canonical_bytes([text, list(members)]))


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
