"""Fixtures for unit tests: a clean environment and small config-file helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The default checkpoint store is a SQLite file under ./data: keep it out of the repo.
    monkeypatch.chdir(tmp_path)
    # pydantic-settings reads os.environ directly: a developer's shell must not leak in.
    for name in list(os.environ):
        if name.startswith("COMPACTION_PROXY_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    counter = iter(range(1_000_000))

    def write(text: str) -> Path:
        path = tmp_path / f"config-{next(counter)}.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return write
