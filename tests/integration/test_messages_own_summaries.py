"""A Messages session summarized by its own model, through real processes: the proxy's
``/v1/messages`` route (the Messages wire format), the fake Anthropic upstream (which enforces
the window, signed thinking and breakpoints, and caches prompts the way Anthropic documents)
and a Claude-Code-shaped client (two system breakpoints, one on the newest tool result,
adaptive thinking sent back).

Every request is accepted, and each summary call is the cache-aligned call in Messages form: the
client's own ``system`` and ``thinking``, its messages, one instruction, and its prompt read
from the cache the session's own requests wrote.

Skipped while the registry has no Messages format of its own (the summarizer's branch before
the format was merged): the route is the format's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction_proxy.summarizer._prefix import PREFIX_MARKER
from compaction_proxy.wire import format_for_path
from tests.support.messages_bodies import BASH, claude_code_request, claude_code_system
from tests.support.messages_upstream import MESSAGES, MessagesUpstreamServer
from tests.support.servers import ProxyServer, proxy_config, upstream_entry

# The Messages format serves /v1/messages: without it these tests fail, never skip.
assert format_for_path("POST", MESSAGES) is not None, "no wire format serves /v1/messages"

MODEL = "claude-sonnet-4-5"
WINDOW = 16_000
STEPS = 24
SYSTEM = claude_code_system(60, 200)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path / "anthropic.log")
    server.start()
    server.control(model_context_windows={MODEL: WINDOW})
    yield server
    server.stop()


def request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return claude_code_request(
        messages, model=MODEL, max_tokens=2_000, system=SYSTEM, thinking={"type": "adaptive"}
    )


def is_summary_call(body: dict[str, Any]) -> bool:
    last = body["messages"][-1]
    return isinstance(last.get("content"), str) and last["content"].startswith(PREFIX_MARKER)


def test_a_messages_session_is_summarized_in_its_own_cached_form(
    fake: MessagesUpstreamServer, proxy_factory: Any, tmp_path: Path
) -> None:
    proxy: ProxyServer = proxy_factory(
        proxy_config(
            upstream_entry(fake.url + "/v1", name="anthropic"),
            store={"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")},
            models={MODEL: {"context_window": WINDOW, "max_output_tokens": 2_000}},
            summarization={"enabled": True, "prepare": False, "maxSummaryTokens": 600},
            # Summarization alone: with the default pipeline an earlier strategy collapses the
            # stretch's newest steps first, and the call's prefix then leaves the forwarded
            # requests where no cache entry exists (the tail is new content either way).
            compaction={
                "pipeline": [
                    {
                        "strategy": "summarization",
                        "trigger": {"token_ratio": 0.7},
                        "target": {"token_ratio": 0.4},
                        "retain_recent": {"turns": 2},
                    }
                ]
            },
        )
    )
    task = f"fake-loop: steps={STEPS + 5} lines=150 Fix the build. FACT-TASK"
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    headers = {"x-api-key": "sk-ant-caller", "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60) as http:
        for step in range(STEPS):
            answer = http.post(MESSAGES, json=request(messages), headers=headers)
            assert answer.status_code == 200, (step, answer.text)
            content = answer.json()["content"]
            messages.append({"role": "assistant", "content": content})
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": f"ran {b['id']} " * 150}
                for b in content
                if b["type"] == "tool_use"
            ]
            assert results, step
            messages.append({"role": "user", "content": results})

    sent = fake.messages()
    outcomes = [e for e in fake.events() if e.get("path") == MESSAGES]
    assert len(outcomes) == len(sent)  # one outcome per request, in order
    assert all(e["type"] == "answered" for e in outcomes), [e["type"] for e in outcomes]
    summaries = [
        (r.json(), e) for r, e in zip(sent, outcomes, strict=True) if is_summary_call(r.json())
    ]
    assert summaries, "the session must have been summarized"
    for body, outcome in summaries:
        assert body["system"] == SYSTEM and body["tools"] == [BASH]
        assert body["thinking"] == {"type": "adaptive"} and body["stream"] is False
        usage = outcome["usage"]
        whole = (
            usage["input_tokens"]
            + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"]
        )
        assert usage["cache_read_input_tokens"] / whole > 0.8, usage
