"""A throwaway wire format, registered at start-up, served by a real proxy process.

It proves the `WireFormat` seam (compaction_proxy/wire/format.py): a format that lives only in
this file (its own module) plus one `register` call (its registry entry) is dispatched, lifted,
compacted, lowered back into the client's bytes, authenticated its own way upstream, labelled
in the metrics and answers errors in its own shape; nothing else of the package is edited.

Run as a module (``python -m tests.integration.test_wire_format_toy serve ...``) it is the
proxy's launcher: it registers the toy format, then runs the CLI in the same process.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from compaction_proxy.http import bad_request
from compaction_proxy.wire import (
    Amendment,
    Headers,
    Lowered,
    RefusalText,
    SummaryCall,
    UpstreamAuth,
    UpstreamTraits,
    WindowOption,
    parse_json_object,
)
from compaction_proxy.wire.sse import Event
from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import UpstreamServer, proxy_config, upstream_entry, write_config

TOY_PATH = "/v1/toy/talk"
OPERATOR_KEY = "sk-toy-operator-1f3a"


def parse_toy(raw: bytes) -> dict[str, Any]:
    """A toy body: ``model`` and ``turns``, each ``{"who", "say"}``."""
    data = parse_json_object(raw)
    if not isinstance(data.get("model"), str):
        raise bad_request("'model' is required", param="model", code="missing_model")
    if not isinstance(data.get("turns"), list):
        raise bad_request("'turns' must be an array", param="turns", code="invalid_turns")
    return data


@dataclass(frozen=True)
class ToyView:
    chat: dict[str, Any]

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        turns = [{"who": m["role"], "say": m["content"]} for m in messages]
        return Lowered(turns, notes=("toy: turns rewritten",))


class ToyFormat:
    name = "toy_talk"
    api = "toy"
    paths = (TOY_PATH,)
    count_path = None
    items = "turns"
    output_limits: tuple[str, ...] = ()  # a toy turn has no output limit
    auth = UpstreamAuth("x-toy-key", "Toy ")
    summary: SummaryCall | None = None
    prefix_summaries = False
    refusals: tuple[RefusalText, ...] = ()
    recall = None  # a toy conversation is never offered the recall tool
    parse = staticmethod(parse_toy)

    def claims(self, body: Mapping[str, Any]) -> bool:
        return "turns" in body

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return None

    def has_items(self, body: Mapping[str, Any]) -> bool:
        return bool(body.get("turns"))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        return None

    def lift(self, body: dict[str, Any], *, check: bool = True) -> ToyView:
        messages = [{"role": t["who"], "content": t["say"]} for t in body["turns"]]
        return ToyView({"model": body["model"], "messages": messages})

    usage_at_start = False

    def usage_tokens(self, payload: Any) -> int | None:
        return None

    def ends_stream(self, event: Event) -> bool:
        return False  # no end of its own: the relay asks every format

    def window_option(self, model: str, headers: Headers) -> WindowOption | None:
        return None

    def error_body(
        self, message: str, *, type: str, code: str | None = None, param: str | None = None
    ) -> bytes:
        return orjson.dumps({"toy_error": {"said": message, "code": code}})

    def stream_error(
        self, message: str, *, type: str, code: str | None, param: str | None, sequence: int
    ) -> bytes:
        return b"data: " + self.error_body(message, type=type, code=code) + b"\n\n"

    def amend(
        self, body: Mapping[str, Any], items: Sequence[Any], upstream: UpstreamTraits
    ) -> Amendment | None:
        return None


TOY = ToyFormat()


class ToyProxy(ServerProcess):
    """The proxy, started by this module so that the toy format is registered in it."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        super().__init__(
            "toy-proxy",
            lambda port: python_module_argv(
                __name__,
                "serve",
                "--config",
                str(config_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ),
            log_path,
            ready_path="/healthz",
            ready_status=200,
        )


@pytest.fixture
def toy_proxy(upstream: UpstreamServer, tmp_path: Path) -> Iterator[ToyProxy]:
    config = proxy_config(
        upstream_entry(upstream, api_key=OPERATOR_KEY),
        allow_anonymous_spend=True,
        summarization={"enabled": False},
        store={"backend": "memory"},
        compaction={"pipeline": [{"strategy": "sliding_window", "keep_last_turns": 1}]},
    )
    proxy = ToyProxy(write_config(tmp_path / "toy.yaml", config), tmp_path / "toy.log")
    proxy.start()
    yield proxy
    proxy.stop()


def _turns(n: int) -> list[dict[str, str]]:
    turns = []
    for i in range(n):
        turns.append({"who": "user", "say": f"question {i} " + "words " * 40})
        turns.append({"who": "assistant", "say": f"answer {i} " + "words " * 40})
    turns.append({"who": "user", "say": "the last question"})
    return turns


def test_a_format_registered_at_start_up_is_served_end_to_end(
    toy_proxy: ToyProxy, upstream: UpstreamServer
) -> None:
    body = {"model": "gpt-4o", "turns": _turns(6), "keep": {"me": "as sent"}}
    with httpx.Client(base_url=toy_proxy.url, trust_env=False, timeout=60.0) as client:
        reply = client.post(
            TOY_PATH,
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "authorization": "Bearer sk-client"},
        )
        assert reply.status_code == 200, reply.text
        # Compacted: the report headers, and the format's own lowering note.
        before = int(reply.headers["x-compaction-tokens-before"])
        after = int(reply.headers["x-compaction-tokens-after"])
        assert after < before
        assert "sliding_window" in reply.headers["x-compaction-strategies"]
        assert "toy: turns rewritten" in reply.headers.get_list("x-compaction-warning")

        sent = upstream.last_request(TOY_PATH)
        forwarded = sent.json()
        # Lowered back into the toy's own form, every other field as the client wrote it.
        assert forwarded["keep"] == {"me": "as sent"}
        assert forwarded["turns"][-1] == {"who": "user", "say": "the last question"}
        assert 0 < len(forwarded["turns"]) < len(body["turns"])
        assert all(set(t) == {"who", "say"} for t in forwarded["turns"])
        # The operator's key goes the format's way; the client's never travels.
        assert sent.headers["x-toy-key"] == f"Toy {OPERATOR_KEY}"
        assert "authorization" not in sent.headers

        # The proxy's own errors on this path come in the format's shape.
        bad = client.post(
            TOY_PATH,
            content=b'{"model": "gpt-4o", "turns": "nope"}',
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400
        assert bad.json() == {
            "toy_error": {"said": "'turns' must be an array", "code": "invalid_turns"}
        }

        # The metric labels know the route, from the same registry.
        metrics = client.get("/metrics").text
        assert 'route="toy_talk",status="200"' in metrics
        assert 'route="toy_talk",status="400"' in metrics


if __name__ == "__main__":
    from compaction_proxy.cli import main
    from compaction_proxy.wire.registry import register

    register(TOY)
    sys.exit(main(sys.argv[1:]))
