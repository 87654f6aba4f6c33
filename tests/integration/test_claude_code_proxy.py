"""Claude Code itself through the proxy: an 80-step Bash session against a 64k window.

The issue's end-to-end promise for ``/v1/messages``. ``claude -p`` (the real CLI,
tests/support/claude_code.py) runs the fake Messages model's scripted Bash loop
(tests/fakes/messages: about 2.2k tokens a step, a refusal in Anthropic's words past 65,536
tokens, signed thinking, prompt caching by breakpoints) with ``ANTHROPIC_BASE_URL`` at the
proxy. Without the proxy (tests/harness/test_claude_code.py) the fake refuses it, Claude Code
survives only by compacting itself, and with ``DISABLE_AUTO_COMPACT=1`` it dies at the first
refusal. Through the proxy it must finish both ways, never refused and never compacting itself.

Set-up as a user would write it: one upstream entry at the fake's ``/v1`` (the client's
``x-api-key`` passes through), the window *declared* in ``models:`` (a local server is started
with its window, so its user knows it; Anthropic's model listing carries no window to
discover, and learning it from a refusal would cost the very refusal this test forbids), the
SQLite store and the default pipeline with its summarizer on the request's own upstream and
model. Claude Code assumes a 1,000,000-token window for a model it does not know and cannot be
told a smaller one, so only the proxy keeps it under 64k.

Claude Code is installed by ``scripts/test-deps``; without it these fail saying how, except
where it cannot be installed at all (no npm, no native build), where they are skipped saying
why. Each session takes 10-30 s on two shared cores; the module runs two.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.messages.model import CHECKPOINT_MARKER, CLAUDE_CODE_SUMMARY, FACT
from tests.fakes.messages.prompt import content_blocks
from tests.fakes.messages.signing import Signer
from tests.observability.traffic import value
from tests.support.claude_code import DEFAULT_MODEL, binary_or_skip
from tests.support.claude_code_proxy import ProxiedRun, config, run_through
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer, cache_share
from tests.support.servers import ProxyServer, Recorded

pytestmark = pytest.mark.external  # the real Claude Code CLI (npm)

WINDOW = 65_536
STEPS = 80
MAX_BREAKPOINTS = 4
CACHE_FLOOR = 0.85
"""The cache-read share a checkpoint hit can reach at most is about 1 - step / prompt: every
request adds one step (~2.2k tokens) no cache has seen, and a hit's prompt is at least the
landing point after an event (half the budget: ~15k tokens with Claude Code's whole 32k output
reserve, more with a bounded one), so at worst ~87%, about 90% over a session. A prefix the
proxy re-cut between events would read only the tools and system blocks (~11k of 15-25k)."""


@pytest.fixture(scope="module")
def claude() -> Path:
    return binary_or_skip()


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(
        tmp_path_factory.mktemp("claude-code-proxy") / "fake.log", context_window=WINDOW
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["auto_compact", "auto_compact_off"])
def run(
    request: pytest.FixtureRequest,
    claude: Path,
    fake: MessagesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ProxiedRun:
    root = tmp_path_factory.mktemp(request.param)
    proxy: ProxyServer = module_proxy_factory(config(fake, root / "checkpoints.db", WINDOW))
    return run_through(
        claude,
        fake,
        proxy,
        name=request.param,
        steps=STEPS,
        workdir=root / "work",
        disable_auto_compact=request.param == "auto_compact_off",
    )


def test_claude_code_finishes_all_80_steps(run: ProxiedRun) -> None:
    session = run.session
    assert session.returncode == 0, run.describe()
    assert session.terminal_reason == "completed", run.describe()
    assert session.steps_completed == STEPS, run.describe()
    assert str(session.result.get("result")).startswith(f"fake-loop done: {STEPS} steps")
    written = sorted((session.workdir / "fake-steps").glob("step-*.txt"))
    assert len(written) == STEPS  # it ran every command, and each wrote its file
    assert (session.workdir / "fake-steps" / "step-1.txt").read_text().startswith("step 1 line 1:")
    assert session.context_window == 1_000_000  # what it assumed: the proxy kept it under 64k


def test_no_request_is_refused_or_rejected(run: ProxiedRun) -> None:
    assert run.refused() == [], run.describe()
    assert run.rejected() == [], run.describe()  # tool pairing, thinking, breakpoints, fields
    assert {t.access["status"] for t in run.turns} == {200}
    assert all(t.prompt <= WINDOW for t in run.turns)


def test_claude_code_never_compacts_itself(run: ProxiedRun) -> None:
    assert run.session.compactions == [], run.describe()
    statuses = [e for e in run.session.events if e.get("subtype") == "status"]
    assert not any("compact" in json.dumps(e) for e in statuses)
    for record in run.claude_requests():  # nor does it ever ask the model for its own summary
        last = record.json()["messages"][-1]
        text = "\n".join(str(b.get("text", "")) for b in content_blocks(last.get("content")))
        assert CLAUDE_CODE_SUMMARY.search(text) is None


def test_the_proxy_compacted_what_claude_code_sent(run: ProxiedRun) -> None:
    before = [int(t.access["tokens_before"]) for t in run.turns]
    after = [int(t.access["tokens_after"]) for t in run.turns]
    assert max(before) > 2 * WINDOW  # the conversation Claude Code kept sending
    assert max(after) < WINDOW
    assert any(t.event for t in run.turns), run.describe()
    forwarded = value(run.metrics, "compaction_proxy_api_prompt_tokens_total", **_after())
    sent = value(run.metrics, "compaction_proxy_api_prompt_tokens_total", **_before())
    assert 0 < forwarded < sent / 2


def _before() -> dict[str, str]:
    return {"api": "messages", "stage": "before"}


def _after() -> dict[str, str]:
    return {"api": "messages", "stage": "after"}


def breakpoints(node: Any) -> int:
    """``cache_control`` markers anywhere in a request (tool results' inner blocks count too)."""
    if isinstance(node, dict):
        return ("cache_control" in node) + sum(breakpoints(v) for v in node.values())
    if isinstance(node, list):
        return sum(breakpoints(v) for v in node)
    return 0


def request_breakpoints(record: Recorded) -> int:
    body = record.json()
    return breakpoints([body.get("tools"), body.get("system"), body.get("messages")])


def test_every_forwarded_request_has_at_most_four_breakpoints(run: ProxiedRun) -> None:
    counts = [request_breakpoints(r) for r in run.requests]  # summary calls included
    assert counts and max(counts) <= MAX_BREAKPOINTS, counts
    own = [request_breakpoints(r) for r in run.claude_requests()]
    assert min(own) >= 3, own  # Claude Code's own three (two system, the newest result) stay


def test_thinking_blocks_go_back_as_the_model_signed_them(run: ProxiedRun) -> None:
    """Claude Code sends each thinking block back as it received it; the proxy must forward it
    unchanged, on the turn it belongs to (the fake rejects a changed or forged one, and a
    final turn that lost its thinking: see test_no_request_is_refused_or_rejected)."""
    signer = Signer()  # the fake's default secret: the test can check what it signed
    received = {
        block["signature"]
        for event in run.session.events
        if event.get("type") == "assistant"
        for block in event["message"]["content"]
        if block.get("type") == "thinking"
    }
    checked = 0
    for record in run.claude_requests():
        messages = record.json()["messages"]
        for message in messages:
            for block in content_blocks(message.get("content")):
                if block.get("type") != "thinking":
                    continue
                assert message["role"] == "assistant"
                assert block["signature"] in received
                assert signer.opened(block["signature"], block["thinking"]) is not None
                checked += 1
        turns = [m for m in messages if m["role"] == "assistant"]
        if turns:  # the turn the newest tool result answers keeps its thinking first
            assert content_blocks(turns[-1]["content"])[0]["type"] == "thinking"
    assert checked >= len(run.claude_requests()) - 1  # every step's turn had one


def test_the_compacted_prefix_stays_cached_between_events(run: ProxiedRun) -> None:
    """After an event the proxy forwards its stored checkpoint and the steps after it,
    verbatim, so each request reads from the cache everything the previous one sent."""
    assert any(t.event for t in run.turns), run.describe()
    hits = run.hits_after_first_event()
    assert hits, f"no checkpoint was ever reused: {run.describe()}"
    for previous, turn in hits:
        assert turn.usage["cache_read_input_tokens"] >= previous.prompt, (previous, turn)
    share = cache_share([turn.usage for _, turn in hits]).share
    assert share >= CACHE_FLOOR, f"{share:.1%} between events; {run.describe()}"
    events = sum(t.event for t in run.turns)
    assert events <= len(run.turns) // 3, run.describe()  # hysteresis: steps between events


def test_summaries_are_messages_calls_to_the_requests_own_upstream(run: ProxiedRun) -> None:
    assert {r.path for r in run.requests} == {MESSAGES}, run.describe()
    calls = run.summary_calls()
    assert calls, run.describe()
    for record in calls:
        body = record.json()
        assert body["model"] == DEFAULT_MODEL
        last = body["messages"][-1]
        text = "\n".join(str(b.get("text", "")) for b in content_blocks(last.get("content")))
        assert CHECKPOINT_MARKER in text or "<conversation>" in text
    assert value(run.metrics, "compaction_proxy_summarizer_failures_total") == 0
    assert value(run.metrics, "compaction_proxy_summarizer_calls_total", outcome="ok") >= 1


def test_facts_the_summaries_saw_reach_the_end(run: ProxiedRun) -> None:
    """The fake's last answer lists every ``FACT-S<k>`` (echoed by steps 10, 20, ... 80) it can
    see in its final prompt. The newest step's is verbatim; an older one survives only where a
    summary recorded it, and a summary can only record what it was shown. Today none is shown
    one: each fact is the last line of its step's output, and ``tool_result_compaction``, which
    runs before ``summarization`` in the default pipeline, keeps only the head of each old
    result, so what the summarizer folds has lost it already."""
    final = str(run.session.result.get("result"))
    kept = re.findall(r"FACT-S\d+", final.split("Facts:", 1)[-1])
    assert f"FACT-S{STEPS}" in kept, final
    shown = {
        fact
        for record in run.summary_calls()
        if record.path == MESSAGES  # a call the fake answered (no other route summarizes)
        for fact in FACT.findall(record.text)
        if fact.startswith("FACT-S")
    }
    assert shown <= set(kept), (sorted(shown - set(kept)), final)
