"""The edge's compactor runs the core with ``compaction.recall.enabled`` of the request's model:
a model's own ``compaction`` block wins over the top-level one, as for every other key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.archive import RecallIds
from compaction_proxy.compaction.marks import message_mark
from compaction_proxy.config import Settings
from compaction_proxy.engine import Compactor
from tests.support.processes import tiktoken_cache_dir

IDS = RecallIds(b"test-archive-namespace-key")


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


MODELS = {
    "plain": {"context_window": 4000, "max_output_tokens": 500},
    "archiving": {
        "context_window": 4000,
        "max_output_tokens": 500,
        "compaction": {"recall": {"enabled": True}},
    },
    "opted-out": {
        "context_window": 4000,
        "max_output_tokens": 500,
        "compaction": {"recall": {"enabled": False}},
    },
}


def compactor_with(recall: bool) -> Compactor:
    return Compactor(
        Settings(
            upstreams=[{"name": "up", "base_url": "http://up.test/v1"}],
            models=MODELS,
            compaction={"recall": {"enabled": recall}},
        )
    )


@pytest.fixture
def compactors() -> Iterator[dict[bool, Compactor]]:
    made = {recall: compactor_with(recall) for recall in (False, True)}
    yield made
    for compactor in made.values():
        compactor.close()


def agent_body(model: str) -> dict[str, Any]:
    """Twenty tool steps of about 300 tokens each: far over a 4k window."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "fix the build"},
    ]
    for i in range(20):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = " ".join(f"line{i}_{j}" for j in range(150))
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
    return {"model": model, "messages": messages}


@pytest.mark.parametrize(
    ("top_level", "model", "archives"),
    [
        (False, "plain", False),
        (False, "archiving", True),  # the model's block turns it on
        (True, "plain", True),
        (True, "opted-out", False),  # the model's block turns it off
    ],
)
def test_recall_follows_the_models_compaction_block(
    compactors: dict[bool, Compactor], top_level: bool, model: str, archives: bool
) -> None:
    body = agent_body(model)
    result = compactors[top_level].run_sync(body, Mode.NORMAL, IDS)
    assert result.changed
    marked = [m for m in result.messages if message_mark(m) is not None]
    if not archives:
        assert result.archived is None and not marked
        return
    assert result.archived is not None and marked
    gone = [m for m in body["messages"] if not any(o is m for o in result.messages)]
    assert {IDS.original(m) for m in gone} <= set(result.archived.originals)
