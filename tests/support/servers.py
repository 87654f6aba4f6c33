"""Typed handles on the two servers the integration tests run: the fake upstream and the proxy.

The handles hide the control routes of the fake (``/_requests``, ``/_events``, ``/_control``) and
the proxy's config file, so tests read as "send this, the upstream saw that".
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import yaml

from tests.support.processes import ServerProcess, python_module_argv

Event = dict[str, Any]


@dataclass(frozen=True)
class Recorded:
    """One request as the fake upstream received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recorded:
        return cls(
            method=data["method"],
            path=data["path"],
            query=data["query"],
            headers=dict(data["headers"]),
            raw_headers=[(k, v) for k, v in data["raw_headers"]],
            body=base64.b64decode(data["body_b64"]),
        )

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class UpstreamControl:
    """The fake upstream's control routes (``/_requests``, ``/_events``, ``/_control``), read
    through ``client``: the same handle whether the fake is a child process
    (:class:`UpstreamServer`) or runs in the test's process (tests/support/in_thread.py)."""

    url: str

    @property
    def client(self) -> httpx.Client:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """What a proxy config's ``upstreams[].base_url`` should say."""
        return self.url + "/v1"

    def requests(self, path: str | None = None) -> list[Recorded]:
        """Everything received since the last :meth:`clear`, optionally only on ``path``."""
        response = self.client.get("/_requests")
        response.raise_for_status()
        recorded = [Recorded.from_json(item) for item in response.json()]
        return [r for r in recorded if path is None or r.path == path]

    def take(self, path: str | None = None) -> list[Recorded]:
        """What :meth:`requests` returns, cleared in the same step: a request that arrives
        between reading and clearing (a background summary call) is counted next time, never
        lost."""
        response = self.client.delete("/_requests", params={"take": "1"})
        response.raise_for_status()
        recorded = [Recorded.from_json(item) for item in response.json()]
        return [r for r in recorded if path is None or r.path == path]

    def last_request(self, path: str | None = None) -> Recorded:
        recorded = self.requests(path)
        assert recorded, f"the upstream received no request{f' on {path}' if path else ''}"
        return recorded[-1]

    def events(self) -> list[Event]:
        response = self.client.get("/_events")
        response.raise_for_status()
        return list(response.json())

    def wait_for_event(
        self, predicate: Callable[[Event], bool], timeout: float = 15.0
    ) -> Event | None:
        """Polls ``/_events`` until one matches; None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events():
                if predicate(event):
                    return event
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def clear(self) -> None:
        """Forgets recorded requests and events."""
        self.client.delete("/_requests").raise_for_status()
        self.client.delete("/_events").raise_for_status()

    def control(self, **changes: Any) -> dict[str, Any]:
        """Changes server-wide settings (``context_window=``, ``delay_ms=``, ...)."""
        response = self.client.post("/_control", json=changes)
        response.raise_for_status()
        return dict(response.json())

    def reset(self) -> None:
        """Startup settings back, recordings cleared."""
        self.control(reset=True)
        self.clear()


class UpstreamServer(ServerProcess, UpstreamControl):
    """The fake OpenAI-compatible upstream (tests/fakes/upstream.py) as a child process."""

    def __init__(self, log_path: Path, context_window: int | None = None, name: str = "upstream"):
        extra = [] if context_window is None else ["--context-window", str(context_window)]
        super().__init__(
            name,
            lambda port: python_module_argv(
                "tests.fakes.upstream", "--host", "127.0.0.1", "--port", str(port), *extra
            ),
            log_path,
            ready_path="/_control",
        )
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, trust_env=False, timeout=10.0)
        return self._client

    def stop(self) -> int | None:
        if self._client is not None:
            self._client.close()
            self._client = None
        return super().stop()


def upstream_entry(
    upstream: UpstreamControl | str,
    *,
    name: str = "fake",
    api_key: str = "",
    models: list[str] | None = None,
    timeouts: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One ``upstreams:`` item of a proxy config."""
    base_url = upstream.base_url if isinstance(upstream, UpstreamControl) else upstream
    entry: dict[str, Any] = {
        "name": name,
        "base_url": base_url,
        "api_key": api_key,
        "models": models if models is not None else ["*"],
    }
    if timeouts is not None:
        entry["timeouts"] = dict(timeouts)
    return entry


def proxy_config(
    *upstreams: dict[str, Any],
    api_keys: list[str] | None = None,
    max_body_bytes: int | None = None,
    allow_anonymous_spend: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A proxy config dict with only the keys the tests rely on (plus any ``extra`` sections).

    ``allow_anonymous_spend``: for tests of something else (routing, bytes) that give their
    upstreams keys without putting the proxy behind ``server.api_keys``, which ``serve``
    otherwise refuses (compaction_proxy/config/preflight.py)."""
    server: dict[str, Any] = {"host": "127.0.0.1", "port": 8080}
    if api_keys is not None:
        server["api_keys"] = api_keys
    if allow_anonymous_spend:
        server["allow_anonymous_spend"] = True
    if max_body_bytes is not None:
        server["max_body_bytes"] = max_body_bytes
    return {"server": server, "upstreams": list(upstreams), **extra}


def session_config(
    upstream: UpstreamServer, db: Path, model: str, window: int, **extra: Any
) -> dict[str, Any]:
    """The long-session tests' proxy: one fake upstream, ``model`` with ``window`` declared,
    SQLite checkpoints at ``db``, the summarizer on (600-token summaries, two turns kept, a
    10 s timeout); ``extra`` sections (e.g. ``compaction``) added."""
    return proxy_config(
        upstream_entry(upstream),
        models={model: {"context_window": window, "max_output_tokens": 1_000}},
        store={"backend": "sqlite", "path": str(db)},
        summarization={
            "enabled": True,
            "maxSummaryTokens": 600,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
        **extra,
    )


def write_config(path: Path, config: Mapping[str, Any] | str) -> Path:
    """Writes a config dict as YAML (or a string verbatim, for interpolation tests)."""
    text = config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


class ProxyServer(ServerProcess):
    """``python -m compaction_proxy serve`` as a child process, ready once ``/healthz``
    answers 200."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        *,
        via_env: bool = False,
        env: Mapping[str, str] | None = None,
        name: str = "proxy",
        preexec_fn: Callable[[], None] | None = None,
    ):
        self.config_path = config_path
        env = dict(env or {})
        config_args: list[str] = []
        if via_env:
            env["COMPACTION_PROXY_CONFIG"] = str(config_path)
        else:
            config_args = ["--config", str(config_path)]
        super().__init__(
            name,
            lambda port: python_module_argv(
                "compaction_proxy",
                "serve",
                *config_args,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ),
            log_path,
            ready_path="/healthz",
            env=env,
            ready_status=200,
            preexec_fn=preexec_fn,
        )

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's ``base_url`` for this proxy."""
        return self.url + "/v1"

    def openai_client(self, api_key: str = "sk-test-dummy", **kwargs: Any) -> openai.OpenAI:
        """An SDK client without retries (a retry would hide the status the proxy returned)."""
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        kwargs.setdefault("http_client", httpx.Client(trust_env=False))
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, **kwargs)

    def async_openai_client(
        self, api_key: str = "sk-test-dummy", **kwargs: Any
    ) -> openai.AsyncOpenAI:
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        kwargs.setdefault("http_client", httpx.AsyncClient(trust_env=False))
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key, **kwargs)

    def http_client(self, **kwargs: Any) -> httpx.Client:
        """A raw client for what the SDK cannot send (bad bodies, odd headers, chunked uploads)."""
        kwargs.setdefault("timeout", 60.0)
        return httpx.Client(base_url=self.url, trust_env=False, **kwargs)

    def log_lines_since(self, offset: int) -> list[str]:
        return self.log_text(offset).splitlines()
