"""What a compacted request may need from its format to be accepted upstream, and what the
format may know of that upstream (:meth:`~.format.WireFormat.amend`,
:meth:`~.recall.RecallWire.amend`). A module of its own so the format protocol and the recall
protocol both name them without importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class UpstreamTraits:
    """What a format may need to know of the upstream a compacted request goes to.

    ``native``: the API's own server (Anthropic's ``api.anthropic.com``, or a gateway declared to
    pass Anthropic's fields and betas through), which checks what that API checks: for
    Messages, that a replayed thinking block's conversation prefix is unchanged
    (:meth:`WireFormat.amend`). A local server checks no signature and may refuse a field or
    beta it does not know."""

    native: bool = False


@dataclass(frozen=True, slots=True)
class Amendment:
    """What a compacted request needs besides its rewritten items to be accepted upstream
    (:meth:`WireFormat.amend`): top-level ``members`` written into the forwarded body (in
    place of the client's value, or added; every other byte the client's), ``listed`` values
    appended to a comma-separated request header for that upstream request only (added when
    the client sent none), and ``notes`` for ``X-Compaction-Warning``."""

    members: Mapping[str, Any] = field(default_factory=dict)
    listed: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
