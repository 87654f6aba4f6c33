"""What one compaction run archives, recorded where the draft decides (``compaction.recall``).

The :class:`~.draft.Draft` calls an :class:`ArchiveLog` at its decision points, whatever the
strategy (see "Recall marks" in docs/compaction.md):

* an **edit** (a cleared or trimmed result, cleared call arguments; also the last resort's trim):
  the message it replaces is an original, archived under its id
  (:meth:`~.archive.RecallIds.original`, keyed by the request's namespace), unless it is a
  *stub* already (its text ends with a mark naming an ``r…`` id, or it is an edit this
  run made), whose id is kept.  The new message is marked with that id;
* a **drop** or a **replace** of a group: every member is archived (a stub archives nothing new:
  its id is listed instead).  A member that stands for several itself (its mark names an
  ``s…`` span: an older summary folded into a new one, a collapsed group) is archived as an
  original *and* its span id is listed, so what it covered stays reachable.  One this same run
  made is not archived: it was made from what the run archived, and its span id is listed;
* a **span**: a replacement message (a collapsed group) stands for its group's ids; a message
  inserted with ``paid_by`` (a summary) stands for every id dropped by the same strategy run
  before it (since the draft's last commit), in drop order.  Its id is
  :meth:`~.archive.RecallIds.span` of those ids and the message's own text (without the mark),
  so the same fold of the same originals gets the same id on every request.

Nothing here is final until :meth:`ArchiveLog.result`: a strategy the churn rule undoes
(:mod:`.strategies._support.churn`) puts the originals back into the output, so the result is
computed from what the output actually lacks (by identity: an original counts when its object is
gone from the projected output, or when a mark in the output names it), and the spans from the marks
that reach the output (and those reachable from them).  ``order`` is oldest first: each entry where
its message stood in the request (a message the run made stands where the message it replaced stood;
a span after the newest of its members), ties in the order of the decisions.  Besides the originals
and spans it lists the ids of stubs this run dropped (their ids leave the forwarded text); a stub
edited again keeps its id in the text and is not listed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .archive import Archived, RecallIds
from .chat_messages import Message, text_only
from .marks import can_carry_mark, marked, message_mark, span_mark, strip_mark

__all__ = ["ArchiveLog"]


class _Entry(NamedTuple):
    """One archived message (an original, or a stub whose id a drop listed).  A tuple: one is
    made per message a run removes, thousands at a time."""

    recall_id: str
    message: Message
    anchor: float
    seq: int


class _Span(NamedTuple):
    members: tuple[str, ...]
    anchor: float
    seq: int


class ArchiveLog:
    """The archive decisions of one run over ``inputs`` (the request's messages), naming what
    it archives with ``ids`` (the archive namespace's keyed ids)."""

    def __init__(self, inputs: Sequence[Message], ids: RecallIds) -> None:
        self._ids = ids
        self._positions = {id(m): float(i) for i, m in enumerate(inputs)}
        self._inputs = inputs  # keeps the objects the positions are keyed by alive
        self._seq = 0
        self._originals: dict[int, _Entry] = {}
        self._dropped_stubs: dict[int, _Entry] = {}
        self._spans: dict[str, _Span] = {}
        self._made: dict[int, tuple[str, Message]] = {}
        """id(an edit this run made) -> the id of the original it stands for (and the edit)."""
        self._anchors: dict[int, tuple[float, Message]] = {}
        """id(a message this run made) -> where it stands (and the message, kept alive)."""
        self._made_spans: dict[int, str] = {}
        """id(a summary or collapsed message this run made) -> the span it stands for."""
        self._loose: list[str] = []
        self._loose_anchor = -math.inf

    # ------------------------------------------------------------------ ids
    def stub_id(self, message: Message) -> str | None:
        """The original's id ``message`` stands for, when it is a stub (else ``None``)."""
        return self._marks(message)[0]

    def _marks(self, message: Message) -> tuple[str | None, str | None]:
        """``(stub id, span id)`` of ``message``: the original it stands for when it is a stub
        (an edit this run made, or a text ending with an ``r…`` mark), the span it stands for
        when its text ends with an ``s…`` mark."""
        made = self._made.get(id(message))
        if made is not None:
            return made[0], None
        mark = message_mark(message)
        if mark is None:
            return None, None
        return (mark, None) if mark.startswith("r") else (None, mark)

    def edit_id(self, current: Message) -> str:
        """The id an edit of ``current`` names: its own stub id, or its id as an original."""
        return self.stub_id(current) or self._ids.original(current)

    def members(self, messages: Iterable[Message]) -> list[str]:
        """The ids removing ``messages`` would list (nothing recorded)."""
        out: list[str] = []
        for message in messages:
            stub, span = self._marks(message)
            if stub is not None:
                out.append(stub)
                continue
            made_span = self._made_spans.get(id(message))
            if made_span is not None:  # made by this run: its span says it all
                out.append(made_span)
                continue
            out.append(self._ids.original(message))
            if span is not None:  # an older span: what it covered stays reachable
                out.append(span)
        return out

    def span_marked(self, message: Message, members: Sequence[str]) -> Message:
        """``message`` with the mark of the span of ``members`` (nothing recorded)."""
        return marked(message, span_mark(self._span_id(message, members)))

    def _span_id(self, message: Message, members: Sequence[str]) -> str:
        return self._ids.span(tuple(members), strip_mark(text_only(message)).rstrip())

    # ------------------------------------------------------------------ recording
    def edited(self, current: Message, new: Message, recall_id: str) -> None:
        """``current`` was replaced by ``new`` (marked with ``recall_id``)."""
        anchor = self._anchor(current)
        if self.stub_id(current) is None:
            self._archive(current, recall_id, anchor)
        self._made[id(new)] = (recall_id, new)
        self._anchors[id(new)] = (anchor, new)

    def removed(self, messages: Sequence[Message], *, loose: bool) -> tuple[list[str], float]:
        """``messages`` were dropped or replaced: the ids they list, and where the newest of
        them stood.  ``loose``: a drop, whose ids the next paid message's span takes in."""
        out: list[str] = []
        newest = -math.inf
        for message in messages:
            anchor = self._anchor(message)
            newest = max(newest, anchor)
            stub, span = self._marks(message)
            if stub is not None:
                self._dropped_stubs[id(message)] = _Entry(stub, message, anchor, self._next())
                out.append(stub)
                continue
            made_span = self._made_spans.get(id(message))
            if made_span is not None:  # made by this run from what is archived: its span says
                out.append(made_span)  # it all
                continue
            recall_id = self._ids.original(message)
            self._archive(message, recall_id, anchor)
            out.append(recall_id)
            if span is not None:
                out.append(span)
        if loose:
            self._loose.extend(out)
            self._loose_anchor = max(self._loose_anchor, newest)
        return out, newest

    def replaced(
        self, messages: Sequence[Message], members: Sequence[str], anchor: float
    ) -> list[Message]:
        """The replacement ``messages`` of a group whose members list ``members`` (the newest
        stood at ``anchor``): the last one that can carry a mark gets the span's."""
        out = list(messages)
        for position in range(len(out) - 1, -1, -1):
            if can_carry_mark(out[position]):
                out[position] = self._spanned(out[position], members, anchor)
                break
        return out

    def paid(self, messages: Sequence[Message]) -> list[Message]:
        """Messages inserted with ``paid_by`` (a summary): each marked with the span of the ids
        dropped since the last commit, which it takes (none dropped: no span, no mark)."""
        members, anchor = self._loose, self._loose_anchor
        self.settle()
        if not members:
            return list(messages)
        return [self._spanned(m, members, anchor) if can_carry_mark(m) else m for m in messages]

    def settle(self) -> None:
        """The draft committed (or rolled back): drops no longer wait for a summary."""
        self._loose = []
        self._loose_anchor = -math.inf

    def _spanned(self, message: Message, members: Sequence[str], anchor: float) -> Message:
        """``message`` marked with the span of ``members``, the span recorded."""
        recall_id = self._span_id(message, members)
        new = marked(message, span_mark(recall_id))
        self._spans.setdefault(recall_id, _Span(tuple(members), anchor, self._next()))
        self._anchors[id(new)] = (anchor, new)
        self._made_spans[id(new)] = recall_id
        return new

    def _archive(self, message: Message, recall_id: str, anchor: float) -> None:
        if id(message) not in self._originals:
            self._originals[id(message)] = _Entry(recall_id, message, anchor, self._next())

    def _anchor(self, message: Message) -> float:
        position = self._positions.get(id(message))
        if position is not None:
            return position
        made = self._anchors.get(id(message))
        return made[0] if made is not None else math.inf

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    # ------------------------------------------------------------------ result
    def result(self, output: Sequence[Message]) -> Archived | None:
        """What the run archived, given its final ``output`` (see the module docstring);
        ``None`` when nothing was."""
        present = {id(m) for m in output}
        named = {mark for mark in map(message_mark, output) if mark is not None}
        originals = [
            e for key, e in self._originals.items() if key not in present or e.recall_id in named
        ]
        if not originals and not self._spans:
            return None
        stubs = [e for key, e in self._dropped_stubs.items() if key not in present]
        roots = named | {m for m in (message_mark(e.message) for e in originals) if m}
        spans: dict[str, _Span] = {}
        todo = [r for r in roots if r in self._spans]
        while todo:
            recall_id = todo.pop()
            if recall_id in spans:
                continue
            span = spans[recall_id] = self._spans[recall_id]
            todo.extend(m for m in span.members if m in self._spans)
        if not originals and not spans:
            return None
        ranked: list[tuple[float, int, str]] = [
            *((e.anchor, e.seq, e.recall_id) for e in (*originals, *stubs)),
            *((s.anchor, s.seq, recall_id) for recall_id, s in spans.items()),
        ]
        ranked.sort()
        return Archived(
            originals={e.recall_id: e.message for e in originals},
            spans={recall_id: span.members for recall_id, span in spans.items()},
            order=tuple(dict.fromkeys(recall_id for _, _, recall_id in ranked)),
        )
