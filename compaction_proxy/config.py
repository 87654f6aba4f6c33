"""Typed configuration: one YAML file, environment overrides, ${VAR} interpolation.

The file is the contract users edit, so every model forbids unknown keys: a typo must fail
at start-up with the key path, not silently do nothing (LibreChat's loader drops unknown keys
and users lose their `softTrim` settings without a word).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from compaction_proxy.compaction import CompactionSettings, FactsOverride, SummarizationSettings
from compaction_proxy.compaction.settings import preload_plugins
from compaction_proxy.compaction.strategies.params import StrategyParams
from compaction_proxy.compaction.strategies.registry import STRATEGIES

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
    # (compaction_proxy/preflight.py, compaction_proxy/admission.py).
    allow_anonymous_spend: bool = False
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # Request headers: the whole block (request line included) and any one header; 431 past
    # either, answered by the HTTP protocol before anything is held in memory.
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_header_field_bytes: int = Field(16 * 1024, ge=256)
    # Slow and idle clients, nginx's model (compaction_proxy/client_limits.py): seconds to
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


class UpstreamSettings(Strict):
    """`keyless`: the upstream needs no credential (a local server). Behind `server.api_keys`
    an upstream without `api_key` gets no Authorization header at all, which is refused at
    start-up unless it says `keyless: true` (compaction_proxy/preflight.py)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    base_url: AnyHttpUrl
    api_key: SecretStr | None = None
    keyless: bool = False
    models: list[str] = Field(default_factory=lambda: ["*"])
    timeouts: Timeouts = Field(default_factory=Timeouts)

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
    # Replaces the top-level `compaction` block for requests to matching models.
    compaction: CompactionSettings | None = None

    def facts_override(self) -> FactsOverride:
        return FactsOverride(self.context_window, self.max_output_tokens, self.encoding)


class StoreSettings(Strict):
    backend: Literal["memory", "sqlite", "redis"] = "sqlite"
    path: str = "./data/checkpoints.db"
    url: str | None = None
    ttl: str | int = "7d"
    max_entries: int = Field(10_000, gt=0)
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


# --- loading -------------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigError(Exception):
    """A configuration problem, worded for the person who wrote the file."""


def parse_duration(value: str | int) -> int:
    """'7d', '12h', '30m', '45s' or a number of seconds."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration must not be negative")
        return value
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration; use e.g. 45s, 30m, 12h, 7d or seconds")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def interpolate(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace `${VAR}` and `${VAR:-default}`; an unset `${VAR}` without default is an error,
    since silently sending an empty key upstream is worse than refusing to start."""
    env = os.environ if environ is None else environ
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env and (env[name] != "" or default is None):
            return env[name]
        if default is not None:
            return default
        missing.append(name)
        return ""

    result = _INTERPOLATION.sub(substitute, text)
    if missing:
        raise ConfigError(
            "environment variable(s) not set: "
            + ", ".join(sorted(set(missing)))
            + " (use ${VAR:-default} to give a default)"
        )
    return result


def _interpolate_tree(node: Any, environ: Mapping[str, str] | None) -> Any:
    # Interpolating values (not raw text) keeps YAML quoting rules intact: a key
    # containing ':' or '#' cannot break the document structure.
    if isinstance(node, str):
        return interpolate(node, environ)
    if isinstance(node, list):
        return [_interpolate_tree(item, environ) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, environ) for key, value in node.items()}
    return node


def read_config_file(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {file} is not UTF-8 text (bad byte at offset {exc.start})"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file} is not valid YAML: {_describe_yaml_error(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{file}: the top level must be a mapping of sections, not {type(data).__name__}"
        )
    result = _interpolate_tree(data, environ)
    assert isinstance(result, dict)
    return result


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    # PyYAML's own message quotes the offending line, which may well hold a key: say where the
    # problem is, never what the line says.
    problem = getattr(exc, "problem", None) or "syntax error"
    context = getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{context}: {problem}{where}" if context else f"{problem}{where}"


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load from `path`, else from $COMPACTION_PROXY_CONFIG, else the embedded defaults."""
    env = os.environ if environ is None else environ
    chosen = path if path is not None else env.get(CONFIG_ENV_VAR) or None
    data = read_config_file(chosen, environ) if chosen else {}
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=str(chosen or "defaults"))) from exc
    except SettingsError as exc:
        # An environment override that is not valid JSON where a list or mapping is expected
        # (`COMPACTION_PROXY_SERVER__API_KEYS=a`): name the variable's field, never its value.
        field = str(exc).split('"')[1] if str(exc).count('"') >= 2 else "an environment variable"
        raise ConfigError(
            f"environment override for {field} is not valid JSON (lists and mappings are "
            f"given as JSON, e.g. {ENV_PREFIX}SERVER__API_KEYS='[\"key\"]')"
        ) from None


def override_server(
    settings: Settings, overrides: Mapping[str, Any], flags: Mapping[str, str]
) -> Settings:
    """`settings` with command-line values for `server` keys, validated like the file's.

    `model_copy(update=...)` alone validates nothing: `serve --port 99999` used to start on a
    random port. `flags` names the option each key came from, for the error message.
    """
    if not overrides:
        return settings
    try:
        server = ServerSettings.model_validate({**settings.server.model_dump(), **overrides})
    except ValidationError as exc:
        lines = ["invalid command line:"]
        for error in exc.errors(include_url=False):
            key = str(error["loc"][0]) if error["loc"] else ""
            where = flags.get(key, f"server.{key}")
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"  {where}: {message} (got {error.get('input')!r})")
        raise ConfigError("\n".join(lines)) from None
    return settings.model_copy(update={"server": server})


def format_validation_error(exc: ValidationError, *, source: str) -> str:
    """One line per problem, each naming the full key path: `models.gpt-4o.compaction.pipeline.0.
    keep_last_tool_call_groups: Input should be greater than or equal to 0 (got -1)`."""
    lines = [f"invalid configuration ({source}):"]
    for error in exc.errors(include_url=False):
        loc, message = _key_path(error["loc"], error["msg"])
        if error["type"] == "extra_forbidden":
            allowed = _allowed_keys(error["loc"][:-1])
            if allowed:
                message = f"unknown key; allowed here: {', '.join(allowed)}"
            else:
                message = "unknown key"
            # No value: a misspelt `api_key` is the likeliest unknown key, and holds a secret.
            lines.append(f"  {loc}: {message}")
            continue
        if not error["loc"]:
            # A whole-document check: its input is the entire configuration, secrets included.
            lines.append(f"  {loc}: {message}")
            continue
        value = error.get("input")
        shown = _mask_if_secret(loc, value)
        lines.append(f"  {loc}: {message} (got {shown})")
    return "\n".join(lines)


def _key_path(loc: tuple[int | str, ...], message: str) -> tuple[str, str]:
    """The key path an error names, and its message.

    pydantic puts a pipeline entry's `strategy` after its list index (`pipeline.0.truncation.
    max_n`): not a key, so it is left out. A trigger's or target's own message starts with its
    key path below the field (`trigger.tokens_exceed: expected an integer`): that joins the path.
    """
    parts: list[str] = []
    previous: object = None
    for part in loc:
        if not (isinstance(previous, int) and part in STRATEGIES.names):
            parts.append(str(part))
        previous = part
    message = message.removeprefix("Value error, ")
    last = str(loc[-1]) if loc else ""
    if parts and last and message.startswith((f"{last}.", f"{last}:")) and ": " in message:
        own_path, message = message.split(": ", 1)
        parts[-1] = own_path
    return ".".join(parts) or "(top level)", message


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = Settings
    in_mapping = False
    for part in loc:
        if isinstance(part, int) or in_mapping:
            # A list index or a key of a `dict[str, Model]` (`models.gpt-4o`): not a field.
            in_mapping = False
            continue
        if model is StrategyParams and part in STRATEGIES.names:
            model = STRATEGIES.spec(part).params  # a pipeline entry: its strategy's own keys
            continue
        fields = getattr(model, "model_fields", {})
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return []
        in_mapping = _is_mapping(field.annotation)
        model = _model_of(field.annotation)
        if model is None:
            return []
    fields = getattr(model, "model_fields", {})
    return sorted(f.alias or name for name, f in fields.items())


def _is_mapping(annotation: Any) -> bool:
    if get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in getattr(annotation, "__args__", ()))


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


_SECRET_WORDS = ("key", "secret", "token", "password", "authorization")


def _mask_if_secret(loc: str, value: Any) -> str:
    last = loc.rsplit(".", 1)[-1].lower()
    if any(word in loc.lower() for word in ("api_key", "api_keys", "password", "secret")) or (
        last in _SECRET_WORDS and isinstance(value, str)
    ):
        return "'***'"
    # Containers may hold keys (`upstreams: {api_key: ...}`), strings may be credentialed URLs.
    text = repr(_mask_tree(value, last))
    return text if len(text) <= 120 else text[:117] + "..."


def effective_config(settings: Settings) -> dict[str, Any]:
    """The configuration as it will run, secrets masked: what `check-config` prints."""
    data = settings.model_dump(mode="json")
    return _mask_tree(data)


def _mask_tree(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _mask_tree(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_mask_tree(item, key) for item in node]
    if key in ("api_key", "api_keys", "metrics_keys", "password") and node not in (None, ""):
        return "***"
    if isinstance(node, str) and "://" in node and "@" in node:
        # redis://user:password@host — hide credentials in URLs.
        return re.sub(r"//[^@/]*@", "//***@", node)
    return node
