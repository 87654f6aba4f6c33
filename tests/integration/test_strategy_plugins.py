"""A strategy of the user's own, from YAML, through real processes.

The user writes a module with a parameter model, a strategy and ``register(registry)``
(tests/support/plugin_strategy.py), lists it in ``compaction.plugins`` and names the strategy in
``compaction.pipeline`` and in a ``models.<pattern>.compaction`` block.  ``compaction-proxy
serve --config`` runs it: the fake upstream receives the stamped results, the response header
names the strategy.  ``check-config`` prints the entry with the plug-in's own keys and refuses a
bad one with its key path, the allowed keys and the known names; a plug-in that fails to load
stops ``serve`` before it listens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.assertions import CHAT_PATH
from tests.support.plugin_strategy import BROKEN, DEFAULT_STAMP, NAME, REFERENCE
from tests.support.processes import run_python_module
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

MODEL = "plugged-model"
OTHER = "plugged-other"
RESULTS = {"c1": "first " * 200, "c2": "second " * 200, "c3": "third " * 200}


def config(upstream: UpstreamServer | str, **compaction: Any) -> dict[str, Any]:
    """The plug-in and its strategy; ``min_saving: 0``: the stamps save a few hundred tokens of
    a 128k window, which the default minimum would undo."""
    other = {"strategy": NAME, "stamp": "[B]", "keep": 0}
    return proxy_config(
        upstream_entry(upstream),
        compaction={
            "plugins": [REFERENCE],
            "min_saving": 0,
            "pipeline": [{"strategy": NAME, "keep": 1}],
            **compaction,
        },
        # Validated before `compaction`: the plug-in is loaded first all the same.
        models={OTHER: {"compaction": {"min_saving": 0, "pipeline": [other]}}},
    )


def conversation() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a build agent."},
        {"role": "user", "content": "Build the project."},
    ]
    for call_id, result in RESULTS.items():
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "run", "arguments": "{}"},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return messages


def tool_contents(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return run_python_module("compaction_proxy", "check-config", str(path))


def test_serve_runs_a_plugin_strategy_named_in_the_yaml(
    proxy_factory: Any, upstream: UpstreamServer
) -> None:
    proxy = proxy_factory(config(upstream))
    client = proxy.openai_client()

    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=conversation())
    assert raw.headers["x-compaction-strategies"] == NAME
    forwarded = tool_contents(upstream.last_request(CHAT_PATH).json()["messages"])
    # keep: 1 spares c2; c3 is the newest step, which no strategy may touch
    assert forwarded == {"c1": DEFAULT_STAMP, "c2": RESULTS["c2"], "c3": RESULTS["c3"]}

    upstream.clear()
    raw = client.chat.completions.with_raw_response.create(model=OTHER, messages=conversation())
    assert raw.headers["x-compaction-strategies"] == NAME
    forwarded = tool_contents(upstream.last_request(CHAT_PATH).json()["messages"])
    assert forwarded == {"c1": "[B]", "c2": "[B]", "c3": RESULTS["c3"]}


def test_check_config_prints_the_entry_with_the_plugins_own_keys(tmp_path: Path) -> None:
    result = check_config(write_config(tmp_path / "ok.yaml", config("http://127.0.0.1:9/v1")))
    assert result.returncode == 0, result.stderr
    compaction = yaml.safe_load(result.stdout)["compaction"]
    assert compaction["plugins"] == [REFERENCE]
    (entry,) = compaction["pipeline"]
    assert {k: v for k, v in entry.items() if v is not None} == {
        "strategy": NAME,
        "stamp": DEFAULT_STAMP,
        "keep": 1,
    }


def test_check_config_refuses_a_bad_entry_with_its_path(tmp_path: Path) -> None:
    pipeline = [
        {"strategy": NAME, "keep": -1, "stamps": "x"},
        {"strategy": "stamp_old_result"},
    ]
    text = config("http://127.0.0.1:9/v1", pipeline=pipeline)
    result = check_config(write_config(tmp_path / "bad.yaml", text))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert (
        "  compaction.pipeline.0.keep: Input should be greater than or equal to 0 (got -1)" in lines
    )
    assert (
        "  compaction.pipeline.0.stamps: unknown key; allowed here: keep, minimum_preserved, "
        "stamp, strategy, target, trigger"
    ) in lines
    (unknown,) = [line for line in lines if line.startswith("  compaction.pipeline.1.strategy: ")]
    assert "unknown strategy 'stamp_old_result'; known: context_pruning, " in unknown
    assert f", pipeline, {NAME} (" in unknown


def test_serve_stops_before_listening_when_a_plugin_fails(tmp_path: Path) -> None:
    text = config("http://127.0.0.1:9/v1", plugins=[BROKEN])
    path = write_config(tmp_path / "broken.yaml", text)
    result = run_python_module("compaction_proxy", "serve", "--config", str(path), "--port", "9")
    assert result.returncode == 2
    assert (
        f"  compaction.plugins.0: {BROKEN} failed: RuntimeError: the plug-in could not reach its "
        f"licence server (got '{BROKEN}')"
    ) in result.stderr.splitlines()
