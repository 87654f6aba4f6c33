"""Claude as the summarizer of a chat conversation, through real processes: the proxy under
``serve``, the chat fake upstream (which enforces an 8k window and records what it got) and the
fake Anthropic upstream (tests/fakes/messages), named by ``summarization.provider`` with
``api: messages``.

The summary is written by the Messages upstream, asked in its own form (``POST /v1/messages``,
the operator's key as ``x-api-key``, ``anthropic-version``), and the checkpoint it wrote reaches
the chat model.

Run as a module (``python -m tests.integration.test_messages_summarizer serve ...``) it is the
proxy's launcher: until the Messages wire format is in the registry, it registers a stand-in
with the ``messages`` API label (tests/support/messages_view.py), then runs the CLI in the same
process; once the real format is registered, it only runs the CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction_proxy.summarizer import CHECKPOINT_PROMPT
from tests.support.agent_session import (
    CHAT,
    count_summarizer_calls,
    forwarded_requests,
)
from tests.support.messages_upstream import MessagesUpstreamServer
from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config

WINDOW = 8_000
MODEL = "agent-8k"
SUMMARIZER = "claude-sonnet-4-5"
OPERATOR_KEY = "sk-ant-operator-7c2e"
CALLER_KEY = "sk-caller-chat-91d0"


class LaunchedProxy(ServerProcess):
    """The proxy, started by this module (so a ``messages`` API is registered in it)."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        super().__init__(
            "messages-summarizer-proxy",
            lambda port: python_module_argv(
                __name__,
                "serve",
                "--config",
                str(config_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ),
            log_path,
            ready_path="/healthz",
            ready_status=200,
        )


@pytest.fixture(scope="module")
def anthropic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("anthropic") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def chat_upstream(upstream_factory: Any) -> UpstreamServer:
    server: UpstreamServer = upstream_factory(WINDOW)
    return server


def conversation(tag: str, steps: int = 12) -> list[dict[str, Any]]:
    """A chat agent conversation well past the trigger, with a fact the summary must carry."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Task {tag}: remember FACT-{tag}."},
    ]
    for step in range(steps):
        call = {
            "id": f"c{tag}{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        found = f" FACT-{tag}{step}" if step == 1 else ""  # in a step the summary folds
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": f"{tag} {step}{found} " + "z " * 700,
            }
        )
        if step % 4 == 3:
            messages.append({"role": "user", "content": f"Continue {tag} {step}."})
    return messages


def test_a_messages_provider_writes_the_checkpoint_of_a_chat_request(
    chat_upstream: UpstreamServer, anthropic: MessagesUpstreamServer, tmp_path: Path
) -> None:
    anthropic.reset()
    config = proxy_config(
        upstream_entry(chat_upstream),
        {
            **upstream_entry(
                f"{anthropic.url}/v1", name="anthropic", api_key=OPERATOR_KEY, models=[]
            ),
            "api": "messages",
        },
        # The proxy spends the operator's Anthropic key for whoever reaches it (a test box).
        allow_anonymous_spend=True,
        models={MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(tmp_path / "checkpoints.db")},
        summarization={
            "enabled": True,
            "provider": "Anthropic",
            "model": SUMMARIZER,
            "maxSummaryTokens": 800,
            "retainRecent": {"turns": 2},
            "timeout": 20,
            "prepare": False,
        },
    )
    proxy = LaunchedProxy(write_config(tmp_path / "proxy.yaml", config), tmp_path / "proxy.log")
    proxy.start()
    try:
        with httpx.Client(base_url=proxy.url, trust_env=False, timeout=60) as http:
            answer = http.post(
                CHAT,
                json={"model": MODEL, "messages": conversation("KIWI")},
                headers={"authorization": f"Bearer {CALLER_KEY}"},
            )
    finally:
        proxy.stop()
    assert answer.status_code == 200, answer.text
    assert "summarization" in answer.headers["x-compaction-strategies"]
    assert "x-compaction-warning" not in answer.headers

    # Asked in the Messages API's own form, on the operator's key
    [asked] = anthropic.messages()
    assert asked.headers["x-api-key"] == OPERATOR_KEY
    assert asked.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in asked.headers
    assert CALLER_KEY not in asked.text  # the caller's key was for the chat upstream only
    body = asked.json()
    assert body["model"] == SUMMARIZER
    assert body["stream"] is False and body["max_tokens"] == 800
    assert CHECKPOINT_PROMPT in body["system"]
    [turn] = body["messages"]
    assert turn["role"] == "user"
    assert turn["content"][0]["text"].startswith("<conversation>")
    assert "FACT-KIWI1" in turn["content"][0]["text"]
    answered = [e for e in anthropic.events() if e.get("type") == "answered"]
    assert len(answered) == 1, anthropic.events()

    # ... and what it wrote is the checkpoint the chat model got
    assert count_summarizer_calls(chat_upstream) == 0
    [forwarded] = forwarded_requests(chat_upstream)
    summaries = [
        m["content"]
        for m in forwarded["messages"]
        if isinstance(m.get("content"), str) and "<summary>" in m["content"]
    ]
    assert len(summaries) == 1
    assert "- FACT-KIWI1" in summaries[0]  # the Messages fake's summary lists what it read
    assert chat_upstream.last_request(CHAT).headers["authorization"] == f"Bearer {CALLER_KEY}"


if __name__ == "__main__":
    from compaction_proxy.cli import main
    from tests.support.messages_view import ensure_messages_api

    ensure_messages_api()
    sys.exit(main(sys.argv[1:]))
