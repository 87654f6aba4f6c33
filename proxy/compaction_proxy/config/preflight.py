"""Checks beyond the schema: what a configuration that parses would still trip on when it runs.

The pydantic models judge each value on its own. Some mistakes only show in combination or
against what is installed, and none of them fails loudly at run time: an encoding name tiktoken
does not know is counted with the 4-characters estimate for the life of the process, a memory
store under several workers gives each worker its own checkpoints, and inbound keys in front of
an upstream without its own key mean that upstream gets no Authorization header at all. So
`check-config`, `serve` and `compact` refuse them up front, every problem at once, each with its
key path and what would be accepted.

`check-config` and `serve` also refuse what only a server exposes: an operator's key that
anonymous callers could spend (:func:`serving_problems`). `compact` is the operator's own
command and spends the key knowingly.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator
from pathlib import Path

import tiktoken

from compaction_proxy.compaction import CompactionSettings

from ._loading import ConfigError
from ._models import Settings, StoreSettings, find_upstream

SUMMARY_RESERVED_PARAMETERS = frozenset({"model", "messages", "stream", "n"})
"""Keys of the summary call's body the proxy sets itself (one non-streaming completion):
``summarization.parameters`` may not name them, and the summarizer drops them."""


def check(
    settings: Settings,
    *,
    source: str,
    serving: bool = False,
    apis: Collection[str] | None = None,
) -> None:
    """Raise :class:`ConfigError` listing every problem in `settings` (from `source`);
    `serving`: for a server (`serve`, `check-config`), whose callers are not the operator;
    `apis`: the API labels of the wire formats the proxy serves (the registry's, which this
    layer cannot import), against which `upstreams[].api` is checked."""
    found = [*problems(settings, apis=apis), *(serving_problems(settings) if serving else ())]
    if found:
        lines = [f"invalid configuration ({source}):", *(f"  {line}" for line in found)]
        raise ConfigError("\n".join(lines))


def problems(settings: Settings, *, apis: Collection[str] | None = None) -> list[str]:
    """One `key.path: what is wrong` line per problem; empty when the run has none."""
    return [
        *_encoding_problems(settings),
        *_store_problems(settings),
        *_credential_problems(settings),
        *_summarization_problems(settings),
        *(api_problems(settings, apis) if apis is not None else ()),
    ]


def api_problems(settings: Settings, apis: Collection[str]) -> Iterator[str]:
    """`upstreams[].api` values that name no API the proxy speaks (`apis`)."""
    known = ", ".join(apis)
    for index, upstream in enumerate(settings.upstreams):
        if upstream.api not in apis:
            yield (
                f"upstreams.{index}.api: {upstream.api!r} is not an API the proxy speaks; "
                f"known: {known}"
            )


def serving_problems(settings: Settings) -> list[str]:
    """What a server would expose: an upstream `api_key` anonymous callers could spend.

    Without `server.api_keys` nobody is authenticated, and every request routed to an upstream
    with an `api_key` goes out on that key (and its summaries are made on it), whoever sent it.
    An upstream forwarding cannot reach (`models: []`, not the first, which takes requests
    without a model) is spent only by the proxy's own calls, which let in only known callers
    (compaction_proxy/http/_admission.py), so it is allowed.
    """
    server = settings.server
    if server.api_keys or server.allow_anonymous_spend:
        return []
    return [
        f"upstreams.{index}.api_key: anonymous callers could spend this key: without "
        f"server.api_keys every request routed to upstream {upstream.name!r} goes out on it, "
        "whoever sent it; set server.api_keys (clients then authenticate to the proxy with "
        "one of them), or server.allow_anonymous_spend: true when only your own clients can "
        "reach the proxy (or remove the api_key: each client's own key then passes through)"
        for index, upstream in enumerate(settings.upstreams)
        if upstream.api_key is not None and (index == 0 or upstream.models)
    ]


def known_encodings(encodings_dir: str | None) -> list[str]:
    """Encoding names a run can use: tiktoken's registered ones (o200k_base, cl100k_base,
    p50k_base, r50k_base, ...) plus the `<name>.tiktoken` files in `encodings_dir`."""
    names = set(tiktoken.list_encoding_names())
    if encodings_dir:
        directory = Path(encodings_dir)
        if directory.is_dir():
            names.update(path.stem for path in directory.glob("*.tiktoken"))
    return sorted(names)


def _encoding_fields(settings: Settings) -> Iterator[tuple[str, str]]:
    """(key path, encoding name) of every encoding the configuration names."""
    yield "compaction.tokenizer.default_encoding", settings.compaction.tokenizer.default_encoding
    for pattern, model in settings.models.items():
        if model.encoding is not None:
            yield f"models.{pattern}.encoding", model.encoding
        if model.compaction is not None:
            yield from _block_encodings(f"models.{pattern}.compaction", model.compaction)


def _block_encodings(path: str, block: CompactionSettings) -> Iterator[tuple[str, str]]:
    yield f"{path}.tokenizer.default_encoding", block.tokenizer.default_encoding


def _encoding_problems(settings: Settings) -> Iterator[str]:
    encodings_dir = settings.compaction.tokenizer.encodings_dir
    if encodings_dir and not Path(encodings_dir).is_dir():
        yield (
            f"compaction.tokenizer.encodings_dir: {encodings_dir!r} is not a directory "
            "(it should hold <name>.tiktoken files)"
        )
    known = known_encodings(encodings_dir)
    for path, name in _encoding_fields(settings):
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        yield (
            f"{path}: unknown encoding {name!r}{hint}; known: {', '.join(known)} "
            "(tiktoken's, plus <name>.tiktoken files in compaction.tokenizer.encodings_dir)"
        )


def _store_problems(settings: Settings) -> Iterator[str]:
    store, workers = settings.store, settings.server.workers
    if store.backend == "memory" and workers > 1:
        yield (
            f"store.backend: memory keeps checkpoints and learned windows inside one process, "
            f"so with server.workers: {workers} each worker would miss what the others stored; "
            "use sqlite (the default) or redis, or one worker"
        )
    if store.backend == "redis":
        problem = redis_url_problem(store)
        if problem is not None:
            yield problem


def redis_url_problem(store: StoreSettings) -> str | None:
    """Why ``store.url`` is no Redis URL (missing, or not ``redis://[user:password@]host:port/db``),
    or None; the store factory refuses the same. Nothing connects: the URL is only parsed, by
    redis-py's own pool, as the store will parse it."""
    if not store.url:
        return "store.url: required when store.backend is redis (e.g. redis://127.0.0.1:6379/0)"
    import redis.asyncio as aioredis  # only a redis store needs it

    try:
        aioredis.BlockingConnectionPool.from_url(store.url)
    except ValueError:
        # redis-py's message about a bad URL may quote it, password included: say only where.
        return INVALID_REDIS_URL
    return None


INVALID_REDIS_URL = (
    "store.url: not a valid Redis URL (expected redis://[user:password@]host:port/db)"
)


def _credential_problems(settings: Settings) -> Iterator[str]:
    if not settings.server.api_keys:
        return
    for index, upstream in enumerate(settings.upstreams):
        if upstream.api_key is None and not upstream.keyless:
            yield (
                f"upstreams.{index}.api_key: required while server.api_keys is set: clients "
                "authenticate to the proxy with those keys, which are never forwarded, so "
                f"upstream {upstream.name!r} would get no Authorization header at all; set its "
                "api_key, or keyless: true for a server that needs none"
            )


def _summarization_problems(settings: Settings) -> Iterator[str]:
    if not settings.summarization.enabled:
        return
    try:
        validate_summarization_config(settings)
    except ConfigError as error:
        yield str(error)


def validate_summarization_config(settings: Settings) -> None:
    """Start-up check of the ``summarization`` block; raises :class:`ConfigError`.

    An unknown ``provider`` would otherwise surface only as a failed summary on the first long
    conversation, as a warning header nobody reads.
    """
    summ = settings.summarization
    if summ.provider is not None:
        if not summ.provider.strip():
            raise ConfigError(
                "summarization.provider: must not be empty (omit it to use the "
                "request's own upstream)"
            )
        if find_upstream(settings.upstreams, summ.provider) is None:
            names = ", ".join(u.name for u in settings.upstreams)
            raise ConfigError(
                f"summarization.provider: no upstream named {summ.provider!r}; "
                f"configured upstreams: {names}"
            )
    if summ.model is not None and not summ.model.strip():
        raise ConfigError(
            "summarization.model: must not be empty (omit it to use the request's own model)"
        )
    for key in sorted(SUMMARY_RESERVED_PARAMETERS & set(summ.parameters)):
        raise ConfigError(
            f"summarization.parameters.{key}: set by the proxy itself "
            "(the summary call is one non-streaming completion); remove it"
        )
