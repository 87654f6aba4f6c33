"""The fake Messages upstream (tests/fakes/messages) as a child process, and clients for it.

Same handle as the chat fake's (:class:`~tests.support.servers.UpstreamServer`): ``requests()``
returns what it received byte for byte (headers included: ``x-api-key``,
``anthropic-version``, ``anthropic-beta``), ``control(**settings)`` changes its settings,
``reset()`` restores them and clears recordings and the prompt cache. ``base_url`` here is
the server root, as Anthropic's SDKs and Claude Code take it (they add ``/v1`` themselves).

The Python SDK (``anthropic`` 2.x) sends its key as ``Authorization: Bearer`` and a newer
``anthropic-version`` than Claude Code's ``x-api-key`` and ``2023-06-01``, and does not add
Claude Code's ``?beta=true`` on ``client.beta.messages``: tests that need those send them raw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic

from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import Recorded, UpstreamServer

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"


class MessagesUpstreamServer(UpstreamServer):
    def __init__(
        self,
        log_path: Path,
        *,
        context_window: int | None = None,
        extra_args: Sequence[str] = (),
        name: str = "messages",
    ):
        window = [] if context_window is None else ["--context-window", str(context_window)]
        ServerProcess.__init__(
            self,
            name,
            lambda port: python_module_argv(
                "tests.fakes.messages",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *window,
                *extra_args,
            ),
            log_path,
            ready_path="/_control",
        )
        self._client = None

    @property
    def base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` (or the SDK's ``base_url``) should say: no ``/v1``."""
        return self.url

    def anthropic_client(
        self, api_key: str = "sk-ant-test-dummy", **kwargs: Any
    ) -> anthropic.Anthropic:
        """The official SDK on this server, without retries (they would hide the status)."""
        return anthropic_client(self.base_url, api_key, **kwargs)

    def async_anthropic_client(
        self, api_key: str = "sk-ant-test-dummy", **kwargs: Any
    ) -> anthropic.AsyncAnthropic:
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        kwargs.setdefault("http_client", anthropic.DefaultAsyncHttpxClient(trust_env=False))
        return anthropic.AsyncAnthropic(base_url=self.base_url, api_key=api_key, **kwargs)

    def messages(self) -> list[Recorded]:
        """The ``/v1/messages`` requests received (any query string)."""
        return self.requests(MESSAGES)


def anthropic_client(
    base_url: str, api_key: str = "sk-ant-client", **kwargs: Any
) -> anthropic.Anthropic:
    """The official SDK on a server root (the fake's, or a proxy's ``url``), without retries
    (they would hide the status) and ignoring proxies in the environment (the SDK brings its own
    HTTP client package). Pass ``http_client`` to hook its requests; build it with
    ``anthropic.DefaultHttpxClient(trust_env=False, ...)``."""
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", 60.0)
    kwargs.setdefault("http_client", anthropic.DefaultHttpxClient(trust_env=False))
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, **kwargs)


@dataclass(frozen=True)
class CacheShare:
    """Cache-read share of a series of usages: read / (input + read + creation)."""

    read: int
    total: int

    @property
    def share(self) -> float:
        return self.read / self.total if self.total else 0.0


def cache_share(usages: Sequence[Any]) -> CacheShare:
    """Over SDK ``Usage`` objects (or dicts with the same fields)."""
    read = total = 0
    for usage in usages:
        get = usage.get if isinstance(usage, dict) else lambda key, u=usage: getattr(u, key, 0)
        hit = get("cache_read_input_tokens") or 0
        read += hit
        total += (get("input_tokens") or 0) + hit + (get("cache_creation_input_tokens") or 0)
    return CacheShare(read, total)
