"""Known traffic for the observability tests: what was sent, and what the client saw of it."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.agent_session import TOOLS as AGENT_TOOLS
from tests.support.agent_session import is_summarizer_text

CHAT = "/v1/chat/completions"
AGENT_MODEL = "agent-model"
WINDOW = 8_000
MODELS_CONFIG = {AGENT_MODEL: {"context_window": WINDOW, "max_output_tokens": 1_000}}
TOOLS = AGENT_TOOLS[:1]  # read_file only


def agent_conversation(steps: int, topic: str = "parser") -> list[dict[str, Any]]:
    """A coding-agent conversation: a user turn every other step, large tool outputs.

    Long enough (about 20 steps for an 8,000-token window) it triggers the default pipeline,
    summarization included.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a careful coding agent working on the {topic}."},
        {"role": "user", "content": f"Fix the flaky {topic} test. The ticket is FACT-T0."},
    ]
    for step in range(steps):
        if step % 2 == 1:
            # Long enough that collapsing old tool results alone (2 % of the budget each)
            # does not reach the target: the event summarizes.
            progress = f"Progress after step {step}: " + "checked the module and noted it. " * 20
            messages.append({"role": "assistant", "content": progress})
            messages.append({"role": "user", "content": f"Good. Remember FACT-U{step}. Go on."})
            continue
        call_id = f"call_{topic}_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"src/{topic}_{step}.py"}),
                        },
                    }
                ],
            }
        )
        line = f"line {{}} of {topic} step {step}: value={step * 7}\n"
        body = "".join(line.format(n) for n in range(60))[:1500]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": body})
    return messages


@dataclass
class Sent:
    """One request as the client saw its answer."""

    route: str
    status: int
    headers: httpx.Headers
    prompt_tokens: int | None = None

    @property
    def before(self) -> int | None:
        value = self.headers.get("x-compaction-tokens-before")
        return int(value) if value is not None else None

    @property
    def after(self) -> int | None:
        value = self.headers.get("x-compaction-tokens-after")
        return int(value) if value is not None else None

    @property
    def strategies(self) -> list[str]:
        value = self.headers.get("x-compaction-strategies", "none")
        return [] if value == "none" else value.split(",")

    @property
    def checkpoint(self) -> str | None:
        return self.headers.get("x-compaction-checkpoint")

    @property
    def dry_run(self) -> bool:
        return self.headers.get("x-compaction-dry-run") == "true"


@dataclass
class Traffic:
    """Sends requests through a proxy and keeps what each one answered."""

    client: httpx.Client
    sent: list[Sent] = field(default_factory=list)

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str = AGENT_MODEL,
        headers: dict[str, str] | None = None,
        stream: bool = False,
        **extra: Any,
    ) -> Sent:
        body: dict[str, Any] = {"model": model, "messages": messages, **extra}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        response = self.client.post(CHAT, json=body, headers=headers or {})
        prompt_tokens = None
        if response.status_code == 200:
            if stream:
                prompt_tokens = _sse_prompt_tokens(response.text)
            else:
                prompt_tokens = response.json()["usage"]["prompt_tokens"]
        sent = Sent("chat_completions", response.status_code, response.headers, prompt_tokens)
        self.sent.append(sent)
        return sent

    def passthrough(self, method: str, path: str, **kwargs: Any) -> Sent:
        response = self.client.request(method, path, **kwargs)
        sent = Sent("passthrough", response.status_code, response.headers)
        self.sent.append(sent)
        return sent

    # ------------------------------------------------------------ what is expected

    def chats(self) -> list[Sent]:
        return [s for s in self.sent if s.route == "chat_completions"]

    def requests_by_route_status(self) -> Counter[tuple[str, str]]:
        return Counter((s.route, str(s.status)) for s in self.sent)

    def reported(self) -> list[Sent]:
        return [s for s in self.chats() if s.before is not None]

    def tokens_saved(self) -> int:
        """What the headers say was saved; a dry run forwarded the original and saved nothing."""
        return sum(s.before - s.after for s in self.reported() if not s.dry_run)  # type: ignore[operator]

    def strategy_runs(self) -> Counter[str]:
        return Counter(name for s in self.reported() if not s.dry_run for name in s.strategies)

    def checkpoints(self) -> Counter[str]:
        return Counter(s.checkpoint for s in self.reported() if s.checkpoint)


def _sse_prompt_tokens(text: str) -> int | None:
    found = None
    for line in text.splitlines():
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if isinstance(usage, dict):
                found = usage["prompt_tokens"]
    return found


def summarizer_calls(recorded: list[Any]) -> int:
    """Summarizer calls among the requests an upstream received (the fake frames them)."""
    return sum(
        1
        for r in recorded
        if r.path == CHAT and is_summarizer_text(r.body.decode("utf-8", "replace"))
    )


def parse_metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted label pairs -> value}, via prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def value(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str
) -> float:
    """One sample's value (0 when the labelled child does not exist yet)."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)
