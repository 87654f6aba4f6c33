"""One summarization event: ask the summarizer for the stretch, fold more into the summary
while it and what stays do not fit, and write the checkpoint (see "The summary's size" and
"Validation and failure" in :mod:`..summarization`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from ...chat_messages import Message
from ...draft import Draft
from ...marks import strip_mark
from ...summarizer_contract import (
    Summarizer,
    SummaryError,
    SummaryRequest,
    is_cut,
    without_cut_mark,
)
from ...view import SUMMARY_PREFIX, SUMMARY_SUFFIX, Group, GroupKind
from ..base import StrategyContext, StrategyOutcome
from .summary_record import record_summary_check
from .summary_selection import Summarizing, foldable, shown_indices
from .tool_results import newest_non_system

_ERROR_DETAIL_CHARS = 200
SUMMARY_OPEN = SUMMARY_PREFIX + "\n"


def wrap_summary(text: str) -> str:
    """The checkpoint content for summary ``text``."""
    return f"{SUMMARY_OPEN}{text}{SUMMARY_SUFFIX}"


def unwrap_summary(content: str) -> str:
    """The summary text inside a checkpoint's content (inverse of :func:`wrap_summary`).

    Our own wrapper is removed exactly (and the span mark recall puts after it).  A checkpoint
    written with another note (an older version, another tool) loses its ``<summary>`` opening
    and everything from the last ``</summary>`` on.
    """
    content = strip_mark(content)
    if content.startswith(SUMMARY_OPEN) and content.endswith(SUMMARY_SUFFIX):
        return content[len(SUMMARY_OPEN) : len(content) - len(SUMMARY_SUFFIX)]
    body = content.removeprefix(SUMMARY_PREFIX)
    end = body.rfind("</summary>")
    if end >= 0:
        body = body[:end]
    return body.strip("\n")


@dataclass(frozen=True)
class _Refused:
    """A summarizer call that gave no usable summary; ``counted``: the note counts the
    messages left unsummarized (not for a summarizer that raised something unexpected)."""

    reason: str
    message: str
    counted: bool = True


class SummaryEvent:
    """The calls and the checkpoint of one event over ``folded`` (what selection chose)."""

    def __init__(
        self,
        strategy: Summarizing,
        draft: Draft,
        ctx: StrategyContext,
        folded: Sequence[Group],
    ) -> None:
        self.strategy = strategy
        self.draft = draft
        self.ctx = ctx
        self.folded = list(folded)
        self.bound = strategy.summary_bound(draft)
        self.previous = _summaries(draft, folded)
        self.notes: list[str] = []

    async def run(self, summarizer: Summarizer) -> StrategyOutcome:
        """Up to ``max_rounds`` calls, then the checkpoint (or the first call's failure)."""
        draft, strategy = self.draft, self.strategy
        indices = shown_indices(draft, self.folded)
        request = self._request(indices, self.previous)
        shown = len(indices)
        text: str | None = None
        accepted = self.folded
        for round_number in range(1, strategy.max_rounds + 1):
            answer = await _answer(summarizer, request)
            if isinstance(answer, _Refused):
                if text is None:
                    return _failed(answer.reason, answer.message, shown if answer.counted else 0)
                failed = f"folding more failed ({answer.reason}); the summary before is kept"
                self.notes.append(failed)
                break
            text, accepted = answer, self.folded
            new_tokens = draft.measure(strategy.summary_message(text)).token_count
            if round_number == strategy.max_rounds or self._fits(text, new_tokens):
                break
            deeper = self._fold_more(text, new_tokens)
            if deeper is None:
                break
            request, extra = deeper
            shown += extra
        assert text is not None
        return self._write(text, accepted, shown)

    def _request(self, indices: Sequence[int], previous: Sequence[str]) -> SummaryRequest:
        return SummaryRequest(
            messages=tuple(_as_dict(self.draft.message(i)) for i in indices),
            previous_summary="\n\n".join(previous) if previous else None,
            model=self.ctx.model,
            max_tokens=self.bound,
        )

    def _fits(self, text: str, new_tokens: int) -> bool:
        """Whether the checkpoint of ``text`` (``new_tokens`` tokens) over the current fold
        keeps the summary within its bound and the request within the budget (with the span
        mark it gets with recall on)."""
        draft = self.draft
        overhead = draft.measure(self.strategy.summary_message("")).token_count
        if new_tokens - overhead > self.bound:
            return False
        if draft.recall:
            message = draft.preview_paid(self.strategy.summary_message(text), self.folded)
            new_tokens = draft.measure(message).token_count
        folded = sum(draft.group_tokens(g) for g in self.folded)
        after = draft.prompt_tokens - folded + new_tokens
        return draft.calibration.apply(after) <= draft.budget.limit

    def _fold_more(self, text: str, new_tokens: int) -> tuple[SummaryRequest, int] | None:
        """Take more into the fold (:meth:`_deeper`): the update request that folds it into
        ``text``, and how many messages it shows; ``None`` when there is nothing more."""
        more = self._deeper()
        extra = shown_indices(self.draft, more)
        if not extra:
            return None
        self.folded = sorted([*self.folded, *more], key=_index)
        self.notes.append(
            f"the summary ({new_tokens} tokens) and what stays did not fit the budget: "
            f"folded {len(more)} more group(s) into it"
        )
        return self._request(extra, [*_summaries(self.draft, more), text]), len(extra)

    def _deeper(self) -> list[Group]:
        """What to fold next when the summary and what stays do not fit: the older turns
        still kept verbatim (all but the newest turn), else the older steps of the newest
        turn; never the task, the newest step, a carried user message or the
        ``minimum_preserved`` floor."""
        draft = self.draft
        view = draft.view
        taken = {g.index for g in self.folded}
        floor = newest_non_system(draft, self.strategy.minimum_preserved)
        candidates = [
            g
            for g in draft.groups
            if g.kind is not GroupKind.SYSTEM
            and draft.is_kept(g)
            and g.index not in taken
            and g.index not in floor
            and foldable(draft, g)
        ]
        older = [g for g in candidates if not view.in_newest_turn(g)]
        return older or [g for g in candidates if view.in_newest_turn(g)]

    def _write(self, text: str, accepted: Sequence[Group], shown: int) -> StrategyOutcome:
        """Replace ``accepted`` by the checkpoint, unless it would not be shorter."""
        draft, strategy = self.draft, self.strategy
        message = draft.preview_paid(strategy.summary_message(text), accepted)
        new_tokens = draft.measure(message).token_count
        old_tokens = sum(draft.group_tokens(g) for g in accepted)
        if new_tokens >= old_tokens:
            return _failed(
                "not_shorter",
                f"the summary ({new_tokens} tokens) is not shorter than what it would replace "
                f"({old_tokens} tokens)",
                shown,
            )
        # Checked before it is stored: what the summary kept of the span on its own.
        items = strategy.check_items(draft, accepted)
        in_turn = any(draft.view.in_newest_turn(g) for g in accepted)
        # An earlier summary is folded into this one, and so is a carried user message the
        # selection took in to reach the target (summary_selection.TargetStop.with_carried).
        carried = sum(1 for g in accepted if g.kind is GroupKind.USER and draft.is_pinned(g))
        for group in accepted:
            draft.drop(group, release=draft.is_pinned(group))
        if in_turn:  # "progress so far": the task stays first
            draft.insert_after_task([message], paid_by=strategy.name)
        else:
            draft.insert_after_system([message], paid_by=strategy.name)
        kind = "updated the summary with" if self.previous else "summarized"
        folded_groups = sum(1 for g in accepted if g.kind is not GroupKind.SUMMARY)
        outcome = StrategyOutcome(
            changed=True,
            notes=(
                f"{kind} {shown} message(s) in {folded_groups} group(s): "
                f"{old_tokens} -> {new_tokens} tokens (at most {self.bound} allowed)",
                *self.notes,
                *(
                    (
                        f"{carried} carried user message(s) folded in too, oldest first: "
                        "the event's target counts them",
                    )
                    if carried
                    else ()
                ),
            ),
        )
        if is_cut(text):
            outcome = dataclasses.replace(
                outcome,
                warnings=(
                    *outcome.warnings,
                    "summary cut at its length limit: its complete lines kept, the rest missing",
                ),
            )
        return record_summary_check(outcome, text, items)


async def _answer(summarizer: Summarizer, request: SummaryRequest) -> str | _Refused:
    """The summary text of one call, or why there is none."""
    try:
        answer = await summarizer.summarize(request)
    except SummaryError as error:
        return _Refused(error.reason, error.message)
    except Exception as error:  # a summarizer bug must not fail the request
        detail = str(error)[:_ERROR_DETAIL_CHARS]
        return _Refused("error", f"summarizer raised {type(error).__name__}: {detail}", False)
    text = answer.strip() if isinstance(answer, str) else ""
    return text or _Refused("empty", "the summarizer returned no text")


def _summaries(draft: Draft, groups: Sequence[Group]) -> list[str]:
    """The texts of the earlier summaries among ``groups`` (their update's
    ``previous_summary``)."""
    return [
        without_cut_mark(unwrap_summary(str(draft.message(g.first).get("content", ""))))
        for g in groups
        if g.kind is GroupKind.SUMMARY
    ]


def _index(group: Group) -> int:
    return group.index


def _as_dict(message: Message) -> dict[str, Any]:
    return cast(dict[str, Any], message) if isinstance(message, dict) else dict(message)


def _failed(reason: str, message: str, count: int) -> StrategyOutcome:
    return StrategyOutcome(
        changed=False,
        notes=(f"{count} message(s) left unsummarized",) if count else (),
        failed=reason,
        failure_message=message,
    )
