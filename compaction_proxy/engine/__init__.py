"""The edge's handle on compaction (docs/architecture.md, "Layers and what each may import").

Two layers over the pure core (`compaction_proxy/compaction/`): :class:`Compactor` runs the
configured pipeline for a request's model (tokenizers, catalog, worker thread, calibration), and
:class:`CompactionFlow` wraps one request's compaction in checkpoints and a guarded summarizer.
"""

from compaction_proxy.engine.compactor import Compactor
from compaction_proxy.engine.flow import CompactionFlow, FlowResult, build_flow

__all__ = ["CompactionFlow", "Compactor", "FlowResult", "build_flow"]
