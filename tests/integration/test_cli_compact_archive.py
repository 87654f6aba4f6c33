"""`compaction-proxy compact` prints what a compaction archived (``compaction.recall``).

The command runs as a real subprocess on an agent session far over its 4k window. With recall
on (the configuration's ``compaction.recall.enabled``, or ``--archive`` for one run) it lists
every recall id the compaction archived, oldest first, with the original's role, tool and
tokens, and the written request carries the marks naming them; without, it prints nothing of
the kind. No content is printed: ids, roles, tool names and counts only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import orjson

from tests.support.processes import run_python_module
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config

MODEL = "agent-4k"
SECRET = "PLUM-LANTERN-42"
LINE = re.compile(r"^  (r[a-z2-7]{11})  (\w+)\s+(.*?)\s+([\d,]+) tokens$")


def session() -> list[dict[str, Any]]:
    """A task, then twelve read_file steps of about 400 tokens each, a secret in the middle of
    the first (which a collapse cuts to its head and tail)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "fix the build"},
    ]
    for step in range(12):
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "src/m{step}.py"}}'},
        }
        middle = SECRET if step == 0 else "more"
        text = f"module {step} " + "code " * 200 + middle + " code" * 200
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{step}", "content": text})
    return messages


def run_compact(
    tmp_path: Path, upstream: UpstreamServer, *flags: str, recall: bool = False
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    config = proxy_config(
        upstream_entry(upstream),
        models={MODEL: {"context_window": 4_000, "max_output_tokens": 500}},
        compaction={"recall": {"enabled": recall}},
    )
    path = write_config(tmp_path / "config.yaml", config)
    source = tmp_path / "session.json"
    source.write_bytes(orjson.dumps({"model": MODEL, "messages": session()}))
    out = tmp_path / "out.json"
    result = run_python_module(
        "compaction_proxy", "compact", str(source), "--config", str(path), "--out", str(out),
        "--no-summarize", *flags,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result, orjson.loads(out.read_bytes())


def archived_lines(stdout: str) -> list[tuple[str, str, str, int]]:
    section = stdout.split("archived (recall):", 1)[1]
    found = [LINE.match(line) for line in section.splitlines()]
    return [(m[1], m[2], m[3], int(m[4].replace(",", ""))) for m in found if m is not None]


def test_recall_on_prints_every_archived_original(tmp_path: Path, upstream: UpstreamServer) -> None:
    result, written = run_compact(tmp_path, upstream, recall=True)
    assert "archived (recall): " in result.stdout
    lines = archived_lines(result.stdout)
    assert lines
    forwarded = orjson.dumps(written["messages"]).decode()
    for _, role, tool, tokens in lines:
        assert role in ("tool", "assistant")
        assert tool == ("read_file" if role == "tool" else "calls read_file")
        assert tokens > 0
    results = [line for line in lines if line[1] == "tool"]
    assert results and all(line[3] > 300 for line in results)  # the originals, not the stubs
    # what went away is named in the forwarded request (a placeholder's or a summary's mark)
    # or dropped whole; at least the placeholders name their originals
    named = set(re.findall(r"recall id ([rs][a-z2-7]{11})\]", forwarded))
    assert named and named <= {line[0] for line in lines} | set(
        re.findall(r"^  (s[a-z2-7]{11})", result.stdout, re.MULTILINE)
    )
    assert SECRET not in result.stdout  # content never printed
    assert SECRET not in forwarded  # cut from the first result (archived: the model may ask)
    assert upstream.requests() == []


def test_archive_turns_recall_on_for_one_run(tmp_path: Path, upstream: UpstreamServer) -> None:
    plain, plain_written = run_compact(tmp_path, upstream)
    assert "archived (recall)" not in plain.stdout
    assert "recall id" not in orjson.dumps(plain_written).decode()
    flagged, written = run_compact(tmp_path, upstream, "--archive")
    assert archived_lines(flagged.stdout)
    assert "recall id" in orjson.dumps(written).decode()
