"""The compaction core as the HTTP edge uses it: modes, headers, preview, failures, CLI.

The app runs in-process behind httpx's ASGI transport; respx plays the upstream and records
exactly which bytes went out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx

from compaction_proxy.app import ProxyApp
from compaction_proxy.cli import main
from compaction_proxy.config import Settings
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

UPSTREAM = "http://up.test/v1"
SECRET_WORD = "zebra-marmalade"


def _encodings_dir() -> str:
    return tiktoken_cache_dir()  # the runtime package's files, in tiktoken's cache layout


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", _encodings_dir())


def conversation(turns: int, size: int = 400) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} {SECRET_WORD} " + "x " * size})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "the newest question"})
    return messages


def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "small-model", "messages": messages, "temperature": 0.2, **extra}


COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "small-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
}


class Proxy:
    def __init__(self, app: ProxyApp, mock: respx.MockRouter, client: httpx.AsyncClient) -> None:
        self.app = app
        self.mock = mock
        self.route = mock.post(f"{UPSTREAM}/chat/completions").respond(200, json=COMPLETION)
        self.client = client

    @property
    def sent(self) -> httpx.Request:
        return self.route.calls.last.request

    async def chat(self, payload: Any, **headers: str) -> httpx.Response:
        raw = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        return await self.client.post("/v1/chat/completions", content=raw, headers=headers)


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    settings = Settings(
        upstreams=[{"name": "up", "base_url": UPSTREAM}],
        models={"small-model": {"context_window": 4000, "max_output_tokens": 500}},
    )
    mock = respx.MockRouter(assert_all_called=False)
    app = in_process(settings, httpx.AsyncClient(transport=_RespxTransport(mock)))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    yield Proxy(app, mock, client)
    await client.aclose()
    await app.state.transport.aclose()
    app.state.compactor.close()


async def test_small_request_goes_upstream_byte_identical(proxy: Proxy) -> None:
    raw = b'{"model": "small-model",  "messages": [{"role":"user","content":"hi \\u00e9"}], "x": 1}'
    response = await proxy.chat(raw)
    assert response.status_code == 200
    assert proxy.sent.content == raw
    assert response.headers["x-compaction-strategies"] == "none"
    assert (
        response.headers["x-compaction-tokens-before"]
        == response.headers["x-compaction-tokens-after"]
    )


async def test_large_request_is_compacted_under_budget(proxy: Proxy) -> None:
    messages = conversation(turns=30)
    response = await proxy.chat(body(messages, unknown_field={"keep": True}))
    assert response.status_code == 200
    sent = orjson.loads(proxy.sent.content)
    before = int(response.headers["x-compaction-tokens-before"])
    after = int(response.headers["x-compaction-tokens-after"])
    assert before > 4000 > after
    assert response.headers["x-compaction-strategies"] != "none"
    assert response.headers["x-compaction-checkpoint"] == "new"
    assert len(sent["messages"]) < len(messages)
    assert sent["messages"][0] == messages[0]  # system kept
    assert sent["messages"][-1] == messages[-1]  # newest turn kept
    assert sent["temperature"] == 0.2 and sent["unknown_field"] == {"keep": True}


async def test_off_forwards_the_original_without_a_report(proxy: Proxy) -> None:
    raw = orjson.dumps(body(conversation(turns=30)))
    response = await proxy.chat(raw, **{"X-Compaction": "off"})
    assert proxy.sent.content == raw
    assert "x-compaction-tokens-before" not in response.headers


async def test_dry_run_forwards_the_original_and_reports_what_would_happen(proxy: Proxy) -> None:
    raw = orjson.dumps(body(conversation(turns=30)))
    response = await proxy.chat(raw, **{"X-Compaction": "dry-run"})
    assert proxy.sent.content == raw
    assert response.headers["x-compaction-dry-run"] == "true"
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )


async def test_force_compacts_a_request_under_the_trigger(proxy: Proxy) -> None:
    messages = conversation(turns=4)
    normal = await proxy.chat(body(messages))
    assert normal.headers["x-compaction-strategies"] == "none"
    forced = await proxy.chat(body(messages), **{"X-Compaction": "force"})
    assert forced.headers["x-compaction-strategies"] != "none"
    assert len(orjson.loads(proxy.sent.content)["messages"]) < len(messages)


async def test_bad_mode_header_is_a_400(proxy: Proxy) -> None:
    response = await proxy.chat(body(conversation(1)), **{"X-Compaction": "sometimes"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Compaction"
    assert not proxy.route.called


async def test_unknown_role_is_a_400_naming_the_message(proxy: Proxy) -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]
    response = await proxy.chat(body(messages))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages[1].role" and "robot" in error["message"]
    assert not proxy.route.called


async def test_a_compaction_failure_forwards_the_original(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(proxy.app.state.compactor, "run", explode)
    raw = orjson.dumps(body(conversation(turns=30)))
    response = await proxy.chat(raw)
    assert response.status_code == 200
    assert proxy.sent.content == raw
    assert "compaction failed" in response.headers["x-compaction-warning"]


async def test_preview_returns_the_compacted_request_and_forwards_nothing(proxy: Proxy) -> None:
    messages = conversation(turns=30)
    response = await proxy.client.post("/v1/compaction/preview", json=body(messages))
    assert response.status_code == 200
    data = response.json()
    assert data["changed"] is True
    assert len(data["request"]["messages"]) < len(messages)
    assert data["request"]["temperature"] == 0.2
    assert data["report"]["tokens_after"] < data["report"]["tokens_before"]
    assert data["report"]["budget"]["context_window"] == 4000
    # The request itself is not forwarded; the only upstream call is the summarizer's.
    assert proxy.route.calls, "the summarizer runs, as it would for the real request"
    assert all(b"<conversation>" in call.request.content for call in proxy.route.calls)


async def test_preview_with_off_returns_the_request_untouched(proxy: Proxy) -> None:
    payload = body(conversation(turns=30))
    response = await proxy.client.post(
        "/v1/compaction/preview", json=payload, headers={"X-Compaction": "off"}
    )
    assert response.json() == {"changed": False, "request": payload, "report": None}


async def test_preview_rejects_a_bad_body(proxy: Proxy) -> None:
    response = await proxy.client.post("/v1/compaction/preview", content=b"[1, 2]")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


async def test_debug_logging_has_decisions_but_no_content(
    proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    proxy.app.state.compactor.debug = True
    with caplog.at_level(logging.DEBUG, logger="compaction_proxy.compaction"):
        await proxy.chat(body(conversation(turns=30)))
    decisions = [r for r in caplog.records if r.getMessage() == "compaction decision"]
    assert len(decisions) == 1
    record = decisions[0]
    assert record.report["budget"]["context_window"] == 4000  # type: ignore[attr-defined]
    assert len(record.groups) == 62  # type: ignore[attr-defined]
    text = repr(vars(record))
    assert SECRET_WORD not in text and "newest question" not in text


def test_cli_compact_prints_the_report_and_writes_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", _encodings_dir())
    config = tmp_path / "c.yaml"
    config.write_text("models:\n  small-model: {context_window: 4000, max_output_tokens: 500}\n")
    source = tmp_path / "conv.json"
    source.write_bytes(orjson.dumps(body(conversation(turns=30))))
    out = tmp_path / "out.json"
    code = main(["compact", str(source), "--config", str(config), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "budget" in printed and "truncation" in printed and "% saved" in printed
    written = orjson.loads(out.read_bytes())
    assert len(written["messages"]) < 62


def test_cli_compact_accepts_a_bare_message_list_and_a_model_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "msgs.json"
    source.write_bytes(orjson.dumps(conversation(turns=2)))
    assert main(["compact", str(source), "--model", "gpt-4o"]) == 0
    printed = capsys.readouterr().out
    assert "gpt-4o" in printed and "128,000" in printed and "unchanged" in printed


def test_cli_compact_rejects_a_file_that_is_not_a_conversation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "bad.json"
    source.write_text('{"hello": 1}')
    assert main(["compact", str(source)]) == 2
    assert "list of messages" in capsys.readouterr().err


def test_calibration_from_upstream_usage_moves_the_trigger(tmp_path: Path) -> None:
    """An upstream that counts twice what tiktoken says (a non-OpenAI model behind an
    OpenAI-compatible API): once learnt, a request at ~55% of the raw budget is compacted."""
    from compaction_proxy.compaction import Mode
    from compaction_proxy.engine import Compactor

    settings = Settings(
        upstreams=[{"name": "up", "base_url": UPSTREAM}],
        models={"small-model": {"context_window": 4000, "max_output_tokens": 500}},
    )
    compactor = Compactor(settings)
    payload = body(conversation(turns=4))
    before = compactor.run_sync(payload, Mode.NORMAL)
    assert not before.changed
    assert before.report.calibration == 1.0
    for _ in range(20):
        compactor.calibrate(
            "small-model",
            reported=2 * before.report.tokens_before,
            counted=before.report.tokens_before,
        )
    after = compactor.run_sync(payload, Mode.NORMAL)
    assert after.report.calibration > 1.9
    assert after.changed
    # Bounded: a wild ratio is clamped to compaction.calibration.max_ratio.
    compactor.calibrate("other", reported=10_000_000, counted=5_000)
    assert compactor.calibration_for("other").effective == 2.0
    compactor.close()


def test_missing_encodings_are_fetched_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no files on disk (here: a broken install, the runtime package's files gone) the
    proxy estimates at once and fetches the encodings on a daemon thread; requests never wait
    for the network."""
    import shutil

    import tiktoken

    from compaction_proxy.compaction import encodings
    from compaction_proxy.engine import Compactor

    monkeypatch.setattr(encodings, "BUNDLED_PACKAGE", "no_such_package_with_encodings")
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    fetched: list[str] = []

    def fake_download(name: str) -> None:  # stands in for tiktoken's network fetch
        fetched.append(name)
        for file in Path(_encodings_dir()).iterdir():
            if file.is_file():
                shutil.copy(file, cache / file.name)

    monkeypatch.setattr(tiktoken, "get_encoding", fake_download)
    compactor = Compactor(Settings(upstreams=[{"name": "up", "base_url": UPSTREAM}]))
    thread = compactor.warm_up()
    assert thread is not None and thread.daemon
    thread.join(timeout=30)
    assert sorted(fetched) == ["cl100k_base", "o200k_base"]
    assert compactor.tokenizers.get("o200k_base").name == "o200k_base"
    assert not compactor.tokenizers.missing_encodings
    compactor.close()

    no_download = Compactor(
        Settings(
            upstreams=[{"name": "up", "base_url": UPSTREAM}],
            compaction={"tokenizer": {"download": False}},
        )
    )
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert no_download.warm_up() is None
    no_download.close()
