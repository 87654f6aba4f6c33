"""GET /v1/compaction/archive/{id} through a real proxy process (``serve``, uvicorn) with two
API keys: an archived original is read back by the key (and tenant) it was archived for, and
by nobody else.

The archive rows are written by the test into the proxy's own SQLite file, with the same
``Archive`` the proxy uses (a second process on one file, as two workers are): this route only
reads, and what writes the rows during a compaction is tested with the pipeline.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction_proxy.checkpoints import Archive, SqliteStore, archive_namespace
from compaction_proxy.compaction.archive import Archived
from compaction_proxy.compaction.settings import RecallSettings
from tests.support.servers import ProxyServer, UpstreamServer, proxy_config, upstream_entry

ALICE = "sk-archive-alice-31f0"
BOB = "sk-archive-bob-7a2c"
RECALL = {"recall": {"enabled": True}}

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "FACT-ARCHIVED-SAFFRON: port 8443"}
TENANT_RESULT = {"role": "tool", "tool_call_id": "c2", "content": "FACT-TENANT-ONLY"}


def _seed(db: Path) -> dict[str, str]:
    """Alice's archive (no tenant): a call and its result, and the span over them; and one
    original under Alice's key with the tenant ``user-7``. The ids are the proxy's own: keyed
    by the store's secret (written here first, read by the proxy after) and the namespace."""

    async def write() -> dict[str, str]:
        store = SqliteStore(db)
        archive = Archive(store, RecallSettings(enabled=True))
        alice = archive_namespace(f"Bearer {ALICE}", None)
        made = await archive.recall_ids(alice)
        ids = (made.original(CALL), made.original(RESULT))
        span = made.span(ids, "summary")
        run = Archived(dict(zip(ids, (CALL, RESULT), strict=True)), {span: ids}, (*ids, span))
        assert await archive.keep(alice, run) is None
        tenant = archive_namespace(ALICE, "user-7")
        tenant_id = (await archive.recall_ids(tenant)).original(TENANT_RESULT)
        assert await archive.keep(tenant, Archived({tenant_id: TENANT_RESULT})) is None
        await store.close()
        return {"call": ids[0], "result": ids[1], "span": span, "tenant": tenant_id}

    return asyncio.run(write())


@pytest.fixture(scope="module")
def archived_proxy(
    fake_upstream: UpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ProxyServer, dict[str, str]]:
    db = tmp_path_factory.mktemp("archive") / "checkpoints.db"
    ids = _seed(db)
    config = proxy_config(
        upstream_entry(fake_upstream, api_key="sk-upstream-operator"),
        api_keys=[ALICE, BOB],
        store={"backend": "sqlite", "path": str(db)},
        compaction=RECALL,
    )
    proxy: ProxyServer = module_proxy_factory(config)
    return proxy, ids


def _get(proxy: ProxyServer, recall_id: str, **headers: str) -> httpx.Response:
    with proxy.http_client() as http:
        return http.get(f"/v1/compaction/archive/{recall_id}", headers=headers)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _assert_not_found(response: httpx.Response, recall_id: str) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "not_found"
    assert recall_id[:12] in error["message"]


def test_the_key_that_archived_it_reads_the_original(
    archived_proxy: tuple[ProxyServer, dict[str, str]],
) -> None:
    proxy, ids = archived_proxy
    response = _get(proxy, ids["result"], **_bearer(ALICE))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    payload = response.json()
    assert set(payload) == {"id", "kind", "message", "tool", "created_at"}
    assert payload["id"] == ids["result"] and payload["kind"] == "original"
    assert payload["message"] == RESULT
    assert payload["tool"] == "read_file"
    assert isinstance(payload["created_at"], float)
    assert response.headers["x-request-id"]


def test_a_span_lists_its_members(archived_proxy: tuple[ProxyServer, dict[str, str]]) -> None:
    proxy, ids = archived_proxy
    payload = _get(proxy, ids["span"], **_bearer(ALICE)).json()
    assert payload["kind"] == "span"
    assert payload["members"] == [ids["call"], ids["result"]]
    assert "message" not in payload


def test_the_same_key_in_x_api_key_reads_it_too(
    archived_proxy: tuple[ProxyServer, dict[str, str]],
) -> None:
    """An Anthropic client sends its key in x-api-key: the archive is the key's, whichever
    header carries it."""
    proxy, ids = archived_proxy
    response = _get(proxy, ids["result"], **{"x-api-key": ALICE})
    assert response.status_code == 200 and response.json()["message"] == RESULT


def test_another_key_gets_a_404_as_for_an_id_never_archived(
    archived_proxy: tuple[ProxyServer, dict[str, str]],
) -> None:
    proxy, ids = archived_proxy
    other = _get(proxy, ids["result"], **_bearer(BOB))
    _assert_not_found(other, ids["result"])
    assert "SAFFRON" not in other.text
    never = _get(proxy, "rzzzzzzzzzzz", **_bearer(BOB))
    _assert_not_found(never, "rzzzzzzzzzzz")
    # Nothing tells the two apart.
    assert other.json()["error"]["message"].replace(ids["result"], "X") == never.json()["error"][
        "message"
    ].replace("rzzzzzzzzzzz", "X")


def test_the_tenant_header_is_part_of_the_namespace(
    archived_proxy: tuple[ProxyServer, dict[str, str]],
) -> None:
    proxy, ids = archived_proxy
    tenant = {**_bearer(ALICE), "X-Compaction-Tenant": "user-7"}
    assert _get(proxy, ids["tenant"], **tenant).json()["message"] == TENANT_RESULT
    _assert_not_found(_get(proxy, ids["tenant"], **_bearer(ALICE)), ids["tenant"])
    _assert_not_found(
        _get(proxy, ids["result"], **tenant), ids["result"]
    )  # Alice's own, but not this tenant's
    other_tenant = {**_bearer(ALICE), "X-Compaction-Tenant": "user-8"}
    _assert_not_found(_get(proxy, ids["tenant"], **other_tenant), ids["tenant"])


def test_no_key_is_a_401(archived_proxy: tuple[ProxyServer, dict[str, str]]) -> None:
    proxy, ids = archived_proxy
    response = _get(proxy, ids["result"])
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert "SAFFRON" not in response.text


@pytest.mark.parametrize("path", ["not-an-id", "RABCDEFGHIJK", "rabcdefghijk/more", "r"])
def test_a_path_that_is_no_id_is_a_404(
    archived_proxy: tuple[ProxyServer, dict[str, str]], path: str
) -> None:
    proxy, _ = archived_proxy
    response = _get(proxy, path, **_bearer(ALICE))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_only_get(archived_proxy: tuple[ProxyServer, dict[str, str]]) -> None:
    proxy, ids = archived_proxy
    with proxy.http_client() as http:
        response = http.post(f"/v1/compaction/archive/{ids['result']}", headers=_bearer(ALICE))
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_the_route_has_its_own_metric_label(
    archived_proxy: tuple[ProxyServer, dict[str, str]],
) -> None:
    proxy, ids = archived_proxy
    _get(proxy, ids["result"], **_bearer(ALICE))
    with proxy.http_client() as http:
        metrics = http.get("/metrics", headers=_bearer(ALICE)).text
    assert 'route="archive"' in metrics


# ------------------------------------------------------------------ recall off, store down


def test_with_recall_off_the_route_is_a_404(proxy: ProxyServer) -> None:
    """The session's proxy (default config: recall off): nothing is archived, and the
    path is not forwarded upstream as an unknown /v1 path would be."""
    response = _get(proxy, "rabcdefghijk")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "not_found" and "compaction.recall.enabled" in error["message"]


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but never listening: a Redis that refuses every connection."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def test_a_store_that_is_down_is_a_503(
    upstream: UpstreamServer, proxy_factory: Any, dead_port: int
) -> None:
    config = proxy_config(
        upstream_entry(upstream),
        store={"backend": "redis", "url": f"redis://127.0.0.1:{dead_port}/0"},
        compaction=RECALL,
    )
    proxy = proxy_factory(config)
    # The first read fails and marks the store down; the second is refused by the breaker
    # without waiting: both a 503 that names no host.
    for _ in range(2):
        response = _get(proxy, "rabcdefghijk", **_bearer(ALICE))
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error == {
            "message": "archive not available right now",
            "type": "server_error",
            "param": None,
            "code": "archive_unavailable",
        }
        assert "127.0.0.1" not in response.text and str(dead_port) not in response.text
    with proxy.http_client() as http:
        assert http.get("/readyz").json()["status"] == "degraded"
