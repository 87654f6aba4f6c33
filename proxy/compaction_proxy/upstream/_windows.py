"""Context windows per upstream and model: configured, learned from refusals, or published.

The budget is only as good as the window it starts from. The built-in table knows OpenAI's
models; a local server with a custom model name, or a deployment with a smaller window than
the model's maximum, is a guess (`default_context_window`). This module narrows the guess:

* **Learned**: when an upstream refuses a prompt as too long, the window it states (or one
  shrunk from the refused count, see :func:`window_after_refusal`) is kept per upstream and
  model, so the wall is hit once, not every turn. Learned windows are written to the store's
  key-value interface (:class:`~compaction_proxy.checkpoints.StoredValues`) under their own
  namespace (one key per upstream and model), so replicas share them and a restarted proxy does
  not hit the wall again. An
  in-process dict sits in front: the hot path costs a dict lookup; a cold miss asks the store
  once, and a store miss is trusted for :data:`STORE_MISS_SECONDS`.
* **Discovered**: vLLM, SGLang, OpenRouter, LM Studio and others publish windows in
  `GET /models`. The listing is read lazily, once per upstream, cached for `discovery_ttl`
  (a failed read for :data:`FAILED_LISTING_SECONDS`), and never fails a request. A request
  waits for it (at most `discovery_timeout`) only when its model's window would otherwise be
  the default guess; otherwise a stale listing is refreshed in the background.

Precedence of the window a request's budget uses: a `models:` entry with `context_window` >
learned > discovered > built-in table > `default_context_window`. The operator's word wins;
what the upstream told us (its refusal) beats what it publishes, which beats our table.

A request's headers change its window only where its wire format says so
(`WireFormat.window_option`: Anthropic's 1M-context beta): the option then stands in for the
built-in table, and what a refusal teaches about it is learned under the option's name, apart
from the model's ordinary window.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from compaction_proxy.checkpoints import StoredValues, StoreUnavailable
from compaction_proxy.compaction import ModelCatalog
from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.wire import BEARER, CallerKey, UpstreamAuth, WindowOption

from ._calls import ReplyUnreadable, call_upstream
from ._published_windows import parse_models_listing
from ._transport import UpstreamTransport

if TYPE_CHECKING:
    from compaction_proxy.config import Settings, UpstreamSettings

    from ._overflow import Overflow

log = logging.getLogger("compaction_proxy.windows")

Source = Literal["config", "learned", "discovered", "builtin", "default"]

WINDOW_NAMESPACE = "context-windows-v1"
"""The store namespace of learned windows; checkpoint namespaces are hex digests, never this."""
SHRINK = 0.8
"""A refusal that states no window: the new window is this share of the refused size."""
MIN_LEARNED_WINDOW = 1_024
"""Below this a "learned" window is noise (a refusal of a tiny request), not a window."""
STORE_MISS_SECONDS = 60.0
"""How long "the store knows no window for this model" is trusted before asking again."""
FAILED_LISTING_SECONDS = 300.0
"""A `GET /models` that failed (404, timeout, garbage) is tried again after this long."""
MAX_LISTING_BYTES = 8 << 20
"""OpenRouter's listing is about 1 MiB; anything far beyond that is not a model listing."""
MAX_ENTRIES = 4_096
"""Learned windows (and store misses) kept in process; the oldest go first."""
MAX_SHOWN = 200
"""Rows of the windows table (dashboard) and series of the gauge (/metrics)."""
_MAX_MODEL_NAME = 256


@dataclass(frozen=True, slots=True)
class Window:
    """The window a request is budgeted for, and where it came from.

    ``option``: the name of the window option the request's headers chose
    (:class:`~compaction_proxy.wire.WindowOption`), "" for the model's own window; a window
    learned from this request's refusal is learned under it."""

    tokens: int
    source: Source
    option: str = ""


@dataclass(frozen=True, slots=True)
class _Learned:
    tokens: int
    learned_at: float  # wall clock, as stored
    expires_at: float  # wall clock


@dataclass(frozen=True, slots=True)
class _Listing:
    windows: dict[str, int]
    fetched_at: float  # wall clock, for the table's age
    fresh_until: float  # monotonic
    error: str | None = None


def window_key(upstream: str, model: str, option: str = "") -> str:
    """The store key of a learned window: a hash, so any model name makes a valid key (a
    window option's name joins it; the model's own window keeps the key it always had)."""
    name = f"{upstream}\x1f{model}" + (f"\x1f{option}" if option else "")
    return hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def window_after_refusal(
    overflow: Overflow, *, sent_tokens: int, output_reserve: int, requested_output: int | None
) -> int | None:
    """The window an overflow refusal teaches, or None when it teaches nothing usable.

    A stated window is taken as it is. Otherwise the window is shrunk from what was refused:
    ``floor(0.8 * min(sent_tokens + output_reserve, P + M))``, where `sent_tokens` is our
    calibrated count of the refused prompt, `output_reserve` the completion budget we planned
    for it, P the prompt tokens the upstream states (when it does) and M the output tokens it
    states (else the request's own limit, else 0: the upstream then counted no output). The
    smaller side wins because both are known to be too big; 0.8 leaves room for our counting
    error, so one refusal, not a series of them, gets under the wall.
    """
    if overflow.window is not None:
        return overflow.window if overflow.window >= MIN_LEARNED_WINDOW else None
    refused = sent_tokens + output_reserve
    if overflow.prompt_tokens is not None:
        output = overflow.output_tokens
        if output is None:
            output = requested_output or 0
        refused = min(refused, overflow.prompt_tokens + output)
    shrunk = math.floor(SHRINK * refused)
    return shrunk if shrunk >= MIN_LEARNED_WINDOW else None


class WindowBook:
    """Knows the window of each (upstream, model): configured, learned, discovered or guessed.

    Every dependency degrades quietly: a store that is down costs the persistence of learned
    windows (they still work in this process), a listing that cannot be read costs discovery.
    """

    def __init__(
        self,
        settings: Settings,
        store: StoredValues | None,
        transport: Callable[[], UpstreamTransport | None],
        *,
        catalog: ModelCatalog | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings.windows
        self.store = store
        self._transport = transport
        self._clock = clock
        self._monotonic = monotonic
        self._default = settings.default_context_window
        # The compactor's catalog (same matching); tests may leave it to be built here.
        self._catalog = catalog or ModelCatalog(
            {p: m.facts_override() for p, m in settings.models.items()},
            default_context_window=settings.default_context_window,
        )
        # Keyed by (upstream, model, window option's name or "").
        self._learned: dict[tuple[str, str, str], _Learned] = {}
        self._store_misses: dict[tuple[str, str, str], float] = {}
        self._listings: dict[str, _Listing] = {}
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._used_discovered: dict[tuple[str, str], int] = {}

    # ---------------------------------------------------------------- the window of a request

    def configured(self, model: str) -> int | None:
        """The `models:` entry's `context_window` for `model`, if one sets it."""
        return self._catalog.known_windows(model)[0]

    def builtin(self, model: str) -> int | None:
        """The built-in table's window for `model`, if it knows the model."""
        return self._catalog.known_windows(model)[1]

    async def window_for(
        self,
        upstream: UpstreamSettings,
        model: str,
        caller: CallerKey | None = None,
        *,
        may_spend: bool = False,
        auth: UpstreamAuth = BEARER,
        option: WindowOption | None = None,
    ) -> Window:
        """The window to budget `model` on `upstream` for. Never raises.

        `caller`: the caller's own key, used (as it came) to read the upstream's listing when
        the upstream has no `api_key` of its own (None when the caller authenticated to the
        proxy: that key is not the upstream's). `may_spend`: whether the listing may be read
        with the upstream's own `api_key` for this caller (compaction_proxy/http/_admission.py);
        when not, a listing already read is still used. `auth`: how the request's format sends
        that `api_key`. `option`: the window the request's headers opt into
        (`WireFormat.window_option`), which takes the built-in table's place.
        """
        configured = self.configured(model)
        if configured is not None:
            return Window(configured, "config")
        name = option.name if option is not None else ""
        learned = await self.learned(upstream.name, model, name)
        if learned is not None:
            return Window(learned, "learned", name)
        builtin = option.tokens if option is not None else self.builtin(model)
        discovered = await self._discovered(
            upstream,
            model,
            caller,
            auth,
            wait=builtin is None,
            may_read=may_spend or upstream.api_key is None,
        )
        if discovered is not None:
            return Window(discovered, "discovered", name)
        if builtin is not None:
            return Window(builtin, "builtin", name)
        return Window(self._default, "default")

    def known(self, model: str) -> int | None:
        """What this process already knows of `model`'s window, without waiting: the config's,
        else the smallest learned or published one on any upstream.

        For the summarizer, which sizes its own requests for the model it calls: an unknown
        local model must not be asked to read a transcript cut for the default window.
        """
        configured = self.configured(model)
        if configured is not None:
            return configured
        now = self._clock()
        found = [
            entry.tokens
            for (_, name, option), entry in self._learned.items()
            if name == model and not option and entry.expires_at > now
        ]
        found += [
            listing.windows[model]
            for listing in self._listings.values()
            if model in listing.windows
        ]
        return min(found) if found else None

    # ---------------------------------------------------------------- learned windows

    async def learned(self, upstream: str, model: str, option: str = "") -> int | None:
        """The learned window (of the window option named `option`, "" for the model's own),
        from this process or (on a cold miss) the store."""
        key = (upstream, model, option)
        entry = self._learned.get(key)
        now = self._clock()
        if entry is not None:
            if entry.expires_at > now:
                return entry.tokens
            del self._learned[key]
        if self.store is None:
            return None
        retry_at = self._store_misses.get(key)
        if retry_at is not None and retry_at > self._monotonic():
            return None
        entry = await self._read_store(upstream, model, option)
        if entry is None or entry.expires_at <= now:
            _bounded_put(self._store_misses, key, self._monotonic() + STORE_MISS_SECONDS)
            return None
        self._store_misses.pop(key, None)
        _bounded_put(self._learned, key, entry)
        return entry.tokens

    async def _read_store(self, upstream: str, model: str, option: str) -> _Learned | None:
        assert self.store is not None
        try:
            found = await self.store.get(WINDOW_NAMESPACE, window_key(upstream, model, option))
        except StoreUnavailable as exc:
            log.warning("could not read learned windows (%s): %s", self.store.name, exc)
            return None
        if found is None:
            return None
        meta = found.value
        tokens = meta.get("window")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
            return None
        if (
            meta.get("upstream") != upstream
            or meta.get("model") != model
            or meta.get("option", "") != option
        ):
            return None  # a hash collision, however unlikely, must not lend a wrong window
        learned_at = found.written_at
        return _Learned(tokens, learned_at, learned_at + self.settings.learned_ttl_seconds)

    async def learn(self, upstream: str, model: str, tokens: int, option: str = "") -> None:
        """Remember `tokens` as the window of `model` on `upstream` (for requests that chose
        the window option named `option`; "" for the model's own), here and in the store.

        Persisting is best-effort: a store that is down costs only the sharing.
        """
        if len(model) > _MAX_MODEL_NAME or len(option) > _MAX_MODEL_NAME:
            return
        now = self._clock()
        ttl = self.settings.learned_ttl_seconds
        key = (upstream, model, option)
        _bounded_put(self._learned, key, _Learned(tokens, now, now + ttl))
        self._store_misses.pop(key, None)
        if self.store is None:
            return
        value: dict[str, Any] = {"window": tokens, "upstream": upstream, "model": model}
        if option:
            value["option"] = option
        try:
            key_in_store = window_key(upstream, model, option)
            await self.store.put(WINDOW_NAMESPACE, key_in_store, value, ttl, written_at=now)
        except StoreUnavailable as exc:
            log.warning("learned window not stored (%s unavailable): %s", self.store.name, exc)

    # ---------------------------------------------------------------- discovered windows

    async def _discovered(
        self,
        upstream: UpstreamSettings,
        model: str,
        caller: CallerKey | None,
        auth: UpstreamAuth,
        *,
        wait: bool,
        may_read: bool,
    ) -> int | None:
        if not self.settings.discover or self._transport() is None:
            return None
        listing = self._listings.get(upstream.name)
        tokens = listing.windows.get(model) if listing is not None else None
        if may_read and (listing is None or listing.fresh_until <= self._monotonic()):
            fetch = self._fetch(upstream, caller, auth)
            if tokens is None and wait:
                # The listing is the only thing that can turn a guess into a window: wait for
                # it, briefly. A slow upstream costs this request the wait, not its answer.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(fetch), timeout=self.settings.discovery_timeout
                    )
                listing = self._listings.get(upstream.name)
                tokens = listing.windows.get(model) if listing is not None else None
        if tokens is not None:
            key = (upstream.name, model)
            if key in self._used_discovered or len(self._used_discovered) < MAX_ENTRIES:
                self._used_discovered[key] = tokens
        return tokens

    def _fetch(
        self, upstream: UpstreamSettings, caller: CallerKey | None, auth: UpstreamAuth
    ) -> asyncio.Task[None]:
        """The listing read in flight for `upstream` (one at a time per upstream)."""
        task = self._fetches.get(upstream.name)
        if task is None or task.done():
            task = asyncio.ensure_future(self._read_listing(upstream, caller, auth))
            self._fetches[upstream.name] = task
        return task

    async def _read_listing(
        self, upstream: UpstreamSettings, caller: CallerKey | None, auth: UpstreamAuth
    ) -> None:
        windows: dict[str, int] = {}
        error: str | None = None
        try:
            windows = await self._get_listing(upstream, caller, auth)
        except Exception as exc:  # a listing is a nicety: nothing here may fail a request
            # The class only: messages of HTTP libraries quote URLs, which may hold credentials.
            error = type(exc).__name__
            log.info("no published windows from upstream %r: %s", upstream.name, error)
        now = self._monotonic()
        fresh = self.settings.discovery_ttl_seconds if error is None else FAILED_LISTING_SECONDS
        self._listings[upstream.name] = _Listing(windows, self._clock(), now + fresh, error)

    async def _get_listing(
        self, upstream: UpstreamSettings, caller: CallerKey | None, auth: UpstreamAuth
    ) -> dict[str, int]:
        """The upstream's `GET /models`, with its own `api_key` sent the way the request's
        format says, else the caller's key as it came."""
        transport = self._transport()
        if transport is None:
            raise RuntimeError("the upstream transport is not started")
        headers = {"accept": "application/json", **dict(auth.version)}
        if upstream.api_key is not None:
            headers[auth.header] = auth.value(upstream.api_key.get_secret_value())
        elif caller is not None:
            headers[caller.header] = caller.value
        try:
            async with asyncio.timeout(self.settings.discovery_timeout):
                reply = await call_upstream(
                    transport,
                    "GET",
                    upstream.url + "/models",
                    headers,
                    b"",
                    upstream.timeouts,
                    limit=MAX_LISTING_BYTES,
                )
        except ReplyUnreadable as exc:
            raise ListingUnavailable(str(exc)) from exc
        if reply.status != 200:
            raise ListingUnavailable(f"status {reply.status}")
        return parse_models_listing(reply.content)

    async def close(self) -> None:
        """Cancels listing reads still in flight (at shutdown, before the client closes)."""
        pending = [task for task in self._fetches.values() if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._fetches.clear()

    # ---------------------------------------------------------------- what the operator sees

    def table(self) -> list[dict[str, Any]]:
        """Learned and discovered windows in use: upstream, model, window, source, age."""
        now = self._clock()
        rows: list[dict[str, Any]] = []
        for (upstream, model, option), entry in self._learned.items():
            if entry.expires_at > now:
                shown = f"{model} ({option})" if option else model
                rows.append(_row(upstream, shown, entry.tokens, "learned", now - entry.learned_at))
        for (upstream, model), tokens in self._used_discovered.items():
            listing = self._listings.get(upstream)
            age = None if listing is None else now - listing.fetched_at
            rows.append(_row(upstream, model, tokens, "discovered", age))
        rows.sort(key=lambda row: (row["upstream"], row["model"], row["source"]))
        return rows[:MAX_SHOWN]


class ListingUnavailable(CompactionProxyError):
    """`GET /models` answered, but not with a listing."""


def _row(upstream: str, model: str, tokens: int, source: str, age: float | None) -> dict[str, Any]:
    return {
        "upstream": upstream,
        "model": model,
        "window": tokens,
        "source": source,
        "age_seconds": None if age is None else round(max(0.0, age), 1),
    }


def _bounded_put(table: dict[Any, Any], key: Any, value: Any) -> None:
    """Insert, dropping the oldest entry when the table is full (insertion order)."""
    table.pop(key, None)
    if len(table) >= MAX_ENTRIES:
        table.pop(next(iter(table)))
    table[key] = value
