"""The fake's "model": policies that decide each reply from the request alone.

A policy is ``fn(Turn) -> Reply | None``; the first one that answers wins (tests put their own
in front with ``create_app(policies=[...])``). The built-in chain:

1. :func:`summary_policy` answers a summary request: Claude Code's own compaction prompt ("Your
   task is to create a detailed summary of the conversation so far"), the proxy's marked
   checkpoint instruction, or a transcript in ``<conversation>`` tags. The summary lists every
   ``FACT-...`` token and the ``fake-loop:`` task it can see, and the loop's progress as
   ``fake-progress: step=N``, so a loop picks up where it was after a summary.
2. :func:`recall_policy`: a last user message containing ``fake-recall`` is answered with every
   ``FACT-...`` token visible in the prompt (system, messages, tool results), in order.
3. :func:`question_policy`: the scripted model's use of the proxy's recall tool
   (tests/fakes/recall_policy.py): the last user text asking ``QUESTION: what is KEY-n?`` is
   answered from the prompt, or with a ``tool_use`` of ``compaction_recall`` when the fact is
   not there and the tool is declared (and ``tool_choice`` is not ``{"type": "none"}``), and
   answered from that call's ``tool_result`` on the next round.
4. :func:`loop_policy`: an agent loop scripted by a ``fake-loop: steps=N [lines=L] [parallel=P]
   [every=K] [tool=NAME]`` directive in a user message (or the server's ``loop_steps``): while
   fewer than N steps are answered, the reply calls the tool (Bash when offered, else the first
   tool) ``parallel`` times (on every K-th step only, one call on the others, with ``every``);
   then it says ``fake-loop done``. For Bash the command is harmless and
   its output about ``lines`` lines long (``seq`` into a file in the working directory, then
   ``cat``), with ``FACT-S<k>`` echoed every tenth step. The step count comes from the request
   (answered tool uses of this fake, ids ``toolu_fake_<step>_<call>_<n>``, and progress markers
   in summaries), never from server state, so it survives any compaction that keeps the latest
   turn.
5. :func:`echo_policy`: echoes the last user text (or the trailing tool results).

Thinking is added by the server, not by policies: see ``thinking`` in the app settings.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes import recall_policy as scripted
from tests.fakes.messages.prompt import content_blocks, system_blocks

FACT = re.compile(r"FACT-[A-Za-z0-9]+")
DIRECTIVE = re.compile(r"fake-loop:((?:\s+\w+=[\w-]+)+)")
PROGRESS = re.compile(r"fake-progress: step=(\d+)")
OWN_TOOL_ID = re.compile(r"^toolu_fake_(\d+)_(\d+)_\d+$")
CHECKPOINT_MARKER = "[compaction-proxy: checkpoint request]"
"""First line of the proxy's cache-aligned summary instruction
(compaction_proxy/summarizer/_prefix.py)."""
CLAUDE_CODE_SUMMARY = re.compile(
    r"(create|write) a detailed summary of the (conversation|transcript)", re.IGNORECASE
)
ECHO_LIMIT = 200


@dataclass
class Text:
    text: str


@dataclass
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = ""


@dataclass
class Thinking:
    text: str


@dataclass
class RedactedThinking:
    pass


Block = Text | ToolUse | Thinking | RedactedThinking


@dataclass
class Reply:
    blocks: list[Block] = field(default_factory=list)
    stop_reason: str | None = None  # derived from the blocks when None

    @property
    def stop(self) -> str:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"


@dataclass
class Turn:
    """What a policy sees: the parsed body, the headers and the counted prompt."""

    body: dict[str, Any]
    headers: dict[str, str]
    input_tokens: int
    loop_steps: int | None = None
    loop_lines: int = 120

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for m in self.body.get("messages") or [] if isinstance(m, dict)]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t for t in self.body.get("tools") or [] if isinstance(t, dict)]

    def texts(self, roles: Sequence[str] = ("user", "assistant", "system")) -> list[str]:
        """Every text the model can read, in prompt order (system, then messages)."""
        out = [str(b.get("text", "")) for b in system_blocks(self.body.get("system"))]
        for message in self.messages:
            if message.get("role") in roles:
                out.extend(block_text(b) for b in content_blocks(message.get("content")))
        return out

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                parts = [
                    b.get("text", "")
                    for b in content_blocks(message.get("content"))
                    if b.get("type") == "text"
                ]
                if parts:
                    return "\n".join(str(p) for p in parts)
        return ""


def block_text(block: Any) -> str:
    """The readable text of a block: text, tool results' text, tool inputs as JSON."""
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_result":
        return "\n".join(block_text(part) for part in content_blocks(block.get("content", "")))
    if kind == "tool_use":
        return str(block.get("input", ""))
    return ""


Policy = Callable[[Turn], "Reply | Awaitable[Reply | None] | None"]

_ids = itertools.count(1)


def facts(turn: Turn) -> list[str]:
    return list(dict.fromkeys(FACT.findall("\n".join(turn.texts()))))


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class Loop:
    steps: int
    lines: int = 120
    parallel: int = 1
    tool: str | None = None
    every: int = 1  # parallel calls on every `every`-th step, one call on the others

    def directive(self) -> str:
        tool = f" tool={self.tool}" if self.tool else ""
        every = f" every={self.every}" if self.every != 1 else ""
        return (
            f"fake-loop: steps={self.steps} lines={self.lines} parallel={self.parallel}"
            f"{every}{tool}"
        )

    def calls(self, step: int) -> int:
        return self.parallel if step % self.every == 0 else 1


def loop_of(turn: Turn) -> Loop | None:
    """The directive in the conversation (the first one wins), or the server's default."""
    for text in turn.texts(("user", "system")):
        match = DIRECTIVE.search(text)
        if match is None:
            continue
        fields = dict(item.split("=", 1) for item in match.group(1).split())
        try:
            return Loop(
                steps=int(fields.get("steps", "10")),
                lines=int(fields.get("lines", str(turn.loop_lines))),
                parallel=max(1, int(fields.get("parallel", "1"))),
                tool=fields.get("tool"),
                every=max(1, int(fields.get("every", "1"))),
            )
        except ValueError:
            return None
    if turn.loop_steps is not None:
        return Loop(steps=turn.loop_steps, lines=turn.loop_lines)
    return None


def progress(turn: Turn) -> int:
    """The highest step whose tool uses were answered, or a summary said was reached."""
    done = 0
    answered = {
        str(block.get("tool_use_id"))
        for message in turn.messages
        if message.get("role") == "user"
        for block in content_blocks(message.get("content"))
        if block.get("type") == "tool_result"
    }
    for tool_id in answered:
        match = OWN_TOOL_ID.match(tool_id)
        if match is not None:
            done = max(done, int(match.group(1)))
    for text in turn.texts():
        for found in PROGRESS.findall(text):
            done = max(done, int(found))
    return done


def bash_command(step: int, lines: int) -> str:
    """A harmless command printing about ``lines`` lines, in the session's working directory."""
    fact = f" && echo FACT-S{step}" if step % 10 == 0 else ""
    return (
        f"mkdir -p fake-steps && seq -f 'step {step} line %g: lorem ipsum dolor sit amet, "
        f"consectetur adipiscing elit' 1 {lines} > fake-steps/step-{step}.txt && "
        f"cat fake-steps/step-{step}.txt{fact}"
    )


def loop_policy(turn: Turn) -> Reply | None:
    loop = loop_of(turn)
    if loop is None or not turn.tools:
        return None
    done = progress(turn)
    if done >= loop.steps:
        seen = ", ".join(facts(turn)) or "none"
        return Reply([Text(f"fake-loop done: {loop.steps} steps. Facts: {seen}.")])
    names = [str(t.get("name")) for t in turn.tools]
    name = loop.tool if loop.tool in names else ("Bash" if "Bash" in names else names[0])
    step = done + 1
    calls: list[Block] = []
    for call in range(loop.calls(step)):
        if name == "Bash":
            arguments: dict[str, Any] = {
                "command": bash_command(step, loop.lines),
                "description": f"Run step {step} of {loop.steps}",
            }
        else:
            arguments = {"step": step, "call": call, "note": f"fake-loop step {step}"}
        calls.append(ToolUse(name, arguments, f"toolu_fake_{step}_{call}_{next(_ids)}"))
    return Reply([Text(f"Step {step} of {loop.steps}."), *calls])


# --------------------------------------------------------------------------- the others


def is_summary_request(turn: Turn) -> bool:
    last = turn.last_user_text()
    return (
        CHECKPOINT_MARKER in last
        or CLAUDE_CODE_SUMMARY.search(last) is not None
        or any("<conversation>" in text for text in turn.texts(("user",)))
    )


def summary_policy(turn: Turn) -> Reply | None:
    if not is_summary_request(turn):
        return None
    loop = loop_of(turn)
    lines = ["## Goal", loop.directive() if loop else "Finish the task.", "", "## Facts"]
    lines += [f"- {fact}" for fact in facts(turn)] or ["- none"]
    lines += ["", "## Progress", f"fake-progress: step={progress(turn)}"]
    return Reply([Text("<summary>\n" + "\n".join(lines) + "\n</summary>")])


def recall_policy(turn: Turn) -> Reply | None:
    if "fake-recall" not in turn.last_user_text():
        return None
    return Reply([Text("Facts: " + (", ".join(facts(turn)) or "none"))])


def question_policy(turn: Turn) -> Reply | None:
    """See the module docstring. The question is the last user message with text (a message
    of tool results alone is not one); the recall results are the ``tool_result`` blocks that
    answer the ``compaction_recall`` calls after it; everything else is what the model sees.
    The ``tool_use`` ids are the fake's own (``toolu_fake_0_0_<n>``: step 0 to the loop)."""
    messages = turn.messages
    question = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if messages[i].get("role") == "user" and _text_of(messages[i])
        ),
        None,
    )
    if question is None or scripted.QUESTION.search(_text_of(messages[question])) is None:
        return None
    calls = {
        str(block.get("id"))
        for message in messages[question + 1 :]
        if message.get("role") == "assistant"
        for block in content_blocks(message.get("content"))
        if isinstance(block, dict)
        and block.get("type") == "tool_use"
        and block.get("name") == scripted.RECALL_TOOL
    }
    recalled: list[str] | None = None
    shown = [str(b.get("text", "")) for b in system_blocks(turn.body.get("system"))]
    for index, message in enumerate(messages):
        if message.get("role") not in ("user", "assistant", "system"):
            continue
        for block in content_blocks(message.get("content")):
            answers = isinstance(block, dict) and block.get("type") == "tool_result"
            if answers and index > question and str(block.get("tool_use_id")) in calls:
                recalled = [*(recalled or []), block_text(block)]
            else:
                shown.append(block_text(block))
    names = [str(t.get("name")) for t in turn.tools]
    choice = turn.body.get("tool_choice")
    decision = scripted.decide(
        _text_of(messages[question]),
        "\n".join(shown),
        recalled,
        offered=scripted.RECALL_TOOL in names,
        may_call=not (isinstance(choice, dict) and choice.get("type") == "none"),
    )
    if decision is None:
        return None
    if isinstance(decision, scripted.Answer):
        return Reply([Text(decision.text)])
    blocks: list[Block] = [ToolUse(scripted.RECALL_TOOL, _arguments(decision.arguments))]
    own = next((n for n in names if n != scripted.RECALL_TOOL), None)
    if decision.with_client_tool and own is not None:
        blocks.append(ToolUse(own, {}))
    return Reply(blocks)


def _text_of(message: dict[str, Any]) -> str:
    """The text blocks of a message (its string content), joined."""
    return "\n".join(
        str(b.get("text", ""))
        for b in content_blocks(message.get("content"))
        if isinstance(b, dict) and b.get("type") == "text"
    )


def _arguments(text: str) -> dict[str, Any]:
    value = orjson.loads(text)
    assert isinstance(value, dict), text
    return value


def echo_policy(turn: Turn) -> Reply:
    messages = turn.messages
    if messages and messages[-1].get("role") == "user":
        results = [
            block_text(b)
            for b in content_blocks(messages[-1].get("content"))
            if b.get("type") == "tool_result"
        ]
        if results:
            return Reply([Text(("echo tool results: " + " | ".join(results))[:220])])
    return Reply([Text("echo: " + turn.last_user_text()[:ECHO_LIMIT])])


BUILTIN: tuple[Policy, ...] = (
    summary_policy,
    recall_policy,
    question_policy,
    loop_policy,
    echo_policy,
)


async def decide(policies: Sequence[Policy], turn: Turn) -> Reply:
    for policy in (*policies, *BUILTIN):
        reply = policy(turn)
        if inspect.isawaitable(reply):
            reply = await reply
        if reply is not None:
            return reply
    raise AssertionError("echo_policy always answers")  # pragma: no cover
