"""Fixtures the summarizer's tests share: the transport it is given, respx on its httpx client
(these are unit tests of the HTTP summarizer, so its upstream is mocked), and the Messages API
label for tests whose upstreams say ``api: messages``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import respx

from compaction_proxy.upstream import HttpxUpstream, UpstreamTransport
from tests.support.messages_view import ensure_messages_api


@pytest.fixture
async def client() -> AsyncIterator[UpstreamTransport]:
    """The transport the summarizer calls through, over an httpx client (respx mocks it)."""
    async with httpx.AsyncClient() as shared:
        yield HttpxUpstream(shared)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
def messages_api() -> Iterator[None]:
    """A ``messages`` format in the registry while the test runs (the real one once merged, else
    the stand-in of tests/support/messages_view.py), so ``api: messages`` names something."""
    undo = ensure_messages_api()
    yield
    undo()
