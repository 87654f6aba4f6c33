"""The summary call's body parameters and output limit, from ``summarization.parameters`` and
``maxSummaryTokens`` (LibreChat's rules: the override inside ``parameters`` wins and is not
sent; a ``max_tokens`` there names the limit's field for servers that know only that one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from compaction_proxy.config.preflight import SUMMARY_RESERVED_PARAMETERS

LimitParam = Literal["max_completion_tokens", "max_tokens"]
"""The body field the output limit goes in."""


def split_parameters(
    parameters: Mapping[str, Any],
    max_summary_tokens: int | None,
    limit_param: LimitParam | None,
) -> tuple[dict[str, Any], int | None, LimitParam]:
    """(body parameters, output limit, name of the limit field).

    ``parameters.maxSummaryTokens`` wins over the top-level key and is not sent (LibreChat's
    rule). A ``max_tokens`` or ``max_completion_tokens`` in ``parameters`` picks the field name
    (older OpenAI-compatible servers know only ``max_tokens``) and is the limit when
    ``maxSummaryTokens`` is unset.
    """
    body = {k: v for k, v in parameters.items() if k not in SUMMARY_RESERVED_PARAMETERS}
    limit = max_summary_tokens
    override = body.pop("maxSummaryTokens", None)
    if isinstance(override, int) and not isinstance(override, bool) and override > 0:
        limit = override
    chosen: LimitParam = limit_param or "max_completion_tokens"
    for name in ("max_tokens", "max_completion_tokens"):
        if name in body:
            value = body.pop(name)
            if limit_param is None:
                chosen = name
            if limit is None and isinstance(value, int) and not isinstance(value, bool):
                limit = value
    return body, limit, chosen
