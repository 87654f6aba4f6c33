"""Claude Code itself against the fake Messages upstream with a 64k window, no proxy.

The baseline the ``/v1/messages`` adapter has to beat: in an 80-step Bash session Claude Code
is refused ("prompt is too long") and survives only by compacting itself; with its
auto-compact off it dies at the first refusal. These also check the fake against a real
client: none of Claude Code's requests may break the fake's rules. ``scripts/test-deps``
installs Claude Code; without it these fail, saying how to install it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.messages.prompt import content_blocks
from tests.support.claude_code import loop_prompt, require_binary, run_session
from tests.support.messages_upstream import MessagesUpstreamServer, cache_share

pytestmark = [pytest.mark.e2e, pytest.mark.external]  # the real Claude Code CLI (npm)

WINDOW = 65_536
STEPS = 80


@pytest.fixture(scope="module")
def claude() -> Path:
    return require_binary()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    handle = MessagesUpstreamServer(
        tmp_path_factory.mktemp("claude-code") / "fake.log", context_window=WINDOW
    )
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def fake(server: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    server.reset()
    yield server
    server.reset()


def breakpoints(body: dict[str, Any]) -> int:
    blocks = [*(body.get("tools") or []), *(body.get("system") or [])]
    for message in body["messages"]:
        blocks += content_blocks(message["content"])
    return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)


def test_claude_code_compacts_itself_after_refusals_and_finishes(
    claude: Path, fake: MessagesUpstreamServer, tmp_path: Path
) -> None:
    session = run_session(claude, fake.base_url, loop_prompt(STEPS), workdir=tmp_path / "work")
    assert session.returncode == 0, session.describe()
    assert session.terminal_reason == "completed", session.describe()
    assert session.steps_completed == STEPS, session.describe()
    assert str(session.result.get("result")).startswith(f"fake-loop done: {STEPS} steps")
    assert (tmp_path / "work" / "fake-steps" / f"step-{STEPS}.txt").is_file()  # it ran them
    assert session.context_window == 1_000_000  # what it assumes for an unknown model

    events = fake.events()
    refused = [e for e in events if e["type"] == "refused"]
    assert refused, "a 64k window must refuse an 80-step session somewhere"
    assert all(e["input_tokens"] > WINDOW for e in refused)
    assert [e for e in events if e["type"] == "rejected"] == []  # every request was valid
    assert 1 <= len(session.compactions) <= len(refused), session.describe()
    # Its breakpoints (system blocks, newest tool result) cache well between its compactions;
    # without the fake's 20-block lookback only the system part would read (about a quarter).
    answered = [e["usage"] for e in events if e["type"] == "answered"]
    assert cache_share(answered).share > 0.8

    recorded = fake.requests()
    assert {r.path for r in recorded} == {"/v1/messages"}  # no count_tokens, nothing else
    for request in recorded:
        body = request.json()
        assert request.query == "beta=true"
        assert body["stream"] is True and body["max_tokens"] == 32_000
        assert request.headers["x-api-key"] == "sk-ant-test-dummy"
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "context-management-2025-06-27" in request.headers["anthropic-beta"]
        assert len(body["system"]) == 3 and breakpoints(body) == 3
        assert any(m["role"] == "system" for m in body["messages"])


def test_without_auto_compact_claude_code_dies_before_step_80(
    claude: Path, fake: MessagesUpstreamServer, tmp_path: Path
) -> None:
    session = run_session(
        claude,
        fake.base_url,
        loop_prompt(STEPS),
        workdir=tmp_path / "work",
        disable_auto_compact=True,
    )
    assert session.returncode != 0, session.describe()
    assert session.terminal_reason == "prompt_too_long", session.describe()
    assert 0 < session.steps_completed < STEPS, session.describe()
    assert session.compactions == []
    refused = [e for e in fake.events() if e["type"] == "refused"]
    assert len(refused) == 1 and refused[0]["input_tokens"] > WINDOW
    assert session.result.get("api_error_status") == 400
