"""`compaction-proxy compact` runs the server's own flow, summarizer included.

The command runs as a real subprocess; the fake upstream process plays the summarizer (it
answers summary calls with a checkpoint listing every `FACT-...` it was shown) and records
what it received, so the tests see the call on the wire, with the key it carried.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson

from tests.fakes.upstream import is_summarizer_call
from tests.support.assertions import CHAT_PATH
from tests.support.processes import run_python_module
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config

MODEL = "agent-4k"
SUMMARIZER_KEY = "sk-summarizer-7d3e91"


def conversation() -> list[dict[str, Any]]:
    """Twelve turns, well over a 4k window, with a fact in the oldest turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(12):
        fact = " Remember FACT-orchid." if turn == 0 else ""
        messages.append({"role": "user", "content": f"Step {turn}.{fact} " + "detail " * 400})
        messages.append({"role": "assistant", "content": f"Done with step {turn}."})
    messages.append({"role": "user", "content": "What is next?"})
    return messages


def run_compact(
    tmp_path: Path, upstream: UpstreamServer, *flags: str, **entry: Any
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`compact` on :func:`conversation` with `upstream` as the only upstream (`entry`: extra
    keys of its config entry); returns the process and the written result."""
    config = proxy_config(
        {**upstream_entry(upstream), **entry},
        models={MODEL: {"context_window": 4_000, "max_output_tokens": 500}},
        summarization={"maxSummaryTokens": 300, "retainRecent": {"turns": 2}, "timeout": 20},
    )
    path = write_config(tmp_path / "config.yaml", config)
    source = tmp_path / "conversation.json"
    source.write_bytes(orjson.dumps({"model": MODEL, "messages": conversation()}))
    out = tmp_path / "out.json"
    result = run_python_module(
        "compaction_proxy", "compact", str(source), "--config", str(path), "--out", str(out), *flags
    )
    written = orjson.loads(out.read_bytes()) if out.exists() else None
    return result, written


def summaries(body: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in body["messages"]
        if isinstance(m.get("content"), str) and m["content"].startswith("<summary>")
    ]


def test_compact_calls_the_configured_summarizer(tmp_path: Path, upstream: UpstreamServer) -> None:
    result, written = run_compact(tmp_path, upstream, api_key=SUMMARIZER_KEY)
    assert result.returncode == 0, result.stderr
    assert written is not None
    (summary,) = summaries(written)
    assert "FACT-orchid" in summary  # the oldest turn reached the summarizer and came back
    assert written["messages"][0] == conversation()[0]
    assert written["messages"][-1] == conversation()[-1]
    calls = upstream.requests(CHAT_PATH)
    assert calls  # one per transcript chunk that fits the summarizer's 4k window
    for call in calls:
        assert is_summarizer_call(call.json())
        assert call.headers["authorization"] == f"Bearer {SUMMARIZER_KEY}"
    assert "summarization" in result.stdout and "summarized" in result.stdout
    assert f"summarizer: fake/{MODEL}: ok" in result.stdout
    assert SUMMARIZER_KEY not in result.stdout + result.stderr


def test_no_summarize_makes_no_call_and_still_fits(
    tmp_path: Path, upstream: UpstreamServer
) -> None:
    result, written = run_compact(tmp_path, upstream, "--no-summarize", api_key=SUMMARIZER_KEY)
    assert result.returncode == 0, result.stderr
    assert upstream.requests() == []
    assert written is not None and summaries(written) == []
    assert "summarizer not available" in result.stdout
    assert "truncation" in result.stdout
    assert written["messages"][-1] == conversation()[-1]
    assert len(written["messages"]) < len(conversation())


def test_an_upstream_without_a_key_is_not_called(tmp_path: Path, upstream: UpstreamServer) -> None:
    result, written = run_compact(tmp_path, upstream)
    assert result.returncode == 0, result.stderr
    assert upstream.requests() == []
    assert "summarizer: not called: upstream 'fake' has no api_key" in result.stdout
    assert written is not None and summaries(written) == []


def test_a_keyless_upstream_is_called_without_authorization(
    tmp_path: Path, upstream: UpstreamServer
) -> None:
    result, written = run_compact(tmp_path, upstream, keyless=True)
    assert result.returncode == 0, result.stderr
    assert written is not None and len(summaries(written)) == 1
    calls = upstream.requests(CHAT_PATH)
    assert calls and all("authorization" not in call.headers for call in calls)
