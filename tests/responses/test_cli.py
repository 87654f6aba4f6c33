"""``compaction-proxy compact`` takes a Responses body too and writes one back."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from compaction_proxy.cli import main
from tests.fakes.upstream import SUMMARIZER_PREFIX_MARKER, is_summarizer_call
from tests.support.assertions import CHAT_PATH
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config


def write_body(path: Path, **extra: object) -> list[dict[str, object]]:
    items: list[dict[str, object]] = [{"role": "user", "content": "fix the parser"}]
    for n in range(8):
        items += [
            {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "e" * 40},
            {"type": "function_call", "call_id": f"c{n}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"hit {n} " * 300},
        ]
    path.write_bytes(orjson.dumps({"model": "small", "input": items, "store": False, **extra}))
    return items


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    settings = {"models": {"small": {"context_window": 4_000, "max_output_tokens": 500}}}
    path.write_text(yaml.safe_dump(settings))
    return path


def test_a_responses_file_is_compacted_into_a_responses_body(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "request.json", tmp_path / "out.json"
    items = write_body(source)
    code = main(["compact", str(source), "--config", str(config), "--no-summarize", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    written = orjson.loads(out.read_bytes())
    assert written["store"] is False and "messages" not in written
    compacted = written["input"]
    assert compacted[0] == items[0] and compacted[-3:] == items[-3:]  # task and newest step
    assert len(orjson.dumps(compacted)) < len(orjson.dumps(items)) // 2
    calls = [i["call_id"] for i in compacted if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in compacted if i.get("type") == "function_call_output"]
    assert calls == outputs
    assert "tokens" in capsys.readouterr().out


def test_a_file_that_continues_server_side_state_is_refused(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "request.json"
    write_body(source, previous_response_id="resp_1")
    assert main(["compact", str(source), "--config", str(config), "--no-summarize"]) == 2
    assert "previous_response_id" in capsys.readouterr().err


def test_a_responses_file_is_summarized_in_transcript_form(
    tmp_path: Path, upstream: UpstreamServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on the route: the summarizer is the request's own upstream and model, yet it gets
    the transcript, not the chat-shaped view of the items as a cache-aligned prefix."""
    items: list[dict[str, object]] = [{"role": "user", "content": "fix the parser"}]
    for n in range(10):
        items += [
            {"type": "function_call", "call_id": f"c{n}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"hit {n} " * 300},
            {"role": "assistant", "content": f"Step {n} done; searching on."},
        ]
    source = tmp_path / "request.json"
    source.write_bytes(orjson.dumps({"model": "mid", "input": items}))
    config = write_config(
        tmp_path / "config.yaml",
        proxy_config(
            upstream_entry(upstream, api_key="sk-cli-summarizer"),
            models={"mid": {"context_window": 16_000, "max_output_tokens": 500}},
            summarization={"maxSummaryTokens": 300, "retainRecent": {"turns": 2}},
        ),
    )
    assert main(["compact", str(source), "--config", str(config), "--force"]) == 0
    assert "summarization" in capsys.readouterr().out
    calls = upstream.requests(CHAT_PATH)
    assert calls
    for call in calls:
        assert is_summarizer_call(call.json())
        assert SUMMARIZER_PREFIX_MARKER not in call.text
        assert [m["role"] for m in call.json()["messages"]] == ["system", "user"]
