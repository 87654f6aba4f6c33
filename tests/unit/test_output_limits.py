"""The output limit as the edge sees it: each wire format's field, the per-model settings, and the
checkpoint fingerprint (compaction_proxy/wire/format.py ``output_limits``,
compaction_proxy/engine/_compactor.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx
import yaml

from compaction_proxy.cli import main
from compaction_proxy.compaction import Mode
from compaction_proxy.compaction.budget import asked_output
from compaction_proxy.config import Settings
from compaction_proxy.engine import Compactor
from compaction_proxy.wire import WireFormat
from compaction_proxy.wire.registry import FORMATS
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

ASKED = 32_000

# One small body per registered format, its output limit left out (the test sets it).
SAMPLES: dict[str, dict[str, Any]] = {
    "chat_completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": [{"role": "user", "content": "hi"}]},
    "messages": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


def _compactor(**settings: Any) -> Compactor:
    return Compactor(
        Settings(upstreams=[{"name": "up", "base_url": "http://up.test/v1"}], **settings)
    )


@pytest.fixture
def compactor() -> Iterator[Compactor]:
    made = _compactor()
    yield made
    made.close()


@pytest.mark.parametrize("wire", FORMATS, ids=lambda f: f.name)
def test_each_formats_output_limit_is_what_the_core_budgets_for(
    wire: WireFormat, compactor: Compactor
) -> None:
    """The field a format names first is the one its lift shows the core: a limit lowered in
    the core is then written back into the field the client asked it in."""
    assert wire.name in SAMPLES, f"add a sample {wire.name} body to SAMPLES"
    assert wire.output_limits, f"{wire.name} names no output limit"
    for field in wire.output_limits:
        body = {**SAMPLES[wire.name], field: ASKED}
        request = compactor._request(wire.lift(body).chat, Mode.NORMAL)
        assert asked_output(request.max_completion_tokens, request.max_tokens) == ASKED, field
    unset = compactor._request(wire.lift(dict(SAMPLES[wire.name])).chat, Mode.NORMAL)
    assert asked_output(unset.max_completion_tokens, unset.max_tokens) is None


def test_the_compaction_block_sets_the_run_and_a_models_entry_wins() -> None:
    made = _compactor(
        compaction={"output_reserve_share": 0.4, "lower_output_limit": False},
        models={
            "local-*": {"context_window": 32_768, "output_reserve_share": 0.1},
            "strict-*": {"context_window": 32_768, "lower_output_limit": True},
            "own-*": {"context_window": 32_768, "compaction": {"output_reserve_share": 0.5}},
        },
    )
    try:

        def budget(model: str) -> Any:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            return made.run_sync({**body, "max_tokens": ASKED}, Mode.DRY_RUN).report

        local, strict, own = budget("local-qwen"), budget("strict-vllm"), budget("own-x")
        assert local.output_reserve == 3_276  # the model's 0.1
        assert strict.output_reserve == 13_107  # the block's 0.4
        assert own.output_reserve == 16_384  # the model's own compaction block
        assert local.output_limit is not None and not local.output_limit.lowered  # block: off
        assert strict.output_limit is not None and strict.output_limit.lowered  # model: on
        assert own.output_limit is not None and own.output_limit.lowered  # its block's default
        assert made.output_reserve({"model": "local-qwen", "max_tokens": ASKED}) == 3_276
    finally:
        made.close()


def test_the_share_shapes_checkpoints_and_the_lowering_switch_does_not() -> None:
    def fingerprint(**compaction: Any) -> str:
        made = _compactor(compaction=compaction)
        try:
            return made.fingerprint("gpt-4o")
        finally:
            made.close()

    base = fingerprint()
    assert fingerprint(lower_output_limit=False) == base
    assert fingerprint(output_reserve_share=0.5) != base


def test_per_model_keys_are_validated() -> None:
    with pytest.raises(ValueError, match="output_reserve_share"):
        Settings(
            upstreams=[{"name": "up", "base_url": "http://up.test/v1"}],
            models={"m": {"output_reserve_share": 0}},
        )


# ----------------------------------------------------------------- the preview and `compact`

LOCAL = "local-32k"
CONFIG = {"models": {LOCAL: {"context_window": 32_768}}, "summarization": {"enabled": False}}


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "look " * 2_000}]


@pytest.fixture
async def preview() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(upstreams=[{"name": "up", "base_url": "http://up.test/v1"}], **CONFIG)
    mock = respx.MockRouter(assert_all_called=False)
    app = in_process(settings, httpx.AsyncClient(transport=_RespxTransport(mock)))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    yield client
    await client.aclose()
    await app.state.transport.aclose()
    app.state.compactor.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": LOCAL, "messages": _messages(), "max_tokens": ASKED}, "max_tokens"),
        ({"model": LOCAL, "input": _messages(), "max_output_tokens": ASKED}, "max_output_tokens"),
    ],
    ids=["chat", "responses"],
)
async def test_the_preview_shows_the_limit_that_would_be_forwarded(
    preview: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await preview.post("/v1/compaction/preview", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    limit = data["report"]["output_limit"]
    assert limit["asked"] == ASKED and limit["lowered"] is True
    assert data["changed"] is True  # the messages are as sent; the limit is not
    assert data["request"] == {**body, field: limit["forwarded"]}
    assert response.headers["x-compaction-output-limit"] == str(limit["forwarded"])


def test_compact_prints_and_writes_the_lowered_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    source = tmp_path / "conv.json"
    source.write_bytes(orjson.dumps({"model": LOCAL, "messages": _messages(), "max_tokens": ASKED}))
    out = tmp_path / "out.json"
    assert main(["compact", str(source), "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = orjson.loads(out.read_bytes())
    forwarded = written["max_tokens"]
    assert forwarded < ASKED
    assert f"output limit        32,000 -> {forwarded:,}  (lowered" in printed
    assert "at most output_reserve_share of the window" in printed
    assert written["messages"] == _messages()
