"""The edge's handle on compaction (compaction_proxy/engine/README.md).

Two layers over the pure core (`compaction_proxy/compaction/`): :class:`Compactor` runs the
configured pipeline for a request's model (tokenizers, catalog, worker thread, calibration), and
:class:`CompactionFlow` wraps one request's compaction in checkpoints and a guarded summarizer.
The modules:

* ``_compactor``: the core run for a model, on the compaction thread (``_calibration``: the
  upstream's count over ours; ``_quiet``: the limit under which a request skips the view);
* ``_flow``: one request's compaction, stated as a frozen :class:`FlowRequest` (lookup,
  compact, a prepared checkpoint, decide what to save once accepted); ``_hit_report``:
  a checkpoint hit's report in the client's terms;
* ``_prepare``: summaries prepared in the background, before the trigger needs them;
* ``_degraded``: the store, the summarizer and the recall archive as degraded paths, each
  logged once when it starts failing and once when it recovers, counted between;
* ``_recall_desk``: the answer to one ``compaction_recall`` call, from the archive;
* ``_offload``: large bodies parsed off the event loop (``_body_codec``: what a worker process
  sends back).
"""

from ._build import build_flow
from ._compactor import Compactor, RunExtras, RunWindow
from ._degraded import DegradedPath, DegradedPaths
from ._flow import CompactionFlow
from ._flow_values import FlowRequest, FlowResult
from ._known import ConversationMemory, Known
from ._offload import OFFLOAD_BYTES, settle_collector
from ._prepare import PreparedStats
from ._recall_desk import RecallDesk, Recalled
from ._recallable import Recallable

__all__ = [
    "OFFLOAD_BYTES",
    "CompactionFlow",
    "Compactor",
    "ConversationMemory",
    "DegradedPath",
    "DegradedPaths",
    "FlowRequest",
    "FlowResult",
    "Known",
    "PreparedStats",
    "RecallDesk",
    "Recallable",
    "Recalled",
    "RunExtras",
    "RunWindow",
    "build_flow",
    "settle_collector",
]
