"""Long sessions that check what compaction keeps: summaries, facts and the user's own words.

Used by `tests/integration/test_trust.py` and `bench/session.py --matrix` (through real
processes, with the official SDK) and by `tests/unit/test_seed_sessions.py` (in one process,
tests/support/in_process.py). Two shapes, both deterministic:

- `chat`: turns of two requests each, as a chat client with tools makes them: the user's
  message (which states a rule, `keep RULE-<n> as it is`), then the same list plus the
  model's tool call and its result (~900 tokens by default; every third one opens with a
  `FACT-...` token). The model's short answer closes the turn.
- `loop`: one task message (which states a rule), then one tool step per request in the same
  turn, as a coding agent sends them.

Every request's forwarded body (what the upstream received), its `X-Compaction-*` headers and
the summarizer calls it caused are recorded; :class:`TrustReport` turns them into the figures
the tests assert and the bench reports.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import openai

from tests.support.agent_session import CHAT, TOOLS, is_summarizer_text, tool_output
from tests.support.in_process import InProcess
from tests.support.sdk_chat import create_raw
from tests.support.servers import UpstreamControl

Shape = Literal["chat", "loop"]

SYSTEM = {"role": "system", "content": "You are a careful coding agent. Use the tools."}
SUMMARY_OPEN = "<summary>"
RULE = re.compile(r"RULE-\d+")
FACT = re.compile(r"FACT-[A-Z0-9]+")

LIBRECHAT_BLOCK: dict[str, Any] = {
    "provider": "openAI",
    "model": "gpt-4o-mini",
    "maxSummaryTokens": 4096,
    "reserveRatio": 0.05,
    "trigger": {"type": "token_ratio", "value": 0.8},
    "contextPruning": {
        "enabled": True,
        "keepLastAssistants": 3,
        "softTrimRatio": 0.3,
        "hardClearRatio": 0.5,
        "minPrunableToolChars": 50000,
        "softTrim": {"maxChars": 4000, "headChars": 1500, "tailChars": 1500},
        "hardClear": {"enabled": True, "placeholder": "[Old tool result content cleared]"},
    },
}
"""LibreChat's `summarization:` example, exactly as its docs give it."""
LIBRECHAT_UPSTREAM = "openAI"
"""The block's `provider`: the upstream the summary calls go to (here the fake)."""


@dataclass
class TrustStep:
    """One request and what came of it."""

    index: int
    raw: list[dict[str, Any]]  # what the client sent
    forwarded: list[dict[str, Any]]  # what the upstream received
    checkpoint: str
    strategies: list[str]
    warnings: list[str]
    prompt_tokens: int
    summarizer_calls: int

    @property
    def has_summary(self) -> bool:
        return any(_text(m).startswith(SUMMARY_OPEN) for m in self.forwarded)

    @property
    def text(self) -> str:
        return "\n".join(_text(m) for m in self.forwarded)


@dataclass
class TrustReport:
    shape: Shape
    steps: list[TrustStep] = field(default_factory=list)
    facts_shown: list[str] = field(default_factory=list)
    rules_stated: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.steps)

    @property
    def summarizer_calls(self) -> int:
        return sum(s.summarizer_calls for s in self.steps)

    @property
    def events(self) -> int:
        return sum(1 for s in self.steps if s.checkpoint == "new")

    def after_first_summary(self) -> list[TrustStep]:
        first = next((i for i, s in enumerate(self.steps) if s.has_summary), None)
        return [] if first is None else self.steps[first + 1 :]

    def summary_share(self) -> float | None:
        """Of the requests after the first one forwarded with a summary, the share with one."""
        later = self.after_first_summary()
        return sum(s.has_summary for s in later) / len(later) if later else None

    def false_summary_reports(self) -> list[int]:
        """Requests whose headers name summarization while what was forwarded holds none."""
        return [
            s.index for s in self.steps if "summarization" in s.strategies and not s.has_summary
        ]

    def carried(self, tokens: list[str]) -> float:
        """The share of `tokens` present somewhere in the last forwarded request."""
        if not tokens or not self.steps:
            return 1.0
        text = self.steps[-1].text
        return sum(1 for t in tokens if t in text) / len(tokens)

    def facts_carried(self) -> float:
        return self.carried(self.facts_shown)

    def rules_carried(self) -> float:
        return self.carried(self.rules_stated)

    def stable_share(self) -> float:
        flags = [
            after.forwarded[: len(before.forwarded)] == before.forwarded
            for before, after in itertools.pairwise(self.steps)
        ]
        return sum(flags) / len(flags) if flags else 1.0


def rule_message(turn: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Turn {turn}: keep RULE-{turn} as it is. Now check module {turn}.",
    }


def _call(turn: int) -> dict[str, Any]:
    return {
        "id": f"call_{turn}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{turn}.py"})},
    }


def _result(turn: int, chars: int, report: TrustReport) -> dict[str, Any]:
    content = tool_output(turn, 0, chars)
    if turn % 3 == 0:
        fact = f"FACT-R{turn}"
        report.facts_shown.append(fact)
        content = f"Found {fact} in the config.\n" + content
    return {"role": "tool", "tool_call_id": f"call_{turn}", "content": content}


def session_requests(
    report: TrustReport, shape: Shape, requests: int, tool_chars: int
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The conversation to send at each request of `shape`, as `(index, conversation)`; the
    next one is built once the caller resumes (after it sent this one)."""
    conversation: list[dict[str, Any]] = [SYSTEM]
    if shape == "loop":
        conversation.append(rule_message(0))
        report.rules_stated.append("RULE-0")
        for index in range(requests):
            yield index, conversation
            conversation.append(
                {"role": "assistant", "content": None, "tool_calls": [_call(index)]}
            )
            conversation.append(_result(index, tool_chars if index % 2 == 0 else 260, report))
        return
    turn = 0
    for index in range(requests):
        if index % 2 == 0:
            conversation.append(rule_message(turn))
            report.rules_stated.append(f"RULE-{turn}")
        yield index, conversation
        if index % 2 == 0:
            conversation.append({"role": "assistant", "content": None, "tool_calls": [_call(turn)]})
            conversation.append(_result(turn, tool_chars, report))
        else:
            conversation.append(
                {"role": "assistant", "content": f"Module {turn} checked; nothing to change."}
            )
            turn += 1


def record_step(
    report: TrustReport,
    index: int,
    conversation: list[dict[str, Any]],
    headers: httpx.Headers,
    received: list[str],
    prompt_tokens: int,
) -> None:
    """One request's figures: `received` is what the upstream got for it (the forwarded request
    and the summarizer calls it caused)."""
    forwarded = [json.loads(text) for text in received if not is_summarizer_text(text)]
    assert len(forwarded) >= 1, f"request {index}: nothing forwarded"
    strategies = headers.get("x-compaction-strategies", "")
    report.steps.append(
        TrustStep(
            index=index,
            raw=list(conversation),
            forwarded=forwarded[-1]["messages"],
            checkpoint=headers.get("x-compaction-checkpoint", ""),
            strategies=[s for s in strategies.split(",") if s and s != "none"],
            warnings=headers.get_list("x-compaction-warning"),
            prompt_tokens=prompt_tokens,
            summarizer_calls=sum(1 for text in received if is_summarizer_text(text)),
        )
    )


def run_trust_session(
    client: openai.OpenAI,
    upstream: UpstreamControl,
    *,
    model: str,
    shape: Shape,
    requests: int,
    tool_chars: int = 2_100,
) -> TrustReport:
    """Drive `requests` requests of `shape` through the proxy (see the module docstring)."""
    report = TrustReport(shape)
    upstream.clear()
    for index, conversation in session_requests(report, shape, requests, tool_chars):
        raw = create_raw(client, model=model, messages=conversation, tools=TOOLS)
        completion = raw.parse()
        recorded = upstream.take(CHAT)  # read and cleared at once: no call is lost
        usage = completion.usage.prompt_tokens if completion.usage else 0
        record_step(report, index, conversation, raw.headers, [r.text for r in recorded], usage)
    return report


async def run_trust_session_in_process(
    proxy: InProcess, *, model: str, shape: Shape, requests: int, tool_chars: int = 2_100
) -> TrustReport:
    """The same session through an in-process proxy (tests/support/in_process.py)."""
    report = TrustReport(shape)
    proxy.take()
    for index, conversation in session_requests(report, shape, requests, tool_chars):
        exchange = await proxy.chat({"model": model, "messages": conversation, "tools": TOOLS})
        response = exchange.response
        assert response.status_code == 200, (index, response.text)
        usage = response.json().get("usage") or {}
        received = [body.decode("utf-8", "replace") for body in exchange.received]
        record_step(
            report, index, conversation, response.headers, received, usage.get("prompt_tokens", 0)
        )
    return report


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""
