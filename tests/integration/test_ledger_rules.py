"""Rules stated in system and user messages are forwarded verbatim, however long the chat.

Real processes: 100 user turns (tests/support/rule_turns.py), a rule in the system message and
in every third user turn ("Never ...", "Always ...", "You must ...", "Don't ...", "Make sure
...", an "IMPORTANT: ..." line, numbered requirements), a ~900-token tool result between turns;
the default pipeline with a summarizer that writes prose and copies no rule (the fake
upstream's `summarizer: prose`), at an 8k and a 32k window. A summary is never the only carrier
of a rule: at the end every rule stated is in the forwarded request, word for word, and every
request succeeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_session import assert_valid_pairing
from tests.support.in_thread import InThreadServers
from tests.support.rule_turns import RuleSession, run_rule_turns
from tests.support.servers import UpstreamControl, session_config

TURNS = 100
WINDOWS = {"8k": 8_192, "32k": 32_768}


def rules_config(upstream: UpstreamControl, db: Path, model: str, window: int) -> dict[str, Any]:
    return session_config(upstream, db, model, window)


@pytest.fixture(scope="module")
def rules_upstream(in_thread: InThreadServers) -> UpstreamControl:
    return in_thread.upstream(None)


@pytest.fixture(scope="module", params=sorted(WINDOWS))
def session(
    request: pytest.FixtureRequest,
    rules_upstream: UpstreamControl,
    in_thread: InThreadServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[int, RuleSession]:
    window = WINDOWS[request.param]
    model = f"rules-{request.param}"
    rules_upstream.reset()
    rules_upstream.control(summarizer="prose", model_context_windows={model: window})
    db = tmp_path_factory.mktemp(f"rules-{request.param}") / "checkpoints.db"
    proxy = in_thread.proxy(rules_config(rules_upstream, db, model, window))
    with proxy.openai_client() as client:
        return window, run_rule_turns(client, rules_upstream, model=model, turns=TURNS)


def test_every_turn_succeeds_under_the_window_and_old_turns_are_folded(
    session: tuple[int, RuleSession],
) -> None:
    window, result = session
    assert len(result.turns) == TURNS  # the SDK raises on any non-2xx
    assert all(0 < turn.prompt_tokens <= window for turn in result.turns)
    assert any(t.checkpoint == "new" for t in result.turns), "nothing was ever compacted"
    assert any("summarization" in t.strategies for t in result.turns), "no summary was made"
    results = [m for m in result.turns[-1].forwarded if m.get("role") == "tool"]
    assert result.conversation[3] not in results, "the first turn's tool result was never folded"
    for turn in result.turns:
        assert_valid_pairing(turn.forwarded)


def test_every_rule_is_forwarded_verbatim_at_the_end(session: tuple[int, RuleSession]) -> None:
    _, result = session
    assert len(result.rules) >= 40
    missing = result.missing()
    assert not missing, f"{result.figure()}; missing, e.g.: {missing[:3]}"
