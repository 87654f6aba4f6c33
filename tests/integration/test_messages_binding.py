"""Preserved thinking through the proxy: a compacted session on a model that binds thinking
to its conversation prefix is accepted, as the client's own session would be.

Real processes: the official ``anthropic`` SDK, the proxy, and the fake Messages upstream in
``thinking_binding: enforce`` (an account created after 2026-08-31 on Claude Fable 5.1 or later:
a replayed thinking block whose prefix changed is a 400 "bound to a different conversation"),
declared Anthropic's own API (``context_management: native``). The session is a tool loop with
adaptive thinking, each reply opening with a signed block the client sends back, in a 12k
window, so the proxy compacts it. Without ``thinking.block_binding`` the first compacted request
is refused (on the code before this change it is); with it every request is accepted, the
forwarded body carries ``drop_block`` and the header the beta, the reply lists the dropped
blocks, and ``X-Compaction-Warning`` says so. An uncompacted request goes byte for byte without
the beta; a client's own ``block_binding`` is left as sent; an upstream that is not Anthropic's
(a local server) never gets either; ``count_tokens`` of the compacted session is accepted too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anthropic
import httpx
import pytest
from anthropic.types import Message

from tests.fakes.messages.model import Loop
from tests.fakes.messages.signing import BINDING_BETA
from tests.support.messages_upstream import (
    COUNT_TOKENS,
    MESSAGES,
    MessagesUpstreamServer,
    anthropic_client,
)
from tests.support.sdk_chat import post_raw
from tests.support.servers import ProxyServer, Recorded, proxy_config, upstream_entry

NATIVE_MODEL = "claude-opus-5-5"  # routed to the upstream declared Anthropic's own API
LOCAL_MODEL = "claude-sonnet-4-5"  # routed to the same fake as a local server
WINDOW = 12_000
LOOP = Loop(steps=60, lines=30)
MAX_TOKENS = 1_024
THINKING = {"type": "adaptive"}
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14"
COMPACTED_STEPS = 4  # compacted requests the session runs to
DROP_BLOCK = {"prefix_mismatch_behavior": "drop_block"}
BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
TASK = f"{LOOP.directive()}\nRun the checks until they pass."


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("messages-binding") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(fake: MessagesUpstreamServer, module_proxy_factory: Any) -> ProxyServer:
    native = upstream_entry(fake.url + "/v1", name="anthropic", models=[NATIVE_MODEL])
    native["context_management"] = "native"
    local = upstream_entry(fake.url + "/v1", name="local", models=[LOCAL_MODEL])
    config = proxy_config(
        native,
        local,
        models={
            NATIVE_MODEL: {"context_window": WINDOW},
            LOCAL_MODEL: {"context_window": WINDOW},
        },
    )
    server: ProxyServer = module_proxy_factory(config)
    return server


class Headers(Protocol):
    """A reply's headers, as the SDK's own HTTP client gives them."""

    def __getitem__(self, key: str) -> str: ...

    def get_list(self, key: str) -> list[str]: ...


@dataclass
class Client:
    """The SDK on the proxy, and the bytes it sent for each request."""

    sdk: anthropic.Anthropic
    sent: list[bytes] = field(default_factory=list)


@pytest.fixture(scope="module")
def client(proxy: ProxyServer) -> Iterator[Client]:
    sent: list[bytes] = []

    def record(request: httpx.Request) -> None:
        sent.append(request.read())

    http = anthropic.DefaultHttpxClient(trust_env=False, event_hooks={"request": [record]})
    sdk = anthropic_client(proxy.url, "sk-ant-client", http_client=http)
    yield Client(sdk, sent)
    sdk.close()


@dataclass
class Step:
    sent: bytes  # what the client sent
    forwarded: Recorded  # what the fake received
    headers: Headers  # the proxy's answer's
    reply: dict[str, Any]

    @property
    def compacted(self) -> bool:
        forwarded: list[Any] = self.forwarded.json()["messages"]
        return bool(forwarded != json.loads(self.sent)["messages"])


def ask(
    client: Client,
    fake: MessagesUpstreamServer,
    messages: list[dict[str, Any]],
    *,
    model: str = NATIVE_MODEL,
    thinking: dict[str, Any] | None = None,
    betas: str = BETAS,
) -> Step:
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "thinking": thinking or THINKING,
        "tools": [BASH],
        "messages": messages,
        "extra_headers": {"anthropic-beta": betas},
    }
    raw = post_raw(client.sdk, "/v1/messages", Message, **kwargs)
    # (a summarizer call may come first: the proxy's checkpoint, not the client's request)
    [forwarded] = [
        r
        for r in fake.take()
        if r.path == MESSAGES and "You are writing a checkpoint" not in str(r.json().get("system"))
    ]
    return Step(client.sent[-1], forwarded, raw.headers, raw.http_response.json())


def answered(messages: list[dict[str, Any]], reply: dict[str, Any]) -> bool:
    """Append the reply and its tool results; False once the loop is done."""
    content = reply["content"]
    messages.append({"role": "assistant", "content": content})
    uses = [b for b in content if b["type"] == "tool_use"]
    if not uses:
        return False
    output = "".join(f"check line {n}: all systems nominal, nothing to report\n" for n in range(30))
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use["id"], "content": output} for use in uses
            ],
        }
    )
    return True


@dataclass
class Session:
    messages: list[dict[str, Any]]
    steps: list[Step]

    @property
    def compacted(self) -> list[Step]:
        return [step for step in self.steps if step.compacted]


@pytest.fixture(scope="module")
def session(client: Client, fake: MessagesUpstreamServer) -> Session:
    fake.reset()
    fake.control(thinking_binding="enforce", model_context_windows={NATIVE_MODEL: WINDOW})
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    steps: list[Step] = []
    for _ in range(LOOP.steps):
        step = ask(client, fake, messages)
        steps.append(step)
        if sum(s.compacted for s in steps) >= COMPACTED_STEPS or not answered(messages, step.reply):
            break
    return Session(messages, steps)


def test_every_compacted_request_is_accepted(
    session: Session, fake: MessagesUpstreamServer
) -> None:
    assert len(session.compacted) >= COMPACTED_STEPS, "the session never compacted"
    events = fake.events()
    assert [e for e in events if e["type"] in ("rejected", "refused")] == []
    assert sum(e["type"] == "answered" for e in events) == len(session.steps)


def test_without_drop_block_the_compacted_request_is_refused(
    session: Session, fake: MessagesUpstreamServer
) -> None:
    """What the proxy forwarded for the first compacted request, less what it added: the API
    refuses it, as it refused every compacted request before the proxy asked drop_block."""
    first = session.compacted[0]
    body = first.forwarded.json()
    body["thinking"] = THINKING
    headers = {
        k: v
        for k, v in first.forwarded.headers.items()
        if k in ("x-api-key", "anthropic-version", "authorization")
    }
    answer = httpx.post(
        fake.url + MESSAGES, json=body, headers={**headers, "anthropic-beta": BETAS}, timeout=30
    )
    fake.take()
    assert answer.status_code == 400
    assert "The block is bound to a different conversation" in answer.json()["error"]["message"]


def test_a_compacted_request_asks_drop_block_under_the_beta(session: Session) -> None:
    assert session.compacted, "the session never compacted"
    for step in session.compacted:
        forwarded = step.forwarded.json()
        assert forwarded["thinking"] == {"type": "adaptive", "block_binding": DROP_BLOCK}
        assert step.forwarded.headers["anthropic-beta"] == f"{BETAS},{BINDING_BETA}"
        warnings = step.headers.get_list("x-compaction-warning")
        assert any(w.startswith("thinking.block_binding set to drop_block") for w in warnings)
        # Every other member as the client sent it.
        sent = json.loads(step.sent)
        others = {k: v for k, v in forwarded.items() if k not in ("messages", "thinking")}
        assert others == {k: v for k, v in sent.items() if k not in ("messages", "thinking")}


def test_the_api_drops_the_blocks_compaction_unbound(session: Session) -> None:
    first = session.compacted[0]
    dropped = first.reply["input_transformations"]
    assert dropped and all(
        entry["type"] == "thinking_dropped" and entry["reason"] == "prefix_binding_mismatch"
        for entry in dropped
    )
    # Each names a thinking block of what was forwarded.
    messages = first.forwarded.json()["messages"]
    for entry in dropped:
        _, i, _, j = entry["path"].split(".")
        assert messages[int(i)]["content"][int(j)]["type"] == "thinking"


def test_an_uncompacted_request_goes_byte_for_byte(session: Session) -> None:
    untouched = [step for step in session.steps if not step.compacted]
    assert untouched
    for step in untouched:
        assert step.forwarded.body == step.sent
        assert step.forwarded.headers["anthropic-beta"] == BETAS
        assert "input_transformations" not in step.reply


def test_the_clients_own_block_binding_is_left_alone(
    session: Session, client: Client, fake: MessagesUpstreamServer
) -> None:
    own = {"type": "adaptive", "block_binding": DROP_BLOCK, "display": "omitted"}
    betas = f"{BINDING_BETA},{BETAS}"
    step = ask(client, fake, session.messages, thinking=own, betas=betas)
    assert step.compacted
    assert step.forwarded.json()["thinking"] == own
    assert step.forwarded.headers["anthropic-beta"] == betas
    warnings = step.headers.get_list("x-compaction-warning")
    assert not any(w.startswith("thinking.block_binding") for w in warnings)


def test_count_tokens_of_a_compacted_session_is_accepted(
    session: Session, client: Client, fake: MessagesUpstreamServer
) -> None:
    counted = client.sdk.messages.with_raw_response.count_tokens(
        model=NATIVE_MODEL,
        thinking=THINKING,  # type: ignore[arg-type]
        messages=session.messages,  # type: ignore[arg-type]
        extra_headers={"anthropic-beta": BETAS},
    )
    assert counted.parse().input_tokens > 0
    [forwarded] = [r for r in fake.take() if r.path == COUNT_TOKENS]
    assert forwarded.json()["thinking"] == {"type": "adaptive", "block_binding": DROP_BLOCK}
    assert forwarded.headers["anthropic-beta"] == f"{BETAS},{BINDING_BETA}"


def test_an_upstream_that_is_not_anthropics_gets_neither(
    session: Session, client: Client, fake: MessagesUpstreamServer
) -> None:
    fake.control(thinking_binding="off")  # a local server checks no binding
    try:
        step = ask(client, fake, session.messages, model=LOCAL_MODEL)
    finally:
        fake.control(thinking_binding="enforce")
    assert step.compacted
    assert step.forwarded.json()["thinking"] == THINKING
    assert step.forwarded.headers["anthropic-beta"] == BETAS
