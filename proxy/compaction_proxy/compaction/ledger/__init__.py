"""The artifact ledger: exact strings of what compaction folds, kept beside the summary.

See "The ledger" in docs/compaction.md.  :mod:`.extract` and :mod:`.statements` read a folded
group, :mod:`.items` merges, :mod:`.render` writes and parses the block, :mod:`.state` is the
draft's side of one run, and :mod:`.span` what a summary's check compares it with.
"""

from .items import Item, Section
from .render import LEDGER_CLOSE, LEDGER_PREFIX, is_ledger, parse, render
from .state import DraftLedger

__all__ = [
    "LEDGER_CLOSE",
    "LEDGER_PREFIX",
    "DraftLedger",
    "Item",
    "Section",
    "is_ledger",
    "parse",
    "render",
]
