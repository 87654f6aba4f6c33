"""The dashboard in a real headless Chromium after real traffic through the proxy.

The recall panel is shown twice: empty after the traffic (the fake model never calls the recall
tool), and with the figures of tests/observability/recall_requests.py, recorded by a real
``Telemetry`` whose snapshot the browser receives in place of the proxy's data (the page itself,
its script and its CSP, still come from the proxy).

Needs Playwright for Python (the test extra; never `playwright install`) and a Chromium binary:
`CHROMIUM_PATH`, or `chromium` on PATH (Debian's package, installed by scripts/test-deps).
Without one the tests FAIL saying how to install it (tests/support/programs.py), never skip.
`UPDATE_DASHBOARD_SCREENSHOT=1` also writes the screenshot to docs/dashboard.png (the README's
picture).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright import sync_api

from compaction_proxy.compaction.summary_check import SectionCount, SummaryCheck
from compaction_proxy.config import Settings
from compaction_proxy.observability.telemetry import Telemetry
from tests.observability.recall_requests import Request, feed
from tests.observability.test_summary_kept import checked_report
from tests.observability.traffic import Traffic, agent_conversation
from tests.support import programs
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

pytestmark = pytest.mark.external  # Chromium

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]
PROXY_KEY = "cp-dash-key-Hq93"
UPSTREAM_KEY = "sk-upstream-secret-Pw17"
MODEL = "gpt-4o"  # priced by the defaults: the page shows money saved
LOCAL_MODEL = "local-llama-3"  # unknown to the proxy's table and config
LOCAL_WINDOW = 4_096
DASH = "\u2013"  # the page's "no figure" sign, an en dash
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


@pytest.fixture(autouse=True)
def _chromium_is_installed() -> None:
    # Not a skip: a missing browser must fail the run (scripts/test-deps installs chromium).
    programs.chromium()


def compact(n: int) -> str:
    """The page's number format (compact() in dashboard.html)."""
    if abs(n) >= 1e6:
        return f"{n / 1e6:.{0 if abs(n) >= 1e7 else 1}f}M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.{0 if abs(n) >= 1e5 else 1}f}k"
    return f"{n:,}"


@pytest.fixture(scope="module")
def browser_upstream(upstream_factory_module: Any) -> UpstreamServer:
    return upstream_factory_module()


@pytest.fixture(scope="module")
def traffic(
    module_proxy_factory: Any, browser_upstream: UpstreamServer
) -> Iterator[tuple[ProxyServer, Traffic]]:
    """An agent session's worth of traffic: growth, compactions, checkpoint hits, a failing
    summarizer and its back-off, small chats, a stream, an upstream error, pass-through."""
    config = proxy_config(
        upstream_entry(browser_upstream, name="openai", api_key=UPSTREAM_KEY),
        api_keys=[PROXY_KEY],
        models={
            MODEL: {"context_window": 8_000, "max_output_tokens": 1_000},
            "gpt-4o-mini": {"context_window": 8_000, "max_output_tokens": 1_000},
        },
    )
    proxy = module_proxy_factory(config)
    with proxy.http_client(headers={"Authorization": f"Bearer {PROXY_KEY}"}) as client:
        t = Traffic(client)
        for n in range(3):
            t.chat([{"role": "user", "content": f"Hello {n}"}], model="gpt-4o-mini")
        for steps in range(6, 40, 2):
            t.chat(agent_conversation(steps), model=MODEL)
        t.chat(agent_conversation(38), model=MODEL, stream=True)
        t.passthrough("GET", "/v1/models")
        t.passthrough(
            "POST", "/v1/embeddings", json={"model": "text-embedding-3-small", "input": "a"}
        )
        t.chat([{"role": "user", "content": "x"}], model=MODEL, headers={"X-Fake-Status": "429"})
        browser_upstream.control(summarizer="error")
        for _ in range(2):
            t.chat(agent_conversation(22, topic="lexer"), model="gpt-4o-mini")
        browser_upstream.reset()
        for steps in range(24, 30, 2):
            t.chat(agent_conversation(steps, topic="tokenizer"), model="gpt-4o-mini")
        # A model the proxy does not know, served with a small window: one refusal, then a
        # learned window (the page's windows table) and a compacted retry.
        browser_upstream.control(model_context_windows={LOCAL_MODEL: LOCAL_WINDOW})
        t.chat(agent_conversation(40, topic="local"), model=LOCAL_MODEL)
        browser_upstream.reset()
        yield proxy, t


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=programs.chromium(), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def _open(context: Any, proxy: ProxyServer) -> Any:
    page = context.new_page()
    page.goto(f"{proxy.url}/dashboard?key={PROXY_KEY}")
    # A selector, not wait_for_function: a string predicate that has to be polled is
    # evaluated with eval(), which the page's Content-Security-Policy forbids.
    page.wait_for_selector("#status >> text=/^live/", timeout=15_000)
    return page


@pytest.fixture(scope="module")
def page(browser: Any, traffic: tuple[ProxyServer, Traffic]) -> Iterator[Any]:
    proxy, _ = traffic
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        yield _open(context, proxy)
    finally:
        context.close()


@pytest.fixture(scope="module")
def recall_page(browser: Any, traffic: tuple[ProxyServer, Traffic]) -> Iterator[Any]:
    """The page showing the recorded recall session's data."""
    proxy, _ = traffic
    telemetry = Telemetry(Settings())
    feed(telemetry)
    context = browser.new_context(viewport={"width": 1360, "height": 900})

    def data(route: Any) -> None:
        body = orjson.dumps(telemetry.snapshot())
        route.fulfill(status=200, content_type="application/json", body=body)

    context.route("**/dashboard/data", data)
    try:
        yield _open(context, proxy)
    finally:
        context.close()


@pytest.fixture(scope="module")
def kept_page(browser: Any, traffic: tuple[ProxyServer, Traffic]) -> Iterator[Any]:
    """The page showing two checked summaries' figures, recorded by a real telemetry."""
    proxy, _ = traffic
    telemetry = Telemetry(Settings())
    first = SummaryCheck((SectionCount("files", 2, 5), SectionCount("rules", 1, 1)))
    second = SummaryCheck(
        (SectionCount("files", 1, 1), SectionCount("errors", 0, 3)), ("Never push to main.",)
    )
    feed(telemetry, (Request(report=checked_report(first)), Request(report=checked_report(second))))
    context = browser.new_context(viewport={"width": 1360, "height": 900})

    def data(route: Any) -> None:
        body = orjson.dumps(telemetry.snapshot())
        route.fulfill(status=200, content_type="application/json", body=body)

    context.route("**/dashboard/data", data)
    try:
        yield _open(context, proxy)
    finally:
        context.close()


def test_the_summarizer_card_shows_what_the_summaries_kept(kept_page: Any, page: Any) -> None:
    kept = kept_page.locator("#summary-kept")
    assert kept.locator(".big").text_content() == "40%"  # 4 of 10
    assert "summaries kept: 4 of 10 strings and rules, 2 summaries" in kept.text_content()
    chips = kept.locator(".chip").all_text_contents()
    assert chips == ["files 3/6", "rules 1/1", "errors 0/3", "contradictions 1"]
    # The real traffic's summaries were checked against their spans too: a figure of its own.
    assert page.locator("#summary-kept").count() == 1


def test_the_page_shows_the_traffic_numbers(
    page: Any, traffic: tuple[ProxyServer, Traffic]
) -> None:
    _, t = traffic
    assert page.text_content("#k-requests") == f"{len(t.sent):,}"
    saved = t.tokens_saved()
    assert saved > 0
    assert page.text_content("#k-saved") == compact(saved)
    assert page.text_content("#k-money").startswith("$")
    assert page.text_content("#k-money") != "$0"
    assert page.locator("#recent td.model", has_text=MODEL).count() >= 1
    assert page.locator("#recent td.model", has_text="gpt-4o-mini").count() >= 1
    hits = t.checkpoints()["hit"]
    assert hits >= 1
    assert f"{hits} hits" in page.text_content("#k-hit-sub")
    assert page.text_content("#k-fail") == "2"  # the error and the back-off
    # Requests per compacted API, one entry per registered format.
    chat = len(t.chats())
    assert chat >= 1
    assert f"chat {chat:,} · responses 0 · messages 0)" in page.text_content("#k-compacted-sub")
    strategies = page.text_content("#strategies")
    for name in t.strategy_runs():
        assert name in strategies
    # Recall is off by default: the panel is there, and nothing was offered or recalled.
    assert page.text_content("#recall-recalled") == "0"
    assert page.text_content("#recall-offered") == "of 0 requests offered the tool recalled"
    assert set(page.locator("#recent td:nth-child(8)").all_text_contents()) == {DASH}


def test_the_recall_panel_shows_the_recorded_figures(recall_page: Any, tmp_path: Path) -> None:
    page = recall_page
    assert page.text_content("#recall-recalled") == "5"
    assert page.text_content("#recall-offered") == "of 7 requests offered the tool recalled"
    figures = {
        "rounds": "9",
        "calls": "10",
        "ids": "14",
        "tokens": "6,200",
        "deferred": "3",
        "unavailable": "1",
        "archived": "9",
        "time": "790 ms",  # 3.95 s over the 5 requests that recalled
    }
    for name, shown in figures.items():
        assert page.text_content(f"#recall-{name}") == shown, name
    chips = page.locator("#recall .chip").all_text_contents()
    assert chips == ["answered 3", "limit 1", "deferred 1", "unavailable 1", "unused 1"]
    # The recent requests' Recall column: hidden rounds, newest first; a dash when not offered.
    cells = page.locator("#recent td:nth-child(8)")
    assert cells.all_text_contents() == [
        DASH,  # GET /v1/models: not a compacted API
        "1",
        "unavailable 1",
        "limit 4",
        "deferred 1 0",
        "deferred 2 1",
        "2",
        "0",  # offered, not called
        DASH,
        DASH,
    ]
    assert "compaction archived 4 messages" in cells.nth(8).get_attribute("title")
    assert cells.nth(6).get_attribute("title").startswith("answered · 3 calls · 5 originals")
    page.screenshot(path=str(tmp_path / "dashboard-recall.png"), full_page=True)


def test_the_windows_table_shows_a_learned_window(
    page: Any, traffic: tuple[ProxyServer, Traffic]
) -> None:
    _, t = traffic
    last = t.sent[-1]
    assert last.status == 200 and last.headers.get("x-compaction-retry") == "1"
    row = page.locator("#windows tr", has_text=LOCAL_MODEL)
    assert row.count() == 1
    text = row.text_content()
    assert f"{LOCAL_WINDOW:,}" in text and "learned" in text


def test_the_charts_are_drawn(page: Any) -> None:
    bars = page.locator("#chart-requests svg rect[data-value]")
    assert bars.count() >= 10
    assert int(bars.first.get_attribute("data-value")) > 0
    assert page.locator("#chart-rpm svg rect[data-value]").count() >= 1
    line = page.locator("#chart-tpm svg path.series-b").get_attribute("d")
    assert line and line.count("L") >= 10


def test_the_key_leaves_the_address_bar_and_never_shows(page: Any) -> None:
    assert "key=" not in page.url
    html = page.content()
    assert PROXY_KEY not in html and UPSTREAM_KEY not in html


def test_screenshot(page: Any, tmp_path: Path) -> None:
    page.wait_for_timeout(300)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    if os.environ.get("UPDATE_DASHBOARD_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


def test_a_narrow_screen_has_no_horizontal_scroll(page: Any, tmp_path: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(2_300)  # one poll: charts redraw at the new width
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
    page.screenshot(path=str(tmp_path / "dashboard-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1360, "height": 900})
