"""Optional test dependencies, required where they install.

A test of an optional part skips only where the test extra cannot install that part (its
requirement's environment marker in pyproject.toml is false here); where the extra installs it,
a missing part fails the test, so a broken install never passes as a skip.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def extra_requirement(name: str) -> Requirement:
    """The test extra's requirement for the distribution ``name``."""
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for line in extras["test"]:
        requirement = Requirement(line)
        if requirement.name == name:
            return requirement
    raise AssertionError(f"{name} is not in the test extra of pyproject.toml")


def installable(name: str) -> bool:
    """True where the test extra installs ``name`` (its marker holds on this interpreter)."""
    marker = extra_requirement(name).marker
    return marker is None or marker.evaluate()


def require_or_skip(distribution: str, module: str) -> ModuleType:
    """``module`` imported; skipped (saying why) only where the test extra cannot install
    ``distribution``; an import error where it can is a failure."""
    if not installable(distribution):
        pytest.skip(f"{distribution} has no wheel for this platform (its marker in pyproject.toml)")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(
            f"{distribution} belongs to the test extra on this platform but does not import "
            f"({exc}): reinstall with pip install -e '.[test]'"
        )
