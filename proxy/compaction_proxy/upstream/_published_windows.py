"""Read each model's context window from an upstream's `GET /v1/models` listing.

OpenAI's own listing carries no window, but most self-hosted and aggregating servers add one
under a field name of their own. Knowing the window before the first request lets the proxy
compact to fit instead of learning the limit from a refusal. The listing is advisory, so
anything unexpected (bad JSON, odd types, zero or negative numbers) is skipped rather than
raised: a missing entry only means the proxy falls back to its configured or learned window.

Pure: takes the response body as bytes, does no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

# Field names that identify a model in a listing entry, in order of preference. `id` is what
# clients send as `model`; llama.cpp's `models` array uses `model`/`name`; LM Studio's native
# listing uses `key`.
_NAME_FIELDS = ("id", "model", "name", "key")


def parse_models_listing(body: bytes) -> dict[str, int]:
    """Map model id -> context window (in the upstream's tokens) from a models listing.

    Entries come from `data` and `models` arrays (llama.cpp returns both) or a bare array.
    When the same id appears more than once, the smaller window wins: under-estimating only
    costs an earlier compaction, over-estimating costs a refused request.
    """
    try:
        parsed: object = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    windows: dict[str, int] = {}
    for entry in _entries(parsed):
        window = _window(entry)
        if window is None:
            continue
        for name in _names(entry):
            known = windows.get(name)
            windows[name] = window if known is None else min(known, window)
    return windows


def _entries(parsed: object) -> Iterator[Mapping[str, object]]:
    if isinstance(parsed, list):
        arrays: list[object] = [parsed]
    elif isinstance(parsed, dict):
        arrays = [parsed.get("data"), parsed.get("models")]
    else:
        return
    for array in arrays:
        if isinstance(array, list):
            yield from (item for item in array if isinstance(item, dict))


def _names(entry: Mapping[str, object]) -> list[str]:
    for field in _NAME_FIELDS:
        value = entry.get(field)
        if isinstance(value, str) and value.strip():
            return [value]
    return []


def _window(entry: Mapping[str, object]) -> int | None:
    """The entry's window, from the most trustworthy field it carries.

    Order: what is loaded now (LM Studio can load a model with a shorter context than it
    supports), then the serving limit (vLLM/SGLang `max_model_len`), the advertised limit
    (OpenRouter/generic `context_length`, capped by the top provider's), a generic
    `context_window`, Anthropic's `max_input_tokens` (its Models API), the model's maximum (LM
    Studio), and last llama.cpp's training length, which says nothing about the `--ctx-size`
    the server actually runs with.
    """
    for tier in (
        _smallest(_loaded_lengths(entry)),
        _positive(entry.get("max_model_len")),
        _smallest([entry.get("context_length"), _get(entry.get("top_provider"), "context_length")]),
        _positive(entry.get("context_window")),
        _positive(entry.get("max_input_tokens")),
        _positive(entry.get("max_context_length")),
        _positive(_get(entry.get("meta"), "n_ctx_train")),
    ):
        if tier is not None:
            return tier
    return None


def _loaded_lengths(entry: Mapping[str, object]) -> list[object]:
    lengths: list[object] = [entry.get("loaded_context_length")]
    instances = entry.get("loaded_instances")
    if isinstance(instances, list):
        lengths.extend(_get(_get(item, "config"), "context_length") for item in instances)
    return lengths


def _get(container: object, key: str) -> object:
    return container.get(key) if isinstance(container, dict) else None


def _smallest(values: list[object]) -> int | None:
    found = [v for v in (_positive(value) for value in values) if v is not None]
    return min(found) if found else None


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
