"""What the recall loop did for one request (compaction_proxy/api/_recall.py): a value of its
own, read by the request's context, its outcome and telemetry, so none of them imports another
for it."""

from __future__ import annotations

from dataclasses import dataclass

UNAVAILABLE_WARNING = (
    b"recall archive unavailable: the recall tool answered that the originals cannot be read "
    b"right now"
)


@dataclass(slots=True)
class RecallStats:
    """What the loop did for one request (``X-Compaction-Recall``, metrics, dashboard).

    ``rounds``: hidden rounds, each one upstream call more than the client's (a closing
    round counts); ``calls``: recall calls answered; ``ids``: originals returned;
    ``tokens``: tokens of the answers; ``deferred``: recall calls dropped from a mixed turn;
    ``unavailable``: the archive could not be read; ``seconds``: time in hidden rounds.
    """

    rounds: int = 0
    calls: int = 0
    ids: int = 0
    tokens: int = 0
    deferred: int = 0
    unavailable: bool = False
    seconds: float = 0.0
    limited: bool = False
    fallback: bool = False  # a hidden round failed: the request went again without recall

    def header(self) -> tuple[bytes, bytes]:
        parts = [f"rounds={self.rounds}", f"calls={self.calls}", f"tokens={self.tokens}"]
        if self.deferred:
            parts.append(f"deferred={self.deferred}")
        if self.limited:
            parts.append("limited")
        if self.unavailable:
            parts.append("unavailable")
        if self.fallback:
            parts.append("fallback")
        return (b"x-compaction-recall", "; ".join(parts).encode())

    def headers(self) -> list[tuple[bytes, bytes]]:
        """``X-Compaction-Recall``, and a warning when the archive could not be read (a
        degraded path: compaction_proxy/engine/_degraded.py)."""
        said = [self.header()]
        if self.unavailable:
            said.append((b"x-compaction-warning", UNAVAILABLE_WARNING))
        return said
