"""The configuration: one YAML file, environment overrides, ``${VAR}`` interpolation.

* ``_models``: the typed sections (every one forbids unknown keys);
* ``_loading``: reading the file, overrides, and errors that name the key path;
* :mod:`.preflight`: the checks beyond the schema that the CLI runs before anything starts
  (``from compaction_proxy.config import preflight``), and the ones the summarizer and the
  store factory share with it.
"""

from compaction_proxy.compaction.fields import parse_duration

from ._loading import (
    ConfigError,
    effective_config,
    format_validation_error,
    interpolate,
    load_settings,
    override_server,
    read_config_file,
)
from ._models import (
    CONFIG_ENV_VAR,
    ENV_PREFIX,
    DashboardSettings,
    ModelSettings,
    ServerSettings,
    Settings,
    StoreSettings,
    Strict,
    Timeouts,
    UpstreamSettings,
    WindowSettings,
    find_upstream,
)

__all__ = [
    "CONFIG_ENV_VAR",
    "ENV_PREFIX",
    "ConfigError",
    "DashboardSettings",
    "ModelSettings",
    "ServerSettings",
    "Settings",
    "StoreSettings",
    "Strict",
    "Timeouts",
    "UpstreamSettings",
    "WindowSettings",
    "effective_config",
    "find_upstream",
    "format_validation_error",
    "interpolate",
    "load_settings",
    "override_server",
    "parse_duration",
    "read_config_file",
]
