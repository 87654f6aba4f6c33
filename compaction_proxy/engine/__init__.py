"""The edge's handle on compaction (docs/architecture.md, "Layers and what each may import").

Two layers over the pure core (`compaction_proxy/compaction/`): :class:`Compactor` runs the
configured pipeline for a request's model (tokenizers, catalog, worker thread, calibration), and
:class:`CompactionFlow` wraps one request's compaction in checkpoints and a guarded summarizer.
The modules:

* ``compactor``: the core run for a model, on the compaction thread (``calibration``: the
  upstream's count over ours; ``quiet``: the limit under which a request skips the view);
* ``flow``: one request's compaction (lookup, compact, save once accepted); ``hit_report``:
  a checkpoint hit's report in the client's terms;
* ``prepare``: summaries prepared in the background, before the trigger needs them;
* ``offload``: large bodies parsed off the event loop (``body_codec``: what a worker process
  sends back).
"""

from compaction_proxy.engine.compactor import Compactor
from compaction_proxy.engine.flow import CompactionFlow, FlowResult, build_flow

__all__ = ["CompactionFlow", "Compactor", "FlowResult", "build_flow"]
