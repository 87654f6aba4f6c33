"""The command line: check-config output and exit codes, --version, serve's argument handling."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from compaction_proxy import __version__
from compaction_proxy.cli import main
from compaction_proxy.config import CONFIG_ENV_VAR

WriteConfig = Callable[[str], Path]

CONFIG = """
server:
  port: 9123
  api_keys: [proxy-key-SECRET]
upstreams:
  - name: local
    base_url: http://local.test/v1
    api_key: sk-upstream-SECRET
    models: ["llama-*"]
store:
  backend: redis
  url: redis://:redis-pass-SECRET@redis.test:6379/0
"""


def test_check_config_prints_masked_yaml(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(CONFIG)
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "SECRET" not in out
    assert "SECRET" not in err
    printed = yaml.safe_load(out)
    assert printed["server"]["port"] == 9123
    assert printed["server"]["api_keys"] == ["***"]
    assert printed["upstreams"][0]["name"] == "local"
    assert printed["upstreams"][0]["api_key"] == "***"
    assert printed["upstreams"][0]["models"] == ["llama-*"]
    assert printed["store"]["url"] == "redis://***@redis.test:6379/0"
    assert "configuration is valid" in err
    assert str(path) in err


def test_check_config_keeps_section_order(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(write_config(CONFIG))]) == 0
    keys = list(yaml.safe_load(capsys.readouterr().out))
    assert keys[:2] == ["server", "upstreams"]


def test_check_config_applies_env_overrides(
    write_config: WriteConfig,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__PORT", "9999")
    assert main(["check-config", str(write_config(CONFIG))]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["server"]["port"] == 9999


def test_check_config_file_from_env(
    write_config: WriteConfig,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(write_config(CONFIG)))
    assert main(["check-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["server"]["port"] == 9123


def test_check_config_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["upstreams"][0]["name"] == "openai"
    assert "(defaults)" in err


def test_check_config_invalid_exits_2(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config("server: {port: 70000, prot: 1}\n")
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("compaction-proxy: invalid configuration")
    assert "server.port" in err
    assert "server.prot: unknown key; allowed here:" in err


def test_check_config_invalid_does_not_print_secrets(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        "upstreams: [{name: a, base_url: bad, api_key: sk-SECRET, apikey: sk-SECRET2}]\n"
    )
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "upstreams.0.base_url" in err
    assert "SECRET" not in out + err


def test_check_config_missing_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_check_config_missing_variable_exits_2(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config("server: {host: '${CP_UNSET_FOR_TEST}'}\n")
    assert main(["check-config", str(path)]) == 2
    assert "CP_UNSET_FOR_TEST" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"compaction-proxy {__version__}"


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --- serve, with uvicorn.run captured ----------------------------------------------------------


@pytest.fixture
def uvicorn_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    import uvicorn

    import compaction_proxy.http

    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    # serve configures the root logger; keep pytest's handlers.
    monkeypatch.setattr(compaction_proxy.http, "configure_logging", lambda level: None)
    return calls


def test_serve_is_default_command_and_flags_override(
    write_config: WriteConfig, uvicorn_calls: list[tuple[Any, dict[str, Any]]]
) -> None:
    from compaction_proxy.app import ProxyApp

    path = write_config(CONFIG)
    assert main(["--config", str(path), "--port", "9555", "--host", "0.0.0.0"]) == 0
    ((app, kwargs),) = uvicorn_calls
    assert isinstance(app, ProxyApp)
    assert kwargs["port"] == 9555
    assert kwargs["host"] == "0.0.0.0"
    assert app.state.settings.server.port == 9555
    assert kwargs["server_header"] is False
    assert kwargs["access_log"] is False


def test_serve_port_from_file(
    write_config: WriteConfig, uvicorn_calls: list[tuple[Any, dict[str, Any]]]
) -> None:
    assert main(["serve", "-c", str(write_config(CONFIG))]) == 0
    assert uvicorn_calls[0][1]["port"] == 9123


def test_serve_workers_export_config_path(
    write_config: WriteConfig,
    uvicorn_calls: list[tuple[Any, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Recorded by monkeypatch so the CLI's own os.environ write is undone after the test.
    monkeypatch.setenv(CONFIG_ENV_VAR, "placeholder")
    path = write_config(CONFIG)
    assert main(["serve", "--config", str(path), "--workers", "3"]) == 0
    app, kwargs = uvicorn_calls[0]
    assert app == "compaction_proxy.app:create_app_from_env"
    assert kwargs["workers"] == 3
    assert kwargs["factory"] is True
    assert os.environ[CONFIG_ENV_VAR] == str(path.resolve())


def test_serve_invalid_config_exits_2(
    write_config: WriteConfig,
    uvicorn_calls: list[tuple[Any, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--config", str(write_config("upstreams: []\n"))]) == 2
    assert uvicorn_calls == []
    assert "upstreams" in capsys.readouterr().err


def test_serve_validates_flag_overrides(
    write_config: WriteConfig,
    uvicorn_calls: list[tuple[Any, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "-c", str(write_config(CONFIG)), "--port", "99999"]) == 2
    assert uvicorn_calls == []
    err = capsys.readouterr().err
    assert "--port: Input should be less than or equal to 65535 (got 99999)" in err


def test_serve_runs_the_start_up_checks_after_the_flags(
    write_config: WriteConfig,
    uvicorn_calls: list[tuple[Any, dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One worker in the file is fine for the memory store; --workers 2 is what breaks it.
    path = write_config("store: {backend: memory}\n")
    assert main(["serve", "-c", str(path)]) == 0
    assert main(["serve", "-c", str(path), "--workers", "2"]) == 2
    assert len(uvicorn_calls) == 1
    assert "store.backend: memory" in capsys.readouterr().err


def test_serve_hands_uvicorn_the_logging_set_up_for_every_worker(
    write_config: WriteConfig,
    uvicorn_calls: list[tuple[Any, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_DEBUG", "true")
    assert main(["serve", "-c", str(write_config(CONFIG)), "--workers", "2"]) == 0
    config = uvicorn_calls[0][1]["log_config"]
    assert config["root"]["level"] == "INFO"
    assert config["disable_existing_loggers"] is False
    assert config["loggers"]["compaction_proxy.compaction"] == {"level": "DEBUG"}


def test_logging_config_leaves_the_decision_log_alone_without_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compaction_proxy.http import logging_config

    monkeypatch.delenv("COMPACTION_DEBUG", raising=False)
    assert "compaction_proxy.compaction" not in logging_config("warning")["loggers"]
    assert logging_config("warning")["root"]["level"] == "WARNING"
