"""What the strategies are built from, kept apart from the strategies themselves.

The ``strategies`` package's top level holds the strategies a pipeline entry can name (one
module each, registered in :mod:`..builtin`) and their public interface (:mod:`..base`,
:mod:`..params`, :mod:`..registry`).  This sub-package holds the rest, which no pipeline entry
names:

* parts the strategies share: :mod:`.tool_results` (a group's answered tool results and their
  text) and :mod:`.old_tool_groups` (the base of ``tool_result_compaction`` and
  ``selective_tool_calls``);
* the summarization strategy's parts: :mod:`.summary_selection` (what it folds),
  :mod:`.summary_event` (its calls and checkpoint) and :mod:`.summary_record` (a summary's
  check on the outcome);
* what the pipeline runs beside the configured strategies: :mod:`.churn` (the minimum saving
  every run is held to), :mod:`.scaled_collapse` (the default pipeline's collapse) and
  :mod:`.last_resort` (the trim after the fallback).

It is private to the core: the strategies and the core's pipeline modules import it, nothing
outside ``compaction_proxy/compaction/`` does (an import-linter contract in pyproject.toml holds
the edge to that); what the edge needs of a summary's parts, the summarization module
re-exports.
"""
