"""When the Claude Code tests skip and when they fail (tests/support/claude_code.py).

A skip is only for a machine that can never run them (no native build, no npm to install
one); a machine that could install Claude Code but has not must fail, saying how, or a run that
tested nothing would pass as green.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import claude_code


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(claude_code.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(claude_code.BINARY_ENV, raising=False)
    monkeypatch.setattr("platform.system", lambda: "Linux")
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    return tmp_path


def test_a_platform_without_a_native_build_is_a_skip(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("platform.system", lambda: "FreeBSD")
    reason = claude_code.not_installable()
    assert reason is not None and "FreeBSD x86_64" in reason
    with pytest.raises(pytest.skip.Exception, match="no native build"):
        claude_code.binary_or_skip()


def test_no_npm_is_a_skip(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="npm is not on PATH"):
        claude_code.binary_or_skip()


def test_installable_but_not_installed_fails_saying_how(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert claude_code.not_installable() is None
    with pytest.raises(pytest.fail.Exception, match="scripts/test-deps"):
        claude_code.binary_or_skip()


def test_a_given_binary_is_never_a_skip(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.system", lambda: "FreeBSD")
    monkeypatch.setenv(claude_code.BINARY_ENV, str(empty_cache / "missing-claude"))
    assert claude_code.not_installable() is None
    with pytest.raises(pytest.fail.Exception, match="is not an executable file"):
        claude_code.binary_or_skip()
