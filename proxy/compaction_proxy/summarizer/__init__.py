"""The summarizer: the LLM call that folds a stretch of conversation into a summary.

The compaction core sees only the ``Summarizer`` protocol (re-exported here with its request
and error); what talks HTTP stays here, outside ``compaction_proxy.compaction``:

* ``_http``: :class:`HttpSummarizer`, the summary call to an upstream, in the form of the API
  it speaks (chat completions, Anthropic's Messages);
* ``_prompts``: the checkpoint and update prompts, versioned (the version keys checkpoints);
* ``_prefix``: the call in the request's own prefix form, so the upstream's cache serves it;
* ``_transcript``: the plain-text transcript form, cut into chunks that fit the summarizer;
* ``_sizing``: a call sized by the model's calibration, and made smaller after a refusal;
* ``_flights``: one call per stretch across concurrent requests and replicas, and back-off;
* ``_stats``: what the calls are counted as, for the metrics.
"""

from compaction_proxy.compaction.summarizer_contract import Summarizer, SummaryError, SummaryRequest

from ._flights import GuardedSummarizer, SummaryFlights
from ._http import DEFAULT_MAX_SUMMARY_TOKENS, HttpSummarizer
from ._prefix import ForwardedRequest
from ._prompts import CHECKPOINT_PROMPT, DEFAULT_PROMPTS, PROMPT_VERSION, UPDATE_PROMPT, PromptSet
from ._sizing import SummaryOverflow, SummarySizing
from ._stats import SummarizerStats, SummaryCallRecord, SummaryCalls
from ._transcript import SummarizerWindow, TranscriptOptions

__all__ = [
    "CHECKPOINT_PROMPT",
    "DEFAULT_MAX_SUMMARY_TOKENS",
    "DEFAULT_PROMPTS",
    "PROMPT_VERSION",
    "UPDATE_PROMPT",
    "ForwardedRequest",
    "GuardedSummarizer",
    "HttpSummarizer",
    "PromptSet",
    "Summarizer",
    "SummarizerStats",
    "SummarizerWindow",
    "SummaryCallRecord",
    "SummaryCalls",
    "SummaryError",
    "SummaryFlights",
    "SummaryOverflow",
    "SummaryRequest",
    "SummarySizing",
    "TranscriptOptions",
]
