"""The default pipeline's tool-result collapse, with a cap that scales with the budget.

The Agent Framework's collapse caps each ``[Tool results: ...]`` message at a fixed 4,096
characters.  At a small window that keeps a ~900-token result almost whole (an 8k model's budget
holds six of them), so collapsing frees nothing and every compaction event has to call the
summarizer.  The default pipeline (LibreChat's block, or no block) collapses instead to
:data:`DEFAULT_SHARE` of the budget per collapsed group (about four characters a token), never
more than the configured cap and never less than :data:`FLOOR_CHARS`: the head and the tail of
each result, with the cut marked, as the explicit strategy does.  At 8k that is ~450
characters, at 32k ~2,150, from ~40k on the 4,096 cap itself.  So most events collapse old
results without a summarizer call, and the summarizer runs when the collapsed stubs themselves
add up (see "What compaction keeps" in compaction_proxy/compaction/README.md).  An explicitly
configured
``tool_result_compaction`` keeps the fixed cap.
"""

from __future__ import annotations

import math

from ...draft import Draft
from ...view import Group
from ..tool_result_compaction import ToolResultCompactionStrategy, summary_message

DEFAULT_SHARE = 0.02
"""A collapsed group's share of the budget (in estimated tokens)."""
FLOOR_CHARS = 300
"""The smallest cap: the head and tail of a result still say what it was and how it ended."""
CHARS_PER_TOKEN = 4


class ScaledToolResultCompaction(ToolResultCompactionStrategy):
    """``tool_result_compaction`` with the cap of the module docstring."""

    def __init__(self, *, share: float = DEFAULT_SHARE, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        if not 0 < share <= 1:
            raise ValueError("share must be > 0 and <= 1")
        self.share = share

    def cap(self, draft: Draft) -> int:
        """The cap of a collapsed message for this draft's budget, in characters."""
        scaled = math.floor(self.share * draft.budget.limit * CHARS_PER_TOKEN)
        return min(self.max_summary_chars, max(FLOOR_CHARS, scaled))

    def act(self, draft: Draft, group: Group) -> None:
        draft.replace(group, [summary_message(draft, group, self.cap(draft))])
