"""Loading the configuration: the YAML file, ``${VAR}`` interpolation, environment overrides,
the CLI's server flags, and errors worded for the person who wrote the file (key paths, the
keys a section accepts, secrets masked)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import SettingsError

from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.compaction.strategies.params import StrategyParams
from compaction_proxy.compaction.strategies.registry import STRATEGIES

from ._models import CONFIG_ENV_VAR, ENV_PREFIX, ServerSettings, Settings

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(CompactionProxyError):
    """A configuration problem, worded for the person who wrote the file."""


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
    return {key: _mask_tree(value, key) for key, value in data.items()}


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
