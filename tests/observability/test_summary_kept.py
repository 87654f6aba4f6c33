"""Summaries checked, reported (issue 30, item 3): what a stored summary kept of its folded span
on its own reaches the response (``X-Compaction-Summary-Kept``, a contradiction in
``X-Compaction-Warning``), ``/metrics`` (``compaction_proxy_summary_strings_total``,
``compaction_proxy_summary_contradictions_total``) and the dashboard's data.

The app runs in-process (respx plays the upstream and the summarizer); the strategy is the
summarization strategy with its span's items given by hand (tests/support/checked_summaries.py:
the ledger's place), loaded as a plug-in the way an operator's own strategy is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, cast

import httpx
import orjson
import pytest
import respx

from compaction_proxy.api._requests import report_headers
from compaction_proxy.app import ProxyApp
from compaction_proxy.checkpoints import Lookup
from compaction_proxy.compaction import CompactionResult, Mode
from compaction_proxy.compaction.report import CompactionReport, StrategyReport
from compaction_proxy.compaction.strategies.registry import STRATEGIES
from compaction_proxy.compaction.summary_check import SectionCount, SummaryCheck
from compaction_proxy.config import Settings
from compaction_proxy.engine._hit_report import CHECKPOINT_STEP, as_prepared, saved_meta
from compaction_proxy.observability.report_text import render
from tests.observability.traffic import parse_metrics, value
from tests.support.agent_session import is_summarizer_text
from tests.support.checked_summaries import NAME, REFERENCE, RULE, SUMMARY
from tests.support.processes import tiktoken_cache_dir
from tests.unit.test_app import _RespxTransport, in_process

UPSTREAM = "http://up.test/v1"
MODEL = "small-model"
STRINGS = "compaction_proxy_summary_strings_total"
CONTRADICTIONS = "compaction_proxy_summary_contradictions_total"


@pytest.fixture(autouse=True)
def _offline_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", tiktoken_cache_dir())


@pytest.fixture(autouse=True)
def _process_registry_restored() -> Iterator[None]:
    """The app's settings load the plug-in into the process's strategy registry, as a server
    does; the tests after these (tests/compaction/test_registry.py among them) expect it as
    the package leaves it."""
    specs, plugins = dict(STRATEGIES._specs), set(STRATEGIES._plugins)
    yield
    STRATEGIES._specs.clear()
    STRATEGIES._specs.update(specs)
    STRATEGIES._plugins.clear()
    STRATEGIES._plugins.update(plugins)


def completion(text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


def answer(request: httpx.Request) -> httpx.Response:
    if is_summarizer_text(request.content.decode()):
        return httpx.Response(200, json=completion(SUMMARY))
    return httpx.Response(200, json=completion("ok"))


@dataclass
class Proxy:
    app: ProxyApp
    client: httpx.AsyncClient

    async def chat(self, messages: list[dict[str, Any]]) -> httpx.Response:
        response = await self.client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages}
        )
        assert response.status_code == 200, response.text
        return response


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Proxy]]:
    built: list[Proxy] = []

    def build(**summarization: Any) -> Proxy:
        settings = Settings(
            upstreams=[{"name": "up", "base_url": UPSTREAM}],
            models={MODEL: {"context_window": 4000, "max_output_tokens": 500}},
            summarization={"enabled": True, "prepare": False, **summarization},
            store={"backend": "memory"},
            compaction={"plugins": [REFERENCE], "pipeline": [{"strategy": NAME}]},
        )
        mock = respx.MockRouter(assert_all_called=False)
        mock.post(f"{UPSTREAM}/chat/completions").mock(side_effect=answer)
        app = in_process(settings, httpx.AsyncClient(transport=_RespxTransport(mock)))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
        built.append(Proxy(app, client))
        return built[-1]

    yield build
    for proxy in built:
        await proxy.client.aclose()
        await proxy.app.state.transport.aclose()
        await proxy.app.state.store.close()
        proxy.app.state.compactor.close()


@pytest.fixture
def proxy(make: Callable[..., Proxy]) -> Proxy:
    return make()


def conversation(turns: int = 10) -> list[dict[str, Any]]:
    """Over the budget: ten turns of work on src/parser.py, then the newest question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"step {i}: {RULE} " + "x " * 300})
        messages.append({"role": "assistant", "content": f"ran pytest -q on src/parser.py ({i})"})
    messages.append({"role": "user", "content": "what next?"})
    return messages


async def test_a_checked_summary_shows_in_the_headers_metrics_and_dashboard(proxy: Proxy) -> None:
    response = await proxy.chat(conversation())
    assert response.headers["x-compaction-strategies"] == "summarization"
    assert response.headers["x-compaction-summary-kept"] == (
        "1/4 (files 1/2, commands 0/1, rules 0/1)"
    )
    warnings = response.headers.get_list("x-compaction-warning")
    assert f'summary may contradict a rule: "{RULE}"' in warnings

    metrics = parse_metrics((await proxy.client.get("/metrics")).text)
    assert value(metrics, STRINGS, section="files", outcome="kept") == 1
    assert value(metrics, STRINGS, section="files", outcome="missing") == 1
    assert value(metrics, STRINGS, section="commands", outcome="missing") == 1
    assert value(metrics, STRINGS, section="rules", outcome="missing") == 1
    assert value(metrics, CONTRADICTIONS) == 1

    data = orjson.loads((await proxy.client.get("/dashboard/data")).content)
    assert data["summarizer"]["kept"] == {
        "summaries": 1,
        "kept": 1,
        "total": 4,
        "sections": {
            "files": {"kept": 1, "total": 2},
            "commands": {"kept": 0, "total": 1},
            "rules": {"kept": 0, "total": 1},
        },
        "contradictions": 1,
    }

    # The next request continues from the stored checkpoint: it wrote no summary, so it
    # reports none and counts nothing again.
    again = await proxy.chat(conversation())
    assert again.headers["x-compaction-checkpoint"] == "hit"
    assert "x-compaction-summary-kept" not in again.headers
    metrics = parse_metrics((await proxy.client.get("/metrics")).text)
    assert value(metrics, STRINGS, section="files", outcome="kept") == 1
    assert value(metrics, CONTRADICTIONS) == 1


async def test_a_summary_prepared_in_the_background_is_reported_when_it_is_forwarded(
    make: Callable[..., Proxy],
) -> None:
    proxy = make(prepare={"token_ratio": 0.7})
    messages = conversation(8)
    early = await proxy.chat(messages)  # past the prepare threshold, under the trigger
    assert early.headers["x-compaction-prepared"] == "pending"
    assert early.headers["x-compaction-strategies"] == "none"
    assert "x-compaction-summary-kept" not in early.headers
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "y " * 700}]
    response = await proxy.chat(messages)  # the trigger: the prepared summary is used
    assert response.headers["x-compaction-prepared"] == "ready"
    assert response.headers["x-compaction-checkpoint"] == "new"
    assert response.headers["x-compaction-strategies"] == "summarization"
    assert response.headers["x-compaction-summary-kept"] == (
        "1/4 (files 1/2, commands 0/1, rules 0/1)"
    )
    assert f'summary may contradict a rule: "{RULE}"' in (
        response.headers.get_list("x-compaction-warning")
    )
    metrics = parse_metrics((await proxy.client.get("/metrics")).text)
    assert value(metrics, STRINGS, section="files", outcome="kept") == 1
    assert value(metrics, CONTRADICTIONS) == 1


async def test_a_request_that_writes_no_summary_says_nothing_of_one(proxy: Proxy) -> None:
    short = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    response = await proxy.chat(short)
    assert "x-compaction-summary-kept" not in response.headers
    metrics = parse_metrics((await proxy.client.get("/metrics")).text)
    assert value(metrics, CONTRADICTIONS) == 0
    data = orjson.loads((await proxy.client.get("/dashboard/data")).content)
    assert data["summarizer"]["kept"]["summaries"] == 0


def checked_report(*checks: SummaryCheck) -> CompactionReport:
    """A report whose one summarization step wrote summaries with ``checks``."""
    step = StrategyReport("summarization", True, True, 900, 300, summary_checks=checks)
    return CompactionReport(
        model=MODEL,
        mode="normal",
        tokenizer="o200k_base",
        context_window=4000,
        output_reserve=500,
        safety_reserve=0,
        budget=3500,
        calibration=1.0,
        tokens_before=900,
        tokens_after=300,
        messages_before=9,
        messages_after=3,
        strategies=(step,),
    )


def test_two_summaries_of_one_run_are_added_up_in_the_header_and_the_cli_report() -> None:
    first = SummaryCheck((SectionCount("files", 2, 5), SectionCount("rules", 1, 1)))
    second = SummaryCheck((SectionCount("errors", 0, 3), SectionCount("files", 1, 1)))
    report = checked_report(first, second)
    headers = dict(report_headers(CompactionResult([], True, report), Mode.NORMAL))
    assert headers[b"x-compaction-summary-kept"] == b"4/10 (files 3/6, errors 0/3, rules 1/1)"
    assert "summaries kept   4/10 (files 3/6, errors 0/3, rules 1/1)" in render(report)
    none = dict(report_headers(CompactionResult([], True, checked_report()), Mode.NORMAL))
    assert b"x-compaction-summary-kept" not in none


def test_a_prepared_runs_warnings_are_said_by_the_request_that_forwards_it() -> None:
    """What a background run left out (the ledger's share) reached no response: its warnings
    ride in the checkpoint's meta and the request that forwards it says them."""
    check = SummaryCheck((SectionCount("files", 1, 2),), ("Never push to main.",))
    left_out = "ledger: 12 item(s) left out to keep it within 0.25 of the budget"
    prepared = replace(
        checked_report(check),
        warnings=(left_out, 'summary may contradict a rule: "Never push to main."'),
    )
    meta = saved_meta(CompactionResult([], True, prepared), MODEL, None)
    hit = replace(
        checked_report(),
        strategies=(StrategyReport(CHECKPOINT_STEP, True, True, 900, 300),),
    )
    used = cast(Lookup, SimpleNamespace(checkpoint=SimpleNamespace(meta=meta)))
    told = as_prepared(hit, used)
    assert told.warnings == prepared.warnings  # each once, the contradiction not doubled
    assert told.summary_checks == (check,)
    headers = report_headers(CompactionResult([], True, told), Mode.NORMAL)
    assert (b"x-compaction-warning", left_out.encode()) in headers
