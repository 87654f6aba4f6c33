"""compaction_proxy/upstream/_windows.py: which window a request is budgeted for, learned and
discovered windows.

The store is a real MemoryStore or SqliteStore (the contract the book relies on); the upstream
listing is served by an httpx MockTransport that counts its calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.checkpoints import (
    Checkpoint,
    MemoryStore,
    SqliteStore,
    StoredValues,
    StoreUnavailable,
)
from compaction_proxy.config import Settings, UpstreamSettings
from compaction_proxy.engine import Compactor
from compaction_proxy.upstream import HttpxUpstream, Overflow
from compaction_proxy.upstream._windows import (
    FAILED_LISTING_SECONDS,
    MIN_LEARNED_WINDOW,
    STORE_MISS_SECONDS,
    WINDOW_NAMESPACE,
    Window,
    WindowBook,
    window_after_refusal,
    window_key,
)
from compaction_proxy.wire import CallerKey, WindowOption

UNKNOWN = "local-llama"  # in neither the config nor the built-in table
SK_CALLER = CallerKey("authorization", "Bearer sk-caller")
MADE_UP = CallerKey("authorization", "Bearer made-up")


def _settings(**extra: Any) -> Settings:
    base: dict[str, Any] = {
        "upstreams": [{"name": "local", "base_url": "http://upstream.test/v1"}],
        "models": {"pinned-*": {"context_window": 50_000}, "partial": {"max_output_tokens": 10}},
    }
    return Settings.model_validate({**base, **extra})


def _upstream(settings: Settings) -> UpstreamSettings:
    return settings.upstreams[0]


class Listing:
    """A `GET /models` endpoint that counts calls and records the Authorization it got."""

    def __init__(self, windows: dict[str, int], *, status: int = 200, body: bytes | None = None):
        self.calls = 0
        self.authorization: list[str | None] = []
        self.status = status
        self.body = body
        self.delay = 0.0
        self.gate: asyncio.Event | None = None  # when set: answers only once it opens
        self.windows = windows

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.authorization.append(request.headers.get("authorization"))
        assert request.url.path == "/v1/models"
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.gate is not None:
            await self.gate.wait()
        if self.body is not None:
            return _streamed(self.status, self.body)
        data = [{"id": m, "object": "model", "max_model_len": w} for m, w in self.windows.items()]
        return _streamed(self.status, orjson.dumps({"object": "list", "data": data}))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


def _streamed(status: int, body: bytes) -> httpx.Response:
    """A reply as a transport gives one, its body still to be read (the proxy's transport
    streams every reply; httpx reads a ``content=`` reply ahead)."""
    return httpx.Response(status, stream=httpx.ByteStream(body))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _book(
    settings: Settings,
    store: Any,
    listing: Listing | None = None,
    clock: Clock | None = None,
) -> WindowBook:
    client = HttpxUpstream(listing.client()) if listing is not None else None
    clock = clock or Clock()
    values = StoredValues(store) if store is not None else None
    return WindowBook(settings, values, lambda: client, clock=clock, monotonic=clock)


async def _settle() -> None:
    """Lets background listing reads finish."""
    for _ in range(20):
        await asyncio.sleep(0)


# ----------------------------------------------------------------------------- precedence


async def test_precedence_config_learned_discovered_builtin_default() -> None:
    settings = _settings()
    upstream = _upstream(settings)
    listing = Listing({UNKNOWN: 32_768, "pinned-x": 8_000, "gpt-4o": 64_000})
    book = _book(settings, MemoryStore(), listing)

    # Config wins over everything, discovery is not even consulted for it.
    assert await book.window_for(upstream, "pinned-x", None) == Window(50_000, "config")
    assert listing.calls == 0
    # Unknown model: the listing is awaited and wins over the default guess.
    assert await book.window_for(upstream, UNKNOWN, None) == Window(32_768, "discovered")
    assert listing.calls == 1
    # A `models:` entry without context_window is no configured window.
    assert await book.window_for(upstream, "partial", None) == Window(128_000, "default")
    # Discovered beats the built-in table (the listing is already cached).
    assert await book.window_for(upstream, "gpt-4o", None) == Window(64_000, "discovered")
    # Learned beats discovered, and config still beats learned.
    await book.learn("local", UNKNOWN, 16_384)
    await book.learn("local", "pinned-x", 4_096)
    assert await book.window_for(upstream, UNKNOWN, None) == Window(16_384, "learned")
    assert await book.window_for(upstream, "pinned-x", None) == Window(50_000, "config")
    assert listing.calls == 1


async def test_builtin_and_default_without_discovery() -> None:
    settings = _settings(windows={"discover": False})
    listing = Listing({"gpt-4o": 64_000})
    book = _book(settings, None, listing)
    upstream = _upstream(settings)
    assert await book.window_for(upstream, "gpt-4o-2024-08-06", None) == Window(128_000, "builtin")
    assert await book.window_for(upstream, "gpt-4", None) == Window(8_192, "builtin")
    assert await book.window_for(upstream, UNKNOWN, None) == Window(128_000, "default")
    assert listing.calls == 0


async def test_known_models_refresh_the_listing_in_the_background() -> None:
    settings = _settings()
    listing = Listing({"gpt-4": 6_000})
    listing.gate = asyncio.Event()
    book = _book(settings, None, listing)
    upstream = _upstream(settings)
    # The built-in table knows gpt-4: the request does not wait for the listing (held at
    # its gate, it has not answered)...
    assert await book.window_for(upstream, "gpt-4", None) == Window(8_192, "builtin")
    assert listing.calls <= 1
    listing.gate.set()
    # ...which a later request then finds, once it has answered.
    async with asyncio.timeout(10):
        while (found := await book.window_for(upstream, "gpt-4", None)).source != "discovered":
            await asyncio.sleep(0.005)
    assert found == Window(6_000, "discovered")
    assert listing.calls == 1


# ----------------------------------------------------------------------------- discovery


async def test_listing_uses_the_upstreams_key_else_the_callers() -> None:
    keyed = _settings(
        upstreams=[{"name": "local", "base_url": "http://upstream.test/v1", "api_key": "sk-up"}]
    )
    listing = Listing({UNKNOWN: 4_096})
    await _book(keyed, None, listing).window_for(
        _upstream(keyed), UNKNOWN, SK_CALLER, may_spend=True
    )
    plain = _settings()
    await _book(plain, None, listing).window_for(_upstream(plain), UNKNOWN, SK_CALLER)
    await _book(plain, None, listing).window_for(_upstream(plain), UNKNOWN, None)
    assert listing.authorization == ["Bearer sk-up", "Bearer sk-caller", None]


async def test_the_upstreams_key_reads_no_listing_for_a_caller_not_let_in() -> None:
    """Operator keys: a listing read with the operator's key is a call made on it; a caller
    the proxy does not know makes none (compaction_proxy/http/_admission.py), and still gets a
    listing another request read, while one with the caller's own key is read as before."""
    keyed = _settings(
        upstreams=[{"name": "local", "base_url": "http://upstream.test/v1", "api_key": "sk-up"}]
    )
    listing = Listing({UNKNOWN: 4_096})
    book = _book(keyed, None, listing)
    upstream = _upstream(keyed)
    assert await book.window_for(upstream, UNKNOWN, MADE_UP) == Window(128_000, "default")
    assert listing.calls == 0
    assert await book.window_for(upstream, UNKNOWN, None, may_spend=True) == Window(
        4_096, "discovered"
    )
    assert await book.window_for(upstream, UNKNOWN, None) == Window(4_096, "discovered")
    assert listing.calls == 1
    plain = _settings()
    await _book(plain, None, listing).window_for(_upstream(plain), UNKNOWN, SK_CALLER)
    assert listing.authorization == ["Bearer sk-up", "Bearer sk-caller"]


@pytest.mark.parametrize(
    ("status", "body", "again_after"),
    [
        (404, b'{"error": "not found"}', FAILED_LISTING_SECONDS),
        (500, b"", FAILED_LISTING_SECONDS),
        # A 200 that is no listing is an upstream without published windows: asked hourly.
        (200, b"<html>nope</html>", 3_600),
    ],
    ids=["404", "500", "garbage"],
)
async def test_a_failed_listing_is_cached_and_never_raises(
    status: int, body: bytes, again_after: float
) -> None:
    settings = _settings()
    clock = Clock()
    listing = Listing({}, status=status, body=body)
    book = _book(settings, None, listing, clock)
    upstream = _upstream(settings)
    for _ in range(3):
        assert await book.window_for(upstream, UNKNOWN, None) == Window(128_000, "default")
    assert listing.calls == 1
    clock.now += again_after - 1
    await book.window_for(upstream, UNKNOWN, None)
    assert listing.calls == 1
    clock.now += 2
    await book.window_for(upstream, UNKNOWN, None)
    assert listing.calls == 2


async def test_a_slow_listing_costs_at_most_the_timeout() -> None:
    settings = _settings(windows={"discovery_timeout": 0.1})
    listing = Listing({UNKNOWN: 4_096})
    listing.gate = asyncio.Event()  # never opened: the listing never answers
    book = _book(settings, None, listing)
    # Only the discovery timeout can end this wait (the bound stops a test that would hang).
    found = await asyncio.wait_for(book.window_for(_upstream(settings), UNKNOWN, None), 30)
    assert found == Window(128_000, "default")
    assert listing.calls == 1
    await book.close()


async def test_the_listing_is_read_again_after_its_ttl() -> None:
    settings = _settings(windows={"discovery_ttl": "10m"})
    clock = Clock()
    listing = Listing({UNKNOWN: 4_096})
    book = _book(settings, None, listing, clock)
    upstream = _upstream(settings)
    await book.window_for(upstream, UNKNOWN, None)
    listing.windows = {UNKNOWN: 2_048}
    assert await book.window_for(upstream, UNKNOWN, None) == Window(4_096, "discovered")
    clock.now += 601
    # Stale but known: served while the listing is read again in the background.
    assert await book.window_for(upstream, UNKNOWN, None) == Window(4_096, "discovered")
    await _settle()
    assert await book.window_for(upstream, UNKNOWN, None) == Window(2_048, "discovered")
    assert listing.calls == 2


# ----------------------------------------------------------------------------- learned windows


async def test_learned_windows_survive_a_restart(tmp_path: Path) -> None:
    settings = _settings()
    upstream = _upstream(settings)
    first = SqliteStore(tmp_path / "store.db")
    await _book(settings, first).learn("local", UNKNOWN, 16_384)
    await first.close()

    second = SqliteStore(tmp_path / "store.db")
    try:
        restarted = _book(settings, second)
        assert await restarted.window_for(upstream, UNKNOWN, None) == Window(16_384, "learned")
        assert restarted.table() == [
            {
                "upstream": "local",
                "model": UNKNOWN,
                "window": 16_384,
                "source": "learned",
                "age_seconds": 0.0,
            }
        ]
        # Another upstream serving the same model name has learned nothing.
        assert await restarted.learned("other", UNKNOWN) is None
    finally:
        await second.close()


async def test_a_window_option_is_learned_apart_and_survives_a_restart(tmp_path: Path) -> None:
    """A header-chosen window (Anthropic's 1M-context beta) keeps what its refusals taught
    under its own name: the model's ordinary window, here and in the store, is untouched."""
    settings = _settings()
    upstream = _upstream(settings)
    option = WindowOption(1_000_000, "context-1m-2025-08-07")
    model = "claude-sonnet-4-5"
    first = SqliteStore(tmp_path / "store.db")
    book = _book(settings, first)
    assert await book.window_for(upstream, model, option=option) == Window(
        1_000_000, "builtin", option.name
    )
    await book.learn("local", model, 200_000, option.name)
    await book.learn("local", model, 150_000)
    assert await book.window_for(upstream, model, option=option) == Window(
        200_000, "learned", option.name
    )
    await first.close()

    second = SqliteStore(tmp_path / "store.db")
    try:
        restarted = _book(settings, second)
        assert await restarted.window_for(upstream, model, option=option) == Window(
            200_000, "learned", option.name
        )
        assert await restarted.window_for(upstream, model) == Window(150_000, "learned")
        # The summarizer's sizing reads the model's own window, never an option's.
        assert restarted.known(model) == 150_000
        shown = {row["model"]: row["window"] for row in restarted.table()}
        assert shown == {model: 150_000, f"{model} ({option.name})": 200_000}
    finally:
        await second.close()
    # The option's store key is its own; the model's is the one it always had.
    assert window_key("local", model) != window_key("local", model, option.name)
    assert window_key("local", model, "") == window_key("local", model)


async def test_a_stored_window_of_another_option_is_not_lent() -> None:
    store = MemoryStore()
    book = _book(_settings(), store)
    key = window_key("local", UNKNOWN, "beta-x")
    values = StoredValues(store)
    await values.put(
        WINDOW_NAMESPACE, key, {"window": 9_999, "upstream": "local", "model": UNKNOWN}, 60
    )
    assert await book.learned("local", UNKNOWN, "beta-x") is None  # stored without its option


@pytest.mark.parametrize(
    "backend", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.e2e)]
)
async def test_replicas_share_learned_windows(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two books on one store (two replicas, or a replica and its restart) on every backend."""
    from compaction_proxy.checkpoints import make_store
    from compaction_proxy.config import StoreSettings

    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    store = make_store(
        StoreSettings(backend=backend, path=str(tmp_path / "store.db"), url=url)  # type: ignore[arg-type]
    )
    settings = _settings(windows={"discover": False})
    try:
        await _book(settings, store).learn("local", UNKNOWN, 12_000)
        other = _book(settings, store)
        assert await other.window_for(_upstream(settings), UNKNOWN, None) == Window(
            12_000, "learned"
        )
        assert await other.learned("local", "another-model") is None
    finally:
        await store.close()


async def test_store_misses_are_cached_briefly() -> None:
    settings = _settings(windows={"discover": False})
    store = CountingStore()
    clock = Clock()
    reader = _book(settings, store, clock=clock)
    assert await reader.learned("local", UNKNOWN) is None
    assert await reader.learned("local", UNKNOWN) is None
    assert store.lookups == 1
    # A replica learns it; this process sees it once the miss is no longer trusted.
    await _book(settings, store, clock=clock).learn("local", UNKNOWN, 8_192)
    assert await reader.learned("local", UNKNOWN) is None
    clock.now += STORE_MISS_SECONDS + 1
    assert await reader.learned("local", UNKNOWN) == 8_192
    assert await reader.learned("local", UNKNOWN) == 8_192
    assert store.lookups == 2


async def test_learned_windows_expire() -> None:
    settings = _settings(windows={"learned_ttl": "1h", "discover": False})
    clock = Clock()
    book = _book(settings, MemoryStore(), clock=clock)
    await book.learn("local", UNKNOWN, 8_192)
    clock.now += 3_599
    assert await book.learned("local", UNKNOWN) == 8_192
    clock.now += 2
    assert await book.learned("local", UNKNOWN) is None
    assert book.table() == []


async def test_the_stored_entry_uses_the_checkpoint_contract() -> None:
    store = MemoryStore()
    await _book(_settings(), store).learn("local", UNKNOWN, 8_192)
    found = await store.find_longest(WINDOW_NAMESPACE, [window_key("local", UNKNOWN)])
    assert found is not None
    assert found[1].messages == ()
    assert found[1].meta == {"window": 8_192, "upstream": "local", "model": UNKNOWN}


async def test_a_store_that_is_down_costs_only_the_persistence() -> None:
    settings = _settings(windows={"discover": False})
    book = _book(settings, DownStore())
    upstream = _upstream(settings)
    assert await book.window_for(upstream, UNKNOWN, None) == Window(128_000, "default")
    await book.learn("local", UNKNOWN, 8_192)
    assert await book.window_for(upstream, UNKNOWN, None) == Window(8_192, "learned")


async def test_an_entry_of_another_shape_is_ignored() -> None:
    store = MemoryStore()
    bogus = Checkpoint(messages=(), created_at=1_000.0, meta={"window": "big"})
    await store.put(WINDOW_NAMESPACE, window_key("local", UNKNOWN), bogus, 60)
    assert await _book(_settings(), store).learned("local", UNKNOWN) is None


# ----------------------------------------------------------------------------- the rule


def _overflow(
    window: int | None = None, prompt: int | None = None, output: int | None = None
) -> Overflow:
    return Overflow("test", window, prompt, output, "too long")


def test_a_stated_window_is_taken_as_it_is() -> None:
    learned = window_after_refusal(
        _overflow(16_384, 40_213), sent_tokens=40_000, output_reserve=4_096, requested_output=None
    )
    assert learned == 16_384


def test_without_a_window_the_smaller_refused_size_is_shrunk() -> None:
    # Our count says 30,000 + 4,096 reserved; the upstream counted 25,000 + 0 output.
    assert (
        window_after_refusal(
            _overflow(prompt=25_000), sent_tokens=30_000, output_reserve=4_096, requested_output=0
        )
        == 20_000
    )
    # The upstream states nothing: our count and reserve it is.
    assert (
        window_after_refusal(
            _overflow(), sent_tokens=20_000, output_reserve=5_000, requested_output=None
        )
        == 20_000
    )
    # The request's own output limit counts when the refusal does not state one.
    assert (
        window_after_refusal(
            _overflow(prompt=9_000),
            sent_tokens=30_000,
            output_reserve=4_096,
            requested_output=1_000,
        )
        == 8_000
    )


def test_nonsense_windows_are_not_learned() -> None:
    assert (
        window_after_refusal(
            _overflow(window=100), sent_tokens=1, output_reserve=1, requested_output=0
        )
        is None
    )
    tiny = window_after_refusal(
        _overflow(), sent_tokens=MIN_LEARNED_WINDOW, output_reserve=0, requested_output=None
    )
    assert tiny is None


# ----------------------------------------------------------------------------- the compactor


def test_the_checkpoint_namespace_follows_the_window() -> None:
    compactor = Compactor(_settings())
    try:
        default = compactor.fingerprint(UNKNOWN)
        assert compactor.fingerprint(UNKNOWN, 128_000) == default
        assert compactor.fingerprint(UNKNOWN, 16_384) != default
        assert compactor.facts_for(UNKNOWN, 16_384).context_window == 16_384
        body = {"model": UNKNOWN, "messages": [], "max_tokens": 500}
        assert compactor.output_reserve(body, 16_384) == 500
        # without a request limit the default reserve shrinks with the window (a quarter)
        assert compactor.output_reserve({"model": UNKNOWN}, 2_000) == 500
        assert compactor.output_reserve({"model": UNKNOWN}, 4_096) == 1_024
        assert compactor.output_reserve({"model": UNKNOWN}, 128_000) == 4_096
    finally:
        compactor.close()


# ----------------------------------------------------------------------------- helpers


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def find_longest(self, namespace: str, keys: Sequence[str]) -> Any:
        self.lookups += 1
        return await super().find_longest(namespace, keys)


class DownStore:
    name = "down"

    async def find_longest(self, namespace: str, keys: Sequence[str]) -> Any:
        raise StoreUnavailable("connection refused")

    async def put(self, namespace: str, key: str, checkpoint: Checkpoint, ttl: int) -> None:
        raise StoreUnavailable("connection refused")

    async def ping(self) -> None:
        raise StoreUnavailable("connection refused")

    def lock(self, name: str, ttl: float, wait: float) -> AbstractAsyncContextManager[bool]:
        raise StoreUnavailable("connection refused")

    async def close(self) -> None:
        return None


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("windows", "path"),
    [
        ({"learned_ttl": "forever"}, "windows.learned_ttl"),
        ({"discovery_ttl": 0}, "windows.discovery_ttl"),
        ({"discovery_timeout": 0}, "windows.discovery_timeout"),
        ({"discover": "maybe"}, "windows.discover"),
        ({"learn": True}, "windows.learn"),
    ],
)
def test_config_errors_name_the_key(windows: dict[str, Any], path: str, write_config: Any) -> None:
    from compaction_proxy.config import ConfigError, load_settings

    config = write_config("windows: " + orjson.dumps(windows).decode() + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    assert f"  {path}:" in str(caught.value)


def test_config_defaults_and_durations() -> None:
    windows = Settings.model_validate({}).windows
    assert windows.learned_ttl_seconds == 30 * 86_400
    assert windows.discovery_ttl_seconds == 3_600
    assert windows.discover is True and windows.discovery_timeout == 2.0
    two_weeks = Settings.model_validate({"windows": {"learned_ttl": "2w"}})
    assert two_weeks.windows.learned_ttl_seconds == 14 * 86_400
