"""A request's recall loop as observability reads it, and the one outcome it is counted under.

The loop (compaction_proxy/api/_recall.py) keeps its figures on the request, and the finished
request hands them over as ``recall`` (None when the request was not offered the recall tool).
Telemetry reads them through :class:`RecallFigures`, a protocol the loop's ``RecallStats``
satisfies, so nothing here imports the request path. Only counts leave this module: never an
id, a query or a recalled text.

Each request offered the tool is counted under exactly one outcome (:data:`OUTCOMES`), so the
outcomes add up to the requests offered it. The first that applies wins:

* ``unavailable``: the archive store failed while a recall was answered (the model was told
  so; the request went on);
* ``limit``: the rounds or the time budget ran out (or a continuation was refused as too long)
  and a closing round went without tools;
* ``answered``: at least one hidden round answered recall calls, within the bounds;
* ``deferred``: the model called recall only beside client tools, so those calls were dropped
  from the reply and left to the next request;
* ``unused``: the tool was offered and not called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["OUTCOMES", "RecallFigures", "RecallTally"]

OUTCOMES = ("answered", "limit", "deferred", "unavailable", "unused")
"""The ``outcome`` label of ``compaction_proxy_recall_requests_total``, a closed set."""


class RecallFigures(Protocol):
    """One request's recall loop (``compaction_proxy.api._outcome.RecallStats`` provides it).

    ``rounds``: hidden rounds, each one upstream call more than the client's (a closing round
    counts); ``calls``: recall calls answered; ``ids``: archived originals returned;
    ``tokens``: tokens of the answers; ``deferred``: recall calls dropped from a mixed turn;
    ``unavailable``: the archive store failed while answering; ``limited``: the bounds ended
    the loop with a closing round; ``seconds``: time spent in hidden rounds.
    """

    @property
    def rounds(self) -> int: ...
    @property
    def calls(self) -> int: ...
    @property
    def ids(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def deferred(self) -> int: ...
    @property
    def unavailable(self) -> bool: ...
    @property
    def limited(self) -> bool: ...
    @property
    def seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RecallTally:
    """A frozen copy of one request's figures, as the dashboard's ring keeps them: the row must
    not hold on to (or change with) an object of the request path."""

    outcome: str
    rounds: int
    calls: int
    ids: int
    tokens: int
    deferred: int
    unavailable: bool
    seconds: float

    @classmethod
    def of(cls, figures: RecallFigures) -> RecallTally:
        return cls(
            outcome_of(figures),
            figures.rounds,
            figures.calls,
            figures.ids,
            figures.tokens,
            figures.deferred,
            figures.unavailable,
            figures.seconds,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "rounds": self.rounds,
            "calls": self.calls,
            "ids": self.ids,
            "tokens": self.tokens,
            "deferred": self.deferred,
            "unavailable": self.unavailable,
            "ms": round(self.seconds * 1000, 1),
        }


def outcome_of(figures: RecallFigures) -> str:
    """The one outcome a request offered the tool is counted under (the module's list)."""
    if figures.unavailable:
        return "unavailable"
    if figures.limited:
        return "limit"
    if figures.rounds > 0:
        return "answered"
    if figures.deferred > 0:
        return "deferred"
    return "unused"
