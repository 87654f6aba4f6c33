"""A 150-step Claude Code-like session through the proxy, and compact-and-retry, on /v1/messages.

Real processes: the official ``anthropic`` SDK as client, the proxy (SQLite store, the default
pipeline with summaries made by the request's own upstream and model) and the fake Messages
upstream (tests/fakes/messages), which enforces a 32k window and refuses the way Anthropic does,
checks tool pairing, thinking signatures and the four-breakpoint limit, and accounts prompt
caching by breakpoints. The session is a single turn: one task with facts, then tool step after
tool step scripted by the fake (``fake-loop:``; every third step calls the tool three times in
parallel), each reply opening with a signed thinking block the client sends back, the system in
three blocks with two breakpoints and a third moved to the newest ``tool_result`` every step, as
Claude Code sends it; JSON and ``client.messages.stream(...)`` alternate.

What must hold: every request accepted (the fake recorded no refusal and no rejection), pairing
valid, thinking blocks exactly as the fake signed them, at most four breakpoints, the newest step
verbatim, the forwarded prefix stable between compaction events (compared as the chat and
Responses session tests compare it, and as the fake's cache-read share), checkpoints reused and
the early facts carried to the end. Then: a window the proxy guessed too large (a model it does
not know), for each refusal shape the servers serving /v1/messages answer, is compacted to fit,
retried once and learned.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anthropic
import pytest
from anthropic.types import Message

from tests.fakes.messages.model import CHECKPOINT_MARKER, OWN_TOOL_ID, Loop
from tests.fakes.messages.prompt import Counter, build_prompt, canonical
from tests.support.messages_upstream import (
    MESSAGES,
    MessagesUpstreamServer,
    anthropic_client,
    cache_share,
)
from tests.support.sdk_chat import post_raw
from tests.support.servers import ProxyServer, Recorded, proxy_config, upstream_entry

MODEL = "claude-sonnet-4-5"
WINDOW = 32_000
STEPS = 150
# Three parallel results of 12 lines are cut when the default pipeline collapses old steps
# (~2,150 characters a step at 32k, compaction/strategies/_support/scaled_collapse.py); a cut
# keeps each result's head and tail, so the fact the fake's command prints last still reaches a
# summary.
LOOP = Loop(steps=STEPS, lines=12, parallel=3, every=3)
MAX_TOKENS = 4_096
THINKING = {"type": "adaptive"}  # as Claude Code asks; the fake thinks every turn
CLIENT = "client"
LIAR_WINDOW = 12_000  # what the fake enforces for the liar-* models; the proxy guesses 128k
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14"
# What Claude Code asks of the API's own context editing: keep every thinking turn. The fake is
# no api.anthropic.com, so the proxy applies it (clearing nothing) and strips the field.
CONTEXT_MANAGEMENT = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
TASK_FACTS = ["FACT-TASK21", "FACT-OWNER7"]
EARLY_FACT = "FACT-R3"  # in the output of step 3, folded into a summary long before the end
TASK = {
    "role": "user",
    "content": [
        {
            "type": "text",
            "text": f"{LOOP.directive()}\nFix the parser until its tests pass. The ticket is "
            f"{TASK_FACTS[0]}; report to {TASK_FACTS[1]}. List every FACT you saw at the end.",
        }
    ],
}
RULES = "\n".join(
    f"Rule {n}: before editing file number {n}, read it, run its tests, and keep the change "
    "small; never print secrets; prefer the Bash tool for anything that needs a shell."
    for n in range(60)
)
SYSTEM = [  # Claude Code's three blocks: a header without a breakpoint, then two with one
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk"},
    {
        "type": "text",
        "text": "You are a coding agent. Use the tools.",
        "cache_control": {"type": "ephemeral"},
    },
    {"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}},
]


class Headers(Protocol):
    """A reply's headers, as the SDK's own HTTP client gives them."""

    def __getitem__(self, key: str) -> str: ...

    def __contains__(self, key: object) -> bool: ...

    def get_list(self, key: str) -> list[str]: ...


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """The whole prompt as the upstream counted it: uncached, read and written."""
    read = usage.cache_read_input_tokens or 0
    return usage.input_tokens + read + (usage.cache_creation_input_tokens or 0)


def signature(block: dict[str, Any]) -> str:
    """A thinking block's signature (a redacted block's is its ``data``)."""
    return str(block.get("signature") or block.get("data"))


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {key: {"type": kind} for key, kind in properties.items()},
            "required": list(properties)[:1],
        },
    }


TOOLS = [
    _tool("Bash", "Run a shell command in the working directory.", command="string"),
    _tool("Read", "Read a file from the repository.", file_path="string", limit="integer"),
    _tool("Grep", "Search the repository for a pattern.", pattern="string", path="string"),
    _tool("Edit", "Replace text in a file.", file_path="string", old="string", new="string"),
]


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessagesUpstreamServer]:
    server = MessagesUpstreamServer(tmp_path_factory.mktemp("messages-session") / "fake.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(
    fake: MessagesUpstreamServer,
    module_proxy_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ProxyServer:
    db = tmp_path_factory.mktemp("messages-session-store") / "checkpoints.db"
    config = proxy_config(
        upstream_entry(fake.url + "/v1", name="anthropic"),
        models={MODEL: {"context_window": WINDOW}},  # liar-* models: the default window
        store={"backend": "sqlite", "path": str(db)},
        summarization={
            "enabled": True,
            "maxSummaryTokens": 1_000,
            "retainRecent": {"turns": 2},
            "timeout": 10,
        },
    )
    server: ProxyServer = module_proxy_factory(config)
    return server


def is_summary_call(recorded: Recorded) -> bool:
    """A summary call of the proxy, in any form: the marked instruction after the request's own
    prefix, a transcript, or (before the summarizer spoke Messages) a chat completion."""
    if recorded.path == "/v1/chat/completions":
        return True
    text = recorded.text
    return recorded.path == MESSAGES and (CHECKPOINT_MARKER in text or "<conversation>" in text)


def content_of(reply: anthropic.types.Message) -> list[dict[str, Any]]:
    """A reply's blocks as the client sends them back."""
    return [block.model_dump(exclude_none=True) for block in reply.content]


def bash_output(use: dict[str, Any]) -> str:
    """What the fake's harmless command prints (the loop's ``seq`` lines, its fact), for the
    step its tool id names (``toolu_fake_<step>_<call>_<n>``)."""
    match = OWN_TOOL_ID.match(use["id"])
    assert match is not None, use
    step, command = int(match.group(1)), use["input"]["command"]
    lines = "".join(
        f"step {step} line {n}: lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
        for n in range(1, LOOP.lines + 1)
    )
    if f"echo FACT-S{step}" in command:
        lines += f"FACT-S{step}\n"
    if step == 3:
        lines += f"config: {EARLY_FACT} is the flaky fixture\n"
    return lines


def move_breakpoint(messages: list[dict[str, Any]]) -> None:
    """Claude Code's third breakpoint: on the newest message's last block, off the older ones."""
    for message in messages:
        if isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    block.pop("cache_control", None)
    last = messages[-1]["content"]
    if last[-1].get("type") == "tool_result":
        last[-1]["cache_control"] = {"type": "ephemeral"}


def breakpoints(value: Any) -> int:
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(breakpoints(v) for v in value)
    return 0


def assert_pairing(messages: list[dict[str, Any]]) -> None:
    """Every tool_use answered in the next message, every tool_result answering the previous."""
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if results:
            before = messages[index - 1] if index else {"role": "user", "content": []}
            assert before["role"] == "assistant", index
            previous = [b.get("id") for b in before["content"] if isinstance(b, dict)]
            assert set(results) <= set(previous), index
        if uses:
            assert index + 1 < len(messages), index
            after = messages[index + 1]["content"]
            answered = [b.get("tool_use_id") for b in after if isinstance(b, dict)]
            assert set(uses) <= set(answered), index


@dataclass
class Session:
    """The client's side of the loop and what the fake received for each request."""

    messages: list[dict[str, Any]] = field(default_factory=lambda: [json.loads(json.dumps(TASK))])
    sent: list[list[dict[str, Any]]] = field(default_factory=list)  # what the client sent
    forwarded: list[dict[str, Any]] = field(default_factory=list)  # what the fake received
    headers: list[Headers] = field(default_factory=list)
    usages: list[Any] = field(default_factory=list)
    replies: list[list[dict[str, Any]]] = field(default_factory=list)  # the fake's own content
    summary_calls: list[Recorded] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    final_text: str = ""
    seconds: float = 0.0

    @property
    def compactions(self) -> list[int]:
        return [n for n, h in enumerate(self.headers) if h["x-compaction-checkpoint"] == "new"]

    def step(self, client: anthropic.Anthropic, fake: MessagesUpstreamServer) -> bool:
        """One request; False once the fake said the loop is done."""
        n = len(self.headers)
        move_breakpoint(self.messages)
        self.sent.append(json.loads(json.dumps(self.messages)))
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM,
            "tools": TOOLS,
            "thinking": THINKING,
            "messages": self.messages,
            # Claude Code's query and betas, which go upstream as sent
            "extra_query": {"beta": "true"},
            "extra_headers": {"anthropic-beta": BETAS},
            "extra_body": {"context_management": CONTEXT_MANAGEMENT},
        }
        if n % 2:
            with client.messages.stream(**kwargs) as stream:
                reply = stream.get_final_message()
                headers = stream.response.headers
            content = content_of(reply)
        else:
            raw = post_raw(client, "/v1/messages", Message, **kwargs)
            reply = raw.parse()
            headers = raw.headers
            content = raw.http_response.json()["content"]  # the fake's bytes, as relayed
            assert content == content_of(reply)
        self.headers.append(headers)
        self.usages.append(reply.usage)
        self.replies.append(content)
        taken = fake.take()
        self.summary_calls += [r for r in taken if is_summary_call(r)]
        [recorded] = [r for r in taken if r.path == MESSAGES and not is_summary_call(r)]
        assert recorded.query == "beta=true" and recorded.headers["anthropic-beta"] == BETAS
        forwarded = recorded.json()
        self.forwarded.append(forwarded)
        self.messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if not uses:
            self.final_text = "".join(b["text"] for b in content if b["type"] == "text")
            return False
        self.messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use["id"],
                        "content": bash_output(use),
                    }
                    for use in uses
                ],
            }
        )
        return True


@pytest.fixture(scope="module")
def session(proxy: ProxyServer, fake: MessagesUpstreamServer) -> Session:
    fake.reset()
    fake.control(model_context_windows={MODEL: WINDOW})
    client = anthropic_client(proxy.url, "sk-ant-client")
    run = Session()
    started = time.perf_counter()
    try:
        for _ in range(STEPS + 1):
            if not run.step(client, fake):
                break
        run.seconds = time.perf_counter() - started
        run.summary_calls += [r for r in fake.take() if is_summary_call(r)]  # any still landing
        run.events = fake.events()
    finally:
        client.close()
    return run


def figures(run: Session) -> str:
    between = [u for n, u in enumerate(run.usages) if n and n not in run.compactions]
    return (
        f"requests={len(run.headers)} compactions={len(run.compactions)} "
        f"summary_calls={len(run.summary_calls)} "
        f"cache_read_between_events={cache_share(between).share:.3f} "
        f"cache_read_all={cache_share(run.usages).share:.3f} seconds={run.seconds:.1f}"
    )


# ------------------------------------------------------------------ the session


def test_every_request_of_the_session_is_accepted_under_the_window(session: Session) -> None:
    print(figures(session))  # the figures the report quotes (pytest -s shows them)
    assert len(session.headers) == STEPS + 1, "the loop did not reach its end"
    assert session.final_text.startswith(f"fake-loop done: {STEPS} steps.")
    kinds = [e["type"] for e in session.events if e["type"] in ("refused", "rejected")]
    assert kinds == [], [e for e in session.events if e["type"] in ("refused", "rejected")]
    answered = [e for e in session.events if e["type"] == "answered"]
    assert len(answered) == len(session.headers) + len(
        [r for r in session.summary_calls if r.path == MESSAGES]
    )
    for usage in session.usages:
        assert 0 < prompt_tokens(usage) <= WINDOW
    whole = {"model": MODEL, "system": SYSTEM, "tools": TOOLS, "messages": session.messages}
    assert build_prompt(whole, Counter()).total > 1.8 * WINDOW  # far past it uncompacted
    shrunk = [
        n
        for n, h in enumerate(session.headers)
        if int(h["x-compaction-tokens-after"]) < int(h["x-compaction-tokens-before"])
    ]
    assert len(shrunk) > STEPS // 2, "compaction kept the session under the window"


def test_every_forwarded_body_is_one_the_api_accepts(session: Session) -> None:
    assert len(session.forwarded) == len(session.sent) > 0  # one forwarded body per request
    for n, body in enumerate(session.forwarded):
        assert_pairing(body["messages"])
        assert breakpoints(body) <= 4, n
        assert body["system"] == SYSTEM and body["tools"] == TOOLS, n
        assert body["thinking"] == THINKING and body["max_tokens"] <= MAX_TOKENS, n
        assert "context_management" not in body, n  # applied by the proxy, as configured
        assert body["messages"][0] == session.sent[n][0] == TASK, n  # the task, verbatim
        if n:  # the newest step: the model's turn and its results, as the client sent them
            assert body["messages"][-2:] == session.sent[n][-2:], n


def test_thinking_blocks_go_back_exactly_as_the_fake_signed_them(session: Session) -> None:
    signed: dict[str, dict[str, Any]] = {}
    turns: dict[str, list[dict[str, Any]]] = {}  # a tool_use id -> the thinking of its turn
    for content in session.replies:
        thinking = [b for b in content if b["type"] in ("thinking", "redacted_thinking")]
        assert thinking and content[0] is thinking[0], content  # every turn opens with it
        for block in thinking:
            signed[signature(block)] = block
        for block in content:
            if block["type"] == "tool_use":
                turns[block["id"]] = thinking
    checked = 0
    for n, body in enumerate(session.forwarded):
        for message in body["messages"]:
            if message["role"] != "assistant" or not isinstance(message["content"], list):
                continue
            blocks = message["content"]
            for block in blocks:
                if block["type"] in ("thinking", "redacted_thinking"):
                    assert block == signed[signature(block)], n
                    checked += 1
            ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
            if ids:  # a kept step keeps its thinking, first, whole
                expected = turns[ids[0]]
                assert blocks[: len(expected)] == expected, n
    assert checked > STEPS * 5  # most turns were re-sent many times


def test_the_prefix_is_stable_and_cached_between_compaction_events(session: Session) -> None:
    events = session.compactions
    assert 0 < len(events) <= STEPS // 10
    stable = 0
    for n, (before, after) in enumerate(itertools.pairwise(session.forwarded), start=1):
        if n in events:
            continue  # a compaction event: the prefix may change here, once
        # Claude Code moves its breakpoint every step, which is no change of the prompt.
        old, new = canonical(before["messages"]), canonical(after["messages"])
        assert new[: len(old)] == old, n
        stable += 1
    assert stable / (len(session.forwarded) - 1) >= 0.95
    between = [u for n, u in enumerate(session.usages) if n and n not in events]
    share = cache_share(between).share
    assert share >= 0.95, figures(session)
    # What makes the compacted prefix cacheable: a breakpoint on the checkpoint (the summary,
    # right after the task), which the proxy adds beside the client's three.
    for body in session.forwarded[events[0] :]:
        summary = body["messages"][1]["content"]
        assert "<summary>" in summary[0]["text"] and "cache_control" in summary[-1]


def test_checkpoints_are_reused_and_summaries_made_per_event(session: Session) -> None:
    events = session.compactions
    first = events[0]
    checkpoints = [h["x-compaction-checkpoint"] for h in session.headers[first + 1 :]]
    assert checkpoints and checkpoints.count("hit") >= 0.8 * len(checkpoints), checkpoints
    summarized = [
        n for n in events if "summarization" in session.headers[n]["x-compaction-strategies"]
    ]
    assert summarized, [session.headers[n]["x-compaction-strategies"] for n in events]
    # One call per event, and at most one prepared in the background for each (the loop's
    # steps take no time, so an event may also wait for the call being prepared).
    assert len(summarized) <= len(session.summary_calls) <= 2 * len(events)
    for recorded in session.summary_calls:  # in Messages form, to the request's own upstream
        assert recorded.path == MESSAGES, recorded.path
        body = recorded.json()
        assert body["model"] == MODEL
        assert breakpoints(body) <= 4


def test_the_early_facts_are_carried_to_the_end(session: Session) -> None:
    facts = [*TASK_FACTS, EARLY_FACT, *(f"FACT-S{step}" for step in range(10, STEPS + 1, 10))]
    missing = [fact for fact in facts if fact not in session.final_text]
    assert not missing, (missing, session.final_text)
    last = session.forwarded[-1]["messages"]
    text = json.dumps(last)
    assert EARLY_FACT in text  # through the summary: the step itself was folded long ago
    assert not any(EARLY_FACT in json.dumps(m) for m in last if "<summary>" not in json.dumps(m))
    assert len(last) < len(session.messages) // 3


def test_count_tokens_counts_the_session_as_forwarded(
    session: Session, proxy: ProxyServer, fake: MessagesUpstreamServer
) -> None:
    """The client's meter: counting the last request gives what the upstream was sent (the
    stored checkpoint, not the whole history, nor a fallback made for a count). A count's body
    has no ``max_tokens``, which every request of the session had: the answer must still be
    the length of what the request carried."""
    client = anthropic_client(proxy.url, "sk-ant-client")
    try:
        raw = client.messages.with_raw_response.count_tokens(
            model=MODEL,
            system=SYSTEM,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            thinking=THINKING,  # type: ignore[arg-type]
            messages=session.sent[-1],  # type: ignore[arg-type]
            extra_body={"context_management": CONTEXT_MANAGEMENT},
        )
    finally:
        client.close()
    shown = {k: v for k, v in raw.headers.items() if k.startswith("x-compaction-")}
    assert raw.headers["x-compaction-strategies"] == "checkpoint", shown  # as the request
    assert raw.parse().input_tokens == prompt_tokens(session.usages[-1]), shown


# ------------------------------------------------------------------ compact and retry


@pytest.fixture
def liar(fake: MessagesUpstreamServer) -> Iterator[MessagesUpstreamServer]:
    fake.reset()
    yield fake
    fake.reset()


def history(steps: int = 36) -> list[dict[str, Any]]:
    """About 33k tokens of tool steps: past the liar's 12k window, far inside the 128k the
    proxy assumes for a model it does not know (a `models:` entry would win over what is
    learned: the operator's word is final)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Find why the build is slow."}]}
    ]
    for step in range(steps):
        ids = [f"toolu_{step}_{n}" for n in range(2 if step % 4 == 3 else 1)]
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {step}."},
                    *(
                        {"type": "tool_use", "id": i, "name": "Bash", "input": {"command": i}}
                        for i in ids
                    ),
                ],
            }
        )
        output = "".join(f"{step} line {n}: building target {n} ... ok\n" for n in range(60))
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": i, "content": output} for i in ids
                ],
            }
        )
    return messages


def ask(
    client: anthropic.Anthropic, model: str, messages: list[dict[str, Any]], *, stream: bool
) -> tuple[Headers, anthropic.types.Message]:
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": 1_024,
        "tools": TOOLS[:1],
        "messages": messages,
        "extra_headers": {"x-fake-tag": CLIENT},  # the fake's events tell its attempts apart
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            return events.response.headers, events.get_final_message()
    raw = post_raw(client, "/v1/messages", Message, **kwargs)
    return raw.headers, raw.parse()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("style", ["anthropic", "llamacpp", "vllm", "413"])
def test_a_refusal_is_compacted_away_retried_and_learned(
    proxy: ProxyServer, liar: MessagesUpstreamServer, style: str, stream: bool
) -> None:
    model = f"liar-{style}-{'stream' if stream else 'json'}"  # nothing learned by another test
    liar.control(model_context_windows={model: LIAR_WINDOW}, refusal_style=style)
    messages = history()
    client = anthropic_client(proxy.url, "sk-ant-client")
    try:
        headers, reply = ask(client, model, messages, stream=stream)
        assert reply.stop_reason == "tool_use" or reply.content  # an answer, not an error
        taken = liar.take()
        attempts = [r for r in taken if r.path == MESSAGES and not is_summary_call(r)]
        retries = int(headers["x-compaction-retry"])
        # A refusal that states the window is fixed by one retry; a 413 states no number, so
        # the proxy shrinks from its own count of what was refused, at most twice.
        assert retries == 1 if style != "413" else retries in (1, 2)
        assert len(attempts) == 1 + retries
        assert attempts[0].json()["messages"] == messages  # the client's request, first
        for before, after in itertools.pairwise(attempts):
            assert len(after.body) < len(before.body)
        retried = attempts[-1].json()
        assert retried["messages"][-2:] == messages[-2:]
        assert_pairing(retried["messages"])
        assert prompt_tokens(reply.usage) <= LIAR_WINDOW
        refused = [e for e in liar.events() if e["type"] == "refused"]
        assert len([e for e in refused if e["tag"] == CLIENT]) == retries
        assert {e["style"] for e in refused} == {style}
        summaries = [e for e in refused if e["tag"] != CLIENT]
        if style == "413":
            # The summary call made for a retry is sized for the same guess, and may be refused
            # too; it is then made once more, smaller, and no more: at most two refusals per
            # retry (a 413 states no number to size the second one by).
            assert len(summaries) <= 2 * retries
        else:  # the proxy says what it learned, and sized its summary call for it
            assert summaries == []
            warnings = headers.get_list("x-compaction-warning")
            assert any(f"window {LIAR_WINDOW}" in w for w in warnings), warnings

        # The next request of the conversation is budgeted for what was learned: no refusal.
        liar.clear()
        follow = [
            *messages,
            {"role": "assistant", "content": [{"type": "text", "text": "Nothing yet."}]},
            {"role": "user", "content": [{"type": "text", "text": "Look again."}]},
        ]
        headers, reply = ask(client, model, follow, stream=stream)
        attempts = [r for r in liar.take() if r.path == MESSAGES and not is_summary_call(r)]
        assert len(attempts) == 1 and "x-compaction-retry" not in headers
        assert [e for e in liar.events() if e["type"] in ("refused", "rejected")] == []
    finally:
        client.close()
