"""compose.yaml: parsed with PyYAML (always), and validated by the compose CLI.

The CLI check needs `docker compose` (v2 plugin) or `docker-compose` (Debian package
`docker-compose`, installed by scripts/test-deps); neither needs a Docker engine for `config`.
When neither exists the test FAILS saying how to install one rather than skipping
(tests/support/programs.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from compaction_proxy.checkpoints import RedisStore, StoreBreaker, make_store
from compaction_proxy.config import Settings, load_settings
from tests.deploy.files import (
    COMPOSE,
    CONFIG_EXAMPLE,
    DOCKERFILE,
    ENV_EXAMPLE,
    PROXY_SERVICE,
    REPO_ROOT,
    compose,
    dockerfile,
    env_mapping,
    healthcheck_python,
)
from tests.support import programs


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return compose()


@pytest.fixture(scope="module")
def proxy(spec: dict[str, Any]) -> dict[str, Any]:
    assert PROXY_SERVICE in spec["services"], f"service {PROXY_SERVICE!r} (the sidecar's host name)"
    return spec["services"][PROXY_SERVICE]


@pytest.fixture(scope="module")
def redis_name(spec: dict[str, Any]) -> str:
    names = [n for n, s in spec["services"].items() if str(s.get("image", "")).startswith("redis:")]
    assert len(names) == 1, f"one redis service expected, got {names}"
    return names[0]


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        total += float(number) * units[unit]
    assert total > 0, f"not a compose duration: {text!r}"
    return total


# ----------------------------------------------------------------------------- PyYAML checks


def test_redis_service_is_pinned_and_healthchecked(spec: dict[str, Any], redis_name: str) -> None:
    redis = spec["services"][redis_name]
    assert redis["image"] == "redis:7-alpine"
    test = redis["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and "redis-cli" in " ".join(test) and "ping" in test
    assert "ports" not in redis, "Redis stays on the compose network, unpublished"


def test_proxy_waits_for_a_healthy_redis(proxy: dict[str, Any], redis_name: str) -> None:
    depends = proxy["depends_on"]
    assert isinstance(depends, dict), "long depends_on syntax is needed for a condition"
    assert depends[redis_name]["condition"] == "service_healthy"


def test_store_points_at_the_redis_service(proxy: dict[str, Any], redis_name: str) -> None:
    env = env_mapping(proxy["environment"])
    assert env["COMPACTION_PROXY_STORE__BACKEND"] == "redis"
    url = env["COMPACTION_PROXY_STORE__URL"]
    assert url is not None
    assert re.fullmatch(rf"redis://{re.escape(redis_name)}:6379/\d+", url), url


def test_compose_environment_loads_with_the_example_config(
    proxy: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the container will run: the mounted example plus compose's environment."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_PROXY_"):
            monkeypatch.delenv(name)
    env = {k: v for k, v in env_mapping(proxy["environment"]).items() if v is not None}
    for key, value in env.items():
        if key.startswith("COMPACTION_PROXY_") and key != "COMPACTION_PROXY_CONFIG":
            monkeypatch.setenv(key, value)
    settings = load_settings(CONFIG_EXAMPLE, environ={"OPENAI_API_KEY": ""})
    assert settings.store.backend == "redis"
    assert settings.server.host == "0.0.0.0"
    store = make_store(settings.store)  # built, not connected
    assert isinstance(store, StoreBreaker) and isinstance(store.inner, RedisStore)


def test_named_volumes_are_declared_and_used(spec: dict[str, Any], redis_name: str) -> None:
    declared = set(spec.get("volumes") or {})
    assert declared, "declare named volumes at the top level"
    used = set()
    for service in spec["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source")
            if source and not source.startswith((".", "/", "~")):
                used.add(source)
    assert used <= declared, f"undeclared named volumes: {used - declared}"
    redis_targets = [str(v).split(":")[1] for v in spec["services"][redis_name]["volumes"]]
    assert "/data" in redis_targets, "Redis persists to a named volume"


def test_config_is_mounted_read_only_where_the_image_reads_it(proxy: dict[str, Any]) -> None:
    config_path = dockerfile().final.env()["COMPACTION_PROXY_CONFIG"]
    mounts = [str(v).split(":") for v in proxy["volumes"]]
    config_mounts = [m for m in mounts if len(m) >= 2 and m[1] == config_path]
    assert config_mounts, f"mount the config at {config_path} (the Dockerfile's path)"
    source, _, *mode = config_mounts[0]
    assert mode == ["ro"], "mount the config read-only"
    assert (REPO_ROOT / source).resolve() == CONFIG_EXAMPLE.resolve()
    env = env_mapping(proxy["environment"])
    assert env.get("COMPACTION_PROXY_CONFIG", config_path) == config_path


def test_keys_come_from_the_environment_without_an_env_file(proxy: dict[str, Any]) -> None:
    # No env_file: compose would refuse to start without the file ("Couldn't find env file").
    assert "env_file" not in proxy
    env = env_mapping(proxy["environment"])
    assert env["OPENAI_API_KEY"] == "${OPENAI_API_KEY:-}", "interpolated, empty when unset"
    example = ENV_EXAMPLE.read_text(encoding="utf-8")
    assert re.search(r"(?m)^OPENAI_API_KEY=$", example), ".env.example: an empty OPENAI_API_KEY="
    # Optional proxy keys are documented, commented out (an empty value would not parse).
    assert re.search(r"(?m)^# COMPACTION_PROXY_SERVER__API_KEYS=\[", example)
    # Every variable .env.example offers reaches the container: interpolated, or passed by
    # name (no value: taken from the shell or .env, left out when unset, never set empty).
    offered = set(re.findall(r"(?m)^#? ?([A-Z][A-Z0-9_]+)=", example))
    assert offered and offered <= set(env), f"not passed by compose.yaml: {offered - set(env)}"
    for name in offered - {"OPENAI_API_KEY"}:
        assert env[name] is None, f"{name}: pass it by name, so unset stays unset"
    # The mounted config reads the same variable.
    assert "${OPENAI_API_KEY:-}" in CONFIG_EXAMPLE.read_text(encoding="utf-8")


def test_port_published_on_loopback_and_matches_expose(proxy: dict[str, Any]) -> None:
    exposed = dockerfile().final.all("EXPOSE")[0].args.split("/")[0]
    ports = [str(p) for p in proxy["ports"]]
    assert any(p.rsplit(":", 1)[-1] == exposed for p in ports), ports
    # Holding the upstream key, the proxy is published on the host's loopback only.
    assert all(p.startswith("127.0.0.1:") for p in ports), ports


def test_proxy_healthcheck_uses_python_on_healthz(proxy: dict[str, Any]) -> None:
    check = proxy["healthcheck"]
    code = healthcheck_python(check["test"])
    compile(code, "<compose healthcheck>", "exec")
    assert "/healthz" in code and "timeout=" in code
    assert "$" not in code, "compose would interpolate `$`"
    # The same command as the image's own HEALTHCHECK (one definition of "healthy").
    _, rest = dockerfile().final.all("HEALTHCHECK")[0].flags_and_rest()
    image_argv = json.loads(rest.removeprefix("CMD "))
    assert code == healthcheck_python(image_argv)
    assert _seconds(check["timeout"]) <= 10


def test_graceful_shutdown_fits_in_the_stop_grace_period(proxy: dict[str, Any]) -> None:
    drain = Settings().server.graceful_shutdown_seconds
    assert _seconds(proxy["stop_grace_period"]) > drain, (
        f"docker stops with SIGKILL after stop_grace_period; uvicorn drains for {drain}s"
    )


def test_build_uses_the_repository_dockerfile(proxy: dict[str, Any]) -> None:
    build = proxy["build"]
    context = build if isinstance(build, str) else build["context"]
    dockerfile_name = (
        "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    )
    assert (COMPOSE.parent / context / dockerfile_name).resolve() == DOCKERFILE.resolve()


def test_sidecar_example_points_the_app_at_the_proxy(proxy: dict[str, Any]) -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    commented = "\n".join(
        line.split("# ", 1)[1] for line in text.splitlines() if line.lstrip().startswith("# ")
    )
    match = re.search(r"OPENAI_BASE_URL: http://([\w.-]+):(\d+)/v1", commented)
    assert match, "the commented app service sets OPENAI_BASE_URL"
    assert match.group(1) == PROXY_SERVICE
    assert match.group(2) == dockerfile().final.all("EXPOSE")[0].args.split("/")[0]


# ----------------------------------------------------------------------------- the compose CLI


def _project(tmp_path: Path, *, dotenv: str | None) -> Path:
    """A copy of what a user has next to compose.yaml, with or without a .env file."""
    for name in ("compose.yaml", "Dockerfile", "config.example.yaml", ".env.example"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    if dotenv is not None:
        (tmp_path / ".env").write_text(dotenv, encoding="utf-8")
    return tmp_path


def _compose_config(project: Path, **environ: str) -> dict[str, Any]:
    """`<compose> config` in ``project`` with only PATH, HOME and ``environ`` set."""
    cli = programs.compose()
    result = subprocess.run(
        [*cli, "config"],
        cwd=project,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(project), **environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{' '.join(cli)} config failed:\n{result.stderr}"
    resolved = yaml.safe_load(result.stdout)
    assert isinstance(resolved, dict)
    return resolved


@pytest.mark.e2e
@pytest.mark.external  # docker compose
def test_compose_cli_validates_and_resolves_the_file_with_a_dotenv(tmp_path: Path) -> None:
    # As a user has it after `cp .env.example .env` and editing the key and one option.
    env_text = ENV_EXAMPLE.read_text(encoding="utf-8").replace(
        "OPENAI_API_KEY=\n", "OPENAI_API_KEY=sk-from-dotenv-4242\n"
    )
    env_text = env_text.replace(
        "# COMPACTION_PROXY_SERVER__LOG_LEVEL=debug", "COMPACTION_PROXY_SERVER__LOG_LEVEL=debug"
    )
    resolved = _compose_config(_project(tmp_path, dotenv=env_text))
    service = resolved["services"][PROXY_SERVICE]
    env = env_mapping(service["environment"])
    # .env reaches the container, both through the ${...} interpolation and by name.
    assert env["OPENAI_API_KEY"] == "sk-from-dotenv-4242"
    assert env["COMPACTION_PROXY_SERVER__LOG_LEVEL"] == "debug"
    assert env["COMPACTION_PROXY_STORE__BACKEND"] == "redis"
    assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    config_path = dockerfile().final.env()["COMPACTION_PROXY_CONFIG"]
    volumes = service["volumes"]
    targets = [v["target"] if isinstance(v, dict) else str(v).split(":")[1] for v in volumes]
    assert config_path in targets


@pytest.mark.e2e
@pytest.mark.external  # docker compose
def test_compose_cli_needs_no_dotenv_the_key_comes_from_the_shell(tmp_path: Path) -> None:
    """No .env at all (compose used to refuse: "Couldn't find env file"); the key exported in
    the shell reaches the container, unset options stay unset (never empty strings)."""
    project = _project(tmp_path, dotenv=None)
    resolved = _compose_config(
        project, OPENAI_API_KEY="sk-from-shell-5151", COMPACTION_PROXY_STORE__TTL="3d"
    )
    env = env_mapping(resolved["services"][PROXY_SERVICE]["environment"])
    assert env["OPENAI_API_KEY"] == "sk-from-shell-5151"
    assert env["COMPACTION_PROXY_STORE__TTL"] == "3d"
    assert env.get("COMPACTION_PROXY_SERVER__API_KEYS") is None, env
    assert not (project / ".env").exists()

    bare = _compose_config(project)
    env = env_mapping(bare["services"][PROXY_SERVICE]["environment"])
    assert env["OPENAI_API_KEY"] == "", "no key anywhere: empty, clients' keys pass through"
