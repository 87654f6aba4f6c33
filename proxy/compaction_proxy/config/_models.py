"""The configuration's typed models: one section each, as the YAML file writes them.

The file is the contract users edit, so every model forbids unknown keys: a typo must fail
at start-up with the key path, not silently do nothing (LibreChat's loader drops unknown keys
and users lose their `softTrim` settings without a word).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from compaction_proxy.compaction import CompactionSettings, FactsOverride, SummarizationSettings
from compaction_proxy.compaction.fields import parse_duration
from compaction_proxy.compaction.settings import preload_plugins

CONFIG_ENV_VAR = "COMPACTION_PROXY_CONFIG"
ENV_PREFIX = "COMPACTION_PROXY_"


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, not silence."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ServerSettings(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    api_keys: list[SecretStr] = Field(default_factory=list)
    # Keys that open /metrics (and the details of /readyz) and nothing else: a scraper's key
    # that cannot spend anything. `api_keys` open them too.
    metrics_keys: list[SecretStr] = Field(default_factory=list)
    # Without api_keys, anyone who reaches the proxy spends the upstreams' api_keys (requests
    # routed to them, summaries made on them); serve refuses that unless this says it is meant
    # (compaction_proxy/config/preflight.py, compaction_proxy/http/_admission.py).
    allow_anonymous_spend: bool = False
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # Request headers: the whole block (request line included) and any one header; 431 past
    # either, answered by the HTTP protocol before anything is held in memory.
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_header_field_bytes: int = Field(16 * 1024, ge=256)
    # Slow and idle clients, nginx's model (compaction_proxy/http/client_limits.py): seconds to
    # send the headers, the longest gap between two reads of a body, idle between requests.
    client_header_timeout: float = Field(60.0, gt=0)
    client_body_timeout: float = Field(60.0, gt=0)
    client_keepalive_timeout: float = Field(75.0, gt=0)
    # Open client connections; null: half of the open-file limit left after 64 descriptors.
    max_client_connections: int | None = Field(None, ge=1)
    # Per chat/Responses request the proxy compacts (413 past either): messages or input
    # items, and content parts across them.
    max_messages: int = Field(50_000, ge=1)
    max_content_parts: int = Field(100_000, ge=1)
    # Per process: each conversation's previous request, so the next one (the same bytes and
    # one more step) parses, validates, counts and hashes only what is new
    # (compaction_proxy/engine/_known.py); 0 turns it off.
    conversation_memory_mb: int = Field(256, ge=0)
    workers: int = Field(1, ge=1, le=64)
    # How long requests in flight may run on after a shutdown signal; those still running a
    # little before its end are answered 503 (a started stream: an error event), see drain.py.
    graceful_shutdown_seconds: int = Field(30, ge=0)
    # The upstream HTTP transport: aiohttp measured faster under concurrency (bench/).
    upstream_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    max_connections: int = Field(1000, ge=1)
    max_keepalive_connections: int = Field(200, ge=0)
    keepalive_expiry: float = Field(30.0, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("api_keys", "metrics_keys")
    @classmethod
    def _no_empty_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        # `${PROXY_KEY:-}` with the variable unset must not become a key that matches "no key".
        if any(not key.get_secret_value().strip() for key in keys):
            raise ValueError("an inbound API key must not be empty (leave the list empty instead)")
        return keys


class Timeouts(Strict):
    """Seconds. `read` bounds the gap between two chunks, not the whole stream."""

    connect: float = Field(10.0, gt=0)
    read: float = Field(600.0, gt=0)
    write: float = Field(60.0, gt=0)
    pool: float = Field(30.0, gt=0)


ANTHROPIC_API_HOST = "api.anthropic.com"
"""The host whose Messages API applies ``context_management`` itself."""


class UpstreamSettings(Strict):
    """`keyless`: the upstream needs no credential (a local server). Behind `server.api_keys`
    an upstream without `api_key` gets no Authorization header at all, which is refused at
    start-up unless it says `keyless: true` (compaction_proxy/config/preflight.py).

    `api`: the API the upstream speaks for the proxy's own summary calls when it is not the
    request's own upstream (a `summarization.provider`): a wire format's `api` label
    (compaction_proxy/wire/registry.py, `api_names`; `chat`, `messages`), checked at start-up
    against the formats the proxy serves. The request's own upstream is called in the
    request's own format when that format has a summary call.

    `context_management`: who applies a Messages request's `context_management` edits:
    `native`, the upstream (the body goes as sent), or `emulate`, the proxy (the edits run as
    strategies before the pipeline and the field is stripped; docs/context-management.md).
    Unset: `native` for api.anthropic.com, the one server known to apply them, `emulate`
    elsewhere (local servers and most gateways ignore the field or refuse it)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    base_url: AnyHttpUrl
    api_key: SecretStr | None = None
    keyless: bool = False
    models: list[str] = Field(default_factory=lambda: ["*"])
    timeouts: Timeouts = Field(default_factory=Timeouts)
    api: str = Field("chat", min_length=1, pattern=r"^[a-z][a-z0-9_]*$")
    context_management: Literal["native", "emulate"] | None = None

    @model_validator(mode="after")
    def _key_or_keyless(self) -> UpstreamSettings:
        if self.keyless and self.api_key is not None:
            raise ValueError("set api_key or keyless: true, not both")
        return self

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, value: Any) -> Any:
        # `${OPENAI_API_KEY:-}` interpolates to "", which means "pass the client's key".
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return value

    @property
    def url(self) -> str:
        return str(self.base_url).rstrip("/")

    @property
    def applies_context_management(self) -> bool:
        """Whether the upstream applies `context_management` itself (see the class docstring)."""
        if self.context_management is not None:
            return self.context_management == "native"
        return (self.base_url.host or "").lower() == ANTHROPIC_API_HOST

    @property
    def native_api(self) -> bool:
        """Whether the upstream is Anthropic's own Messages API, which checks what that API
        checks (preserved thinking's prefix binding): its host is api.anthropic.com, or it is
        declared to apply `context_management` itself (`native`: a gateway in front of it)."""
        host = (self.base_url.host or "").lower() == ANTHROPIC_API_HOST
        return host or self.context_management == "native"

    @property
    def display_url(self) -> str:
        """The base URL without credentials or query: safe in errors, logs and pages."""
        url = self.base_url
        host = url.host or ""
        port = f":{url.port}" if url.port and url.port not in (80, 443) else ""
        return f"{url.scheme}://{host}{port}{url.path or ''}".rstrip("/")


class ModelSettings(Strict):
    """Facts about one model name or glob; the built-in table fills what is left out."""

    context_window: int | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, gt=0)
    encoding: str | None = None
    # The share of the window a request's output limit may reserve, and whether the forwarded
    # limit may be lowered to fit, for this model (unset: the `compaction` block's).
    output_reserve_share: float | None = Field(None, gt=0, le=1)
    lower_output_limit: bool | None = None
    # Replaces the top-level `compaction` block for requests to matching models.
    compaction: CompactionSettings | None = None

    def facts_override(self) -> FactsOverride:
        return FactsOverride(
            self.context_window,
            self.max_output_tokens,
            self.encoding,
            output_reserve_share=self.output_reserve_share,
            lower_output=self.lower_output_limit,
        )


class StoreSettings(Strict):
    backend: Literal["memory", "sqlite", "redis"] = "sqlite"
    path: str = "./data/checkpoints.db"
    url: str | None = None
    ttl: str | int = "7d"
    max_entries: int = Field(10_000, gt=0)
    # Memory backend only: the recall archive's own bound, in MB of archived originals (a store
    # of its own, so its rows never evict a checkpoint; least recently used out first).
    archive_max_mb: float = Field(256.0, gt=0, le=1_048_576)
    # Seconds one request may spend inside store calls in all (lookups, locks, writes): a store
    # that hangs costs a request this much at most, then the breaker marks it down.
    request_budget: float = Field(2.0, gt=0, le=60)

    @field_validator("ttl")
    @classmethod
    def _ttl_parses(cls, value: str | int) -> str | int:
        parse_duration(value)
        return value

    @property
    def ttl_seconds(self) -> int:
        return parse_duration(self.ttl)

    @property
    def archive_max_bytes(self) -> int:
        return int(self.archive_max_mb * 1024 * 1024)


class WindowSettings(Strict):
    """Context windows the proxy learns (from upstream refusals) and reads (from an upstream's
    `GET /models`), per upstream and model. A `models:` entry with `context_window` always wins.

    `learned_ttl`: how long a learned window is kept (in the checkpoint store, so replicas and
    restarts share it). `discover`: read published windows. `discovery_ttl`: how long a listing
    is trusted before it is read again. `discovery_timeout`: seconds a request waits for the
    listing when nothing else knows its model's window (otherwise it is read in the background).
    """

    learned_ttl: str | int = "30d"
    discover: bool = True
    discovery_ttl: str | int = "1h"
    discovery_timeout: float = Field(2.0, gt=0, le=60)

    @field_validator("learned_ttl", "discovery_ttl")
    @classmethod
    def _ttl_parses(cls, value: str | int) -> str | int:
        if parse_duration(value) < 1:
            raise ValueError("must be at least one second")
        return value

    @property
    def learned_ttl_seconds(self) -> int:
        return parse_duration(self.learned_ttl)

    @property
    def discovery_ttl_seconds(self) -> int:
        return parse_duration(self.discovery_ttl)


class DashboardSettings(Strict):
    """`/dashboard`. `prices`: model name or glob -> USD per 1M input tokens, for the money
    saved; they come before the built-in OpenAI list prices
    (compaction_proxy/observability/prices.py).
    `show_content`: the recent-requests table may show the last user message (truncated)."""

    enabled: bool = True
    show_content: bool = False
    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)


def _default_upstreams() -> list[UpstreamSettings]:
    # No api_key, and OPENAI_API_KEY is not read: a key in the proxy's environment would be
    # spent by anyone who can reach it (clients export the same variable for their SDK). Each
    # client's own Authorization passes through; a config file sets an operator key on purpose.
    return [UpstreamSettings(name="openai", base_url=AnyHttpUrl("https://api.openai.com/v1"))]


class Settings(BaseSettings):
    """The whole configuration. Environment variables override the file:
    `COMPACTION_PROXY_SERVER__PORT=9000`, `COMPACTION_PROXY_UPSTREAMS='[...]'` (JSON)."""

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        populate_by_name=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    upstreams: list[UpstreamSettings] = Field(default_factory=_default_upstreams, min_length=1)
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    default_context_window: int = Field(128_000, gt=0)
    store: StoreSettings = Field(default_factory=StoreSettings)
    # LibreChat's block, its own camelCase keys; it shapes the default pipeline.
    summarization: SummarizationSettings = Field(default_factory=SummarizationSettings)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    windows: WindowSettings = Field(default_factory=WindowSettings)

    @model_validator(mode="before")
    @classmethod
    def _plugins_first(cls, data: Any, info: ValidationInfo) -> Any:
        # `models` is validated before `compaction`, and its blocks may name a plug-in's strategy.
        if isinstance(data, dict):
            preload_plugins(data.get("compaction"), info.context)
        return data

    @model_validator(mode="after")
    def _unique_upstream_names(self) -> Settings:
        names = [u.name for u in self.upstreams]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"upstream names must be unique; repeated: {', '.join(dupes)}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file, which arrives as init kwargs.
        return env_settings, init_settings


def find_upstream(upstreams: Sequence[UpstreamSettings], name: str) -> UpstreamSettings | None:
    """The upstream called ``name``: an exact match first, else a case-insensitive one."""
    exact = next((u for u in upstreams if u.name == name), None)
    if exact is not None:
        return exact
    folded = name.casefold()
    return next((u for u in upstreams if u.name.casefold() == folded), None)
