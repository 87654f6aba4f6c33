"""The image's start-up, rehearsed without Docker.

The proxy runs here exactly as the container would start it: the Dockerfile's ENTRYPOINT + CMD,
its ENV (paths inside the image mapped to the test's files: the volume to a temporary
directory, the baked config to config.example.yaml; tiktoken's cache an empty directory, as in
the image, where the encodings come with the installed packages), its WORKDIR. Then the
Dockerfile's own HEALTHCHECK command must fail before the server is up and pass once it is, the
store must land on the volume, and SIGTERM must end the process cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import httpx
import pytest
import yaml

from tests.deploy.files import CONFIG_EXAMPLE, REPO_ROOT, Dockerfile, Instruction, dockerfile
from tests.support.processes import child_env, free_port

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

STARTUP_TIMEOUT = 60.0
SHUTDOWN_TIMEOUT = 20.0


def _volume(df: Dockerfile) -> str:
    volume = df.final.all("VOLUME")[0]
    return (volume.exec_form() or volume.args.split())[0]


def _map_paths(df: Dockerfile, volume_dir: Path, empty_dir: Path) -> dict[str, str]:
    """The image's ENV with its in-image paths mapped onto this machine."""
    env = dict(df.final.env())
    env.pop("PATH")
    env.pop("VIRTUAL_ENV", None)
    volume = _volume(df)
    for key, value in env.items():
        if value == volume or value.startswith(volume + "/"):
            env[key] = str(volume_dir) + value[len(volume) :]
    # The image ships config.example.yaml at $COMPACTION_PROXY_CONFIG. It has no tiktoken cache:
    # the tests' own (child_env) is replaced by an empty one, so only the package can serve.
    env["COMPACTION_PROXY_CONFIG"] = str(CONFIG_EXAMPLE)
    env["TIKTOKEN_CACHE_DIR"] = str(empty_dir)
    env["TMPDIR"] = str(empty_dir)
    return env


def _argv(instruction: Instruction) -> list[str]:
    argv = instruction.exec_form()
    assert argv is not None
    return argv


def _entry_argv(df: Dockerfile) -> list[str]:
    """ENTRYPOINT + CMD, the console script run as `python -m compaction_proxy` from this
    checkout (the same `compaction_proxy.cli:main`; test_dockerfile checks the script name
    against pyproject.toml)."""
    argv = _argv(df.final.all("ENTRYPOINT")[-1]) + _argv(df.final.all("CMD")[-1])
    assert argv[0] == "compaction-proxy"
    return [sys.executable, "-m", "compaction_proxy", *argv[1:]]


def _healthcheck_argv(df: Dockerfile) -> list[str]:
    _, rest = df.final.all("HEALTHCHECK")[0].flags_and_rest()
    argv = _argv(Instruction("CMD", rest.removeprefix("CMD "), 0))
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def _container_env(extra: dict[str, str]) -> dict[str, str]:
    env = child_env(extra)  # no COMPACTION_PROXY_* from the outside, no HTTP proxies
    env.pop("OPENAI_API_KEY", None)
    # The image has the package installed; here it is imported from this checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _healthcheck(df: Dockerfile, env: dict[str, str]) -> int:
    return subprocess.run(
        _healthcheck_argv(df), env=env, capture_output=True, timeout=15, check=False
    ).returncode


def test_check_config_in_the_container_environment(tmp_path: Path) -> None:
    df = dockerfile()
    image_env = df.final.env()
    image_env.pop("PATH")
    env = _container_env({**image_env, "COMPACTION_PROXY_CONFIG": str(CONFIG_EXAMPLE)})
    argv = [*_entry_argv(df)[:-1], "check-config"]  # `docker run IMAGE check-config`
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["server"]["host"] == "0.0.0.0"
    assert effective["store"]["path"] == image_env["COMPACTION_PROXY_STORE__PATH"]
    assert PurePosixPath(effective["store"]["path"]).is_relative_to(_volume(df))
    assert str(CONFIG_EXAMPLE) in result.stderr  # read from $COMPACTION_PROXY_CONFIG


def test_serve_healthcheck_store_and_graceful_stop(tmp_path: Path) -> None:
    df = dockerfile()
    volume_dir = tmp_path / "volume"
    volume_dir.mkdir()
    empty_dir = tmp_path / "no-tiktoken-cache"
    empty_dir.mkdir()
    port = free_port()
    env = _container_env(
        {**_map_paths(df, volume_dir, empty_dir), "COMPACTION_PROXY_SERVER__PORT": str(port)}
    )
    workdir = df.final.all("WORKDIR")[-1].args
    cwd = volume_dir if workdir == _volume(df) else tmp_path

    assert _healthcheck(df, env) != 0, "the healthcheck must fail while nothing listens"

    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _entry_argv(df), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while _healthcheck(df, env) != 0:
            if proc.poll() is not None:
                pytest.fail(f"the proxy exited ({proc.returncode}):\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"healthcheck never passed:\n{log_path.read_text()}")
            time.sleep(0.3)

        # Readiness pings the store: the SQLite file appears where the image puts it, on the volume.
        with httpx.Client(trust_env=False, timeout=5) as client:
            ready = client.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200, ready.text
        # The image's encodings: exact counts with no cache directory and no download.
        assert ready.json()["checks"]["tokenizer"] == "ok", ready.text
        with httpx.Client(trust_env=False, timeout=5) as client:
            metrics = client.get(f"http://127.0.0.1:{port}/metrics").text
        for name in ("o200k_base", "cl100k_base"):
            assert f'compaction_proxy_tokenizer_estimated{{encoding="{name}"}} 0.0' in metrics
        store = Path(env["COMPACTION_PROXY_STORE__PATH"])
        assert store.is_relative_to(volume_dir) and store.exists(), sorted(volume_dir.rglob("*"))

        proc.send_signal(signal.SIGTERM)
        code = proc.wait(SHUTDOWN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(SHUTDOWN_TIMEOUT)
    output = log_path.read_text(encoding="utf-8", errors="replace")
    # uvicorn drains, runs the lifespan shutdown, then re-raises the signal it caught: the exit
    # status is "killed by SIGTERM" (143 in Docker) after a clean stop, or 0 as PID 1 (where the
    # kernel ignores the re-raised signal). Anything else, or no clean shutdown, is a failure.
    assert code in (0, -signal.SIGTERM), f"unexpected exit status {code}:\n{output}"
    assert "Application shutdown complete" in output, output
    assert "Traceback" not in output, output
    # The encodings were found in the installed package: no estimator, no download, no warning.
    assert "unavailable offline" not in output, output
    assert "warning" not in output.lower(), output
    assert list(empty_dir.iterdir()) == [], "nothing was written to a tiktoken cache"
