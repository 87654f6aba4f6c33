"""Selective tool calls: drop old tool-call groups entirely, keep the newest N.

Agent Framework (Python ``SelectiveToolCallCompactionStrategy``) semantics: every kept
``tool_call`` group (an assistant message with ``tool_calls`` or a legacy ``function_call`` plus
every result answering it) except the newest ``keep_last_tool_call_groups`` (default 1; 0 drops
them all) is removed as one unit; nothing is inserted in its place.  User and plain assistant
messages are untouched.

Trigger/target/``minimum_preserved`` as in :mod:`.tool_result_compaction`: by default it
fires always and drops all but the newest N (the anchor's shape); a configured trigger without
a target drops oldest first until the trigger stops firing.  ``minimum_preserved`` (default 0)
keeps the newest N non-system groups of any kind.

Deliberate differences from the Agent Framework: the newest step's tool-call group is never dropped
(an invariant, see "Groups and invariants" in compaction_proxy/compaction/README.md; older steps of
the running turn
are), and grouping follows our view
(``developer`` is a system message; an orphan result run that does not follow a call shares its
neighbour's fate instead of being a ``tool_call`` group of its own).
"""

from __future__ import annotations

from ..draft import Draft
from ..view import Group
from ._support.old_tool_groups import OldToolGroupsParams, OldToolGroupsStrategy


class SelectiveToolCallsParams(OldToolGroupsParams):
    """``strategy: selective_tool_calls``: drop old tool-call groups, keep the newest N."""


class SelectiveToolCallsStrategy(OldToolGroupsStrategy):
    """Drop all but the newest N tool-call groups (see the module docstring)."""

    name = "selective_tool_calls"
    verb = "dropped"

    def act(self, draft: Draft, group: Group) -> None:
        draft.drop(group)
