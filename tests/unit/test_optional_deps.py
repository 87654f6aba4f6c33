"""Optional test dependencies fail where the test extra installs them and skip only where it
cannot (tests/support/optional.py): a broken install never passes as a skip."""

from __future__ import annotations

import pytest

from tests.support.optional import extra_requirement, installable, require_or_skip


def test_a_missing_module_fails_where_the_extra_installs_it_and_skips_elsewhere() -> None:
    expected = pytest.fail.Exception if installable("bpe-openai") else pytest.skip.Exception
    with pytest.raises(expected):
        require_or_skip("bpe-openai", "bpe_openai_is_not_this_module")


def test_the_requirements_are_read_from_the_test_extra() -> None:
    assert extra_requirement("agent-framework-core").marker is None  # everywhere: no skip
    assert installable("agent-framework-core")
    with pytest.raises(AssertionError, match="not in the test extra"):
        extra_requirement("no-such-distribution")
