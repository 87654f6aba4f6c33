"""A fake Responses API upstream: the fake OpenAI upstream plus ``POST /v1/responses``.

It is the fake of tests/fakes/upstream.py (chat completions for the summarizer, recorded
requests, ``/_control``, the context window and refusal styles) with a Responses endpoint in
front, which holds a stateless Responses client to the rules OpenAI's servers enforce, so a
test learns on the wire whether what the proxy forwarded would have been accepted:

- the prompt (instructions, every input item, tools) plus ``max_output_tokens`` must fit the
  window, else a 400 ``context_length_exceeded`` in OpenAI's Responses wording ("Your input
  exceeds the context window of this model"), or in ``refusal_style``'s when not ``openai``;
- every ``function_call``/``custom_tool_call`` has its output later in ``input``, and every
  output has its call before it ("No tool output found for function call ...");
- a reasoning item travels with the items of its response: the fake's own reasoning
  ``rs_fake<n>`` must directly precede the first item of response ``n``, and no item of
  response ``n`` may come without it (OpenAI: "... was provided without its required
  'reasoning' item").

Replies: a last user message asking ``QUESTION: what is KEY-n?`` is the scripted model's
recall (tests/fakes/recall_policy.py): it answers from the prompt, or calls
``compaction_recall`` (a ``function_call`` item) when the fact is not there and the tool is
declared, and answers from the ``function_call_output`` of that call on the next round. When
the last item is a user message asking to "call tool", or a tool output in an agent loop (a
user message says "keep calling tools"), every function tool but ``compaction_recall`` is
called (parallel calls: a model calls the recall tool only when it needs a fact); after tool
outputs otherwise, the text echoes them; else it echoes the last user message. Every reply
starts with a reasoning item carrying ``encrypted_content``. With ``stream: true`` the reply
is the API's typed SSE events, ``response.completed`` last.

Run it alone with ``python -m tests.support.responses_upstream --port 8002``.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes import recall_policy
from tests.fakes import upstream as base
from tests.support.processes import ServerProcess, python_module_argv
from tests.support.servers import UpstreamServer

RESPONSES = "/v1/responses"
OVERFLOW_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
_OWN_ITEM = re.compile(r"^(?:fc|msg)_fake(\d+)(?:_\d+)?$")
_OWN_REASONING = re.compile(r"^rs_fake(\d+)$")
_CALLS = {"function_call", "custom_tool_call"}
_OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}


def create_app(**options: Any) -> Starlette:
    """The fake upstream (same options) with ``POST /v1/responses`` in front."""
    app = base.create_app(**options)
    fake: base.FakeUpstream = app.state.fake
    numbers = itertools.count(1)

    async def responses(request: Request) -> Any:
        body = await request.body()
        fake.record(request, body)
        refused = base.key_refusal(fake, request)
        if refused is not None:
            return refused
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error("We could not parse the JSON body of your request.", None)
        if not isinstance(payload, dict):
            return _error("The request body must be a JSON object.", None)
        items = input_items(payload)
        problem = input_problem(items)
        if problem is not None:
            return _error(problem, "input")
        model = payload.get("model") if isinstance(payload.get("model"), str) else ""
        prompt = count_input(fake.counter, payload, items)
        window = fake.settings.window_for(model)
        limit = payload.get("max_output_tokens")
        requested = prompt + (limit if isinstance(limit, int) else 0)
        if window is not None and requested > window:
            if fake.settings.refusal_style == "openai":
                return _error(OVERFLOW_MESSAGE, "input", "context_length_exceeded")
            return base.refusal(fake.settings.refusal_style, window, prompt, requested)
        number = next(numbers)
        output = reply_items(number, payload, items)
        response = response_object(number, payload, output, prompt, fake.counter)
        if payload.get("stream"):
            return base.EventStreamResponse(fake, request, stream_events(response))
        return Response(
            orjson.dumps(response),
            media_type="application/json",
            headers={"x-request-id": f"req_resp_fake{number}"},
        )

    app.router.routes.insert(0, Route(RESPONSES, responses, methods=["POST"]))
    return app


def _error(message: str, param: str | None, code: str | None = None) -> Response:
    return base.error_response(400, message, "invalid_request_error", code, param)


# --------------------------------------------------------------------------- the rules


def input_items(payload: dict[str, Any]) -> list[Any]:
    value = payload.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return value if isinstance(value, list) else []


def input_problem(items: Sequence[Any]) -> str | None:
    """What OpenAI would refuse in a stateless ``input``, in its words; None when valid."""
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            return f"Invalid type for 'input[{index}]': expected an object."
        kind = item.get("type")
        call_id = item.get("call_id")
        if kind in _CALLS and isinstance(call_id, str):
            calls[call_id] = kind
        elif kind in _OUTPUTS:
            if calls.get(call_id) != _OUTPUTS[kind]:
                return f"No tool call found for {kind} with call_id {call_id}."
            answered.add(call_id)
        problem = _reasoning_problem(items, index, item)
        if problem is not None:
            return problem
    missing = [call_id for call_id in calls if call_id not in answered]
    if missing:
        return f"No tool output found for function call {missing[0]}."
    return None


def _reasoning_problem(items: Sequence[Any], index: int, item: dict[str, Any]) -> str | None:
    item_id = item.get("id")
    if not isinstance(item_id, str):
        return None
    own = _OWN_REASONING.match(item_id)
    if own is not None:
        following = items[index + 1] if index + 1 < len(items) else None
        after = following.get("id") if isinstance(following, dict) else None
        match = _OWN_ITEM.match(after) if isinstance(after, str) else None
        if match is None or match.group(1) != own.group(1):
            return (
                f"Item '{item_id}' of type 'reasoning' was provided without its required "
                "following item."
            )
        return None
    own = _OWN_ITEM.match(item_id)
    if own is not None:
        reasoning = f"rs_fake{own.group(1)}"
        before = [i.get("id") for i in items[:index] if isinstance(i, dict)]
        if reasoning not in before:
            return (
                f"Item '{item_id}' of type '{item.get('type')}' was provided without its "
                f"required 'reasoning' item: '{reasoning}'."
            )
    return None


def count_input(counter: base.TokenCounter, payload: dict[str, Any], items: list[Any]) -> int:
    """The prompt's tokens: instructions, every item counted like a chat message, tools."""
    instructions = payload.get("instructions")
    head = [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
    return counter.messages([*head, *items], payload.get("tools"))


# --------------------------------------------------------------------------- replies


def _text(item: Any) -> str:
    return base.message_text(item)


def reply_items(number: int, payload: dict[str, Any], items: list[Any]) -> list[dict[str, Any]]:
    """Reasoning first, then tool calls or a message (see the module docstring)."""
    output: list[dict[str, Any]] = [
        {
            "type": "reasoning",
            "id": f"rs_fake{number}",
            "summary": [],
            "encrypted_content": f"gAAAAB-fake-reasoning-{number}",
        }
    ]
    recall = recall_items(number, payload, items)
    if recall is not None:
        return [*output, *recall]
    last = items[-1] if items else None
    tools = [t for t in payload.get("tools") or () if isinstance(t, dict)]
    functions = [
        t
        for t in tools
        if t.get("type") == "function" and t.get("name") != recall_policy.RECALL_TOOL
    ]
    users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
    if functions and isinstance(last, dict) and _wants_calls(last, users):
        for index, tool in enumerate(functions):
            arguments = orjson.dumps({"index": index, "step": number}).decode()
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_fake{number}_{index}",
                    "call_id": f"call_fake{number}_{index}",
                    "name": tool.get("name", f"tool_{index}"),
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        return output
    trailing = []
    for item in reversed(items):
        if not isinstance(item, dict) or not str(item.get("type", "")).endswith("_output"):
            break
        trailing.append(str(item.get("output")))
    if trailing:
        text = "echo tool results: " + " | ".join(reversed(trailing))
    else:
        text = "echo: " + (_text(users[-1]) if users else "")
    output.append(
        {
            "type": "message",
            "id": f"msg_fake{number}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text[:220], "annotations": []}],
        }
    )
    return output


def recall_items(
    number: int, payload: dict[str, Any], items: list[Any]
) -> list[dict[str, Any]] | None:
    """The scripted model's recall (tests/fakes/recall_policy.py) in the Responses form: the
    output items after the reasoning, or None when the last user message asks nothing.

    The question is the last user message; the recall results are the outputs of the
    ``compaction_recall`` calls after it; everything else (instructions, messages, the other
    outputs) is what the model sees."""
    question = next(
        (
            i
            for i in range(len(items) - 1, -1, -1)
            if isinstance(items[i], dict) and items[i].get("role") == "user"
        ),
        None,
    )
    if question is None or recall_policy.QUESTION.search(_text(items[question])) is None:
        return None
    recall_calls = {
        item.get("call_id")
        for item in items[question + 1 :]
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") == recall_policy.RECALL_TOOL
    }
    recalled: list[str] | None = None
    shown: list[str] = []
    instructions = payload.get("instructions")
    if isinstance(instructions, str):
        shown.append(instructions)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            text = _output_text(item.get("output"))
            if index > question and item.get("call_id") in recall_calls:
                recalled = [*(recalled or []), text]
            else:
                shown.append(text)
        else:
            shown.append(_text(item))
    tools = [t for t in payload.get("tools") or () if isinstance(t, dict)]
    names = [t.get("name") for t in tools if t.get("type") == "function"]
    decision = recall_policy.decide(
        _text(items[question]),
        "\n".join(shown),
        recalled,
        offered=recall_policy.RECALL_TOOL in names,
        may_call=payload.get("tool_choice") != "none",
    )
    if decision is None:
        return None
    if isinstance(decision, recall_policy.Answer):
        return [
            {
                "type": "message",
                "id": f"msg_fake{number}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": decision.text, "annotations": []}],
            }
        ]
    calls = [(recall_policy.RECALL_TOOL, decision.arguments, f"call_rc{number}")]
    own = next((n for n in names if n != recall_policy.RECALL_TOOL), None)
    if decision.with_client_tool and isinstance(own, str):
        calls.append((own, "{}", f"call_own{number}"))
    return [
        {
            "type": "function_call",
            "id": f"fc_fake{number}_{index}",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
        for index, (name, arguments, call_id) in enumerate(calls)
    ]


def _output_text(output: Any) -> str:
    """A tool output's text: a string, or the text parts of a list of content parts."""
    if isinstance(output, str):
        return output
    return base.message_text({"content": output})


def _wants_calls(last: dict[str, Any], users: list[Any]) -> bool:
    """A user message asking to "call tool", or a tool output in an agent loop (a user message
    says "keep calling tools")."""
    if last.get("role") == "user":
        return "call tool" in _text(last)
    return str(last.get("type", "")).endswith("_output") and any(
        "keep calling tools" in _text(u) for u in users
    )


def response_object(
    number: int,
    payload: dict[str, Any],
    output: list[dict[str, Any]],
    prompt: int,
    counter: base.TokenCounter,
) -> dict[str, Any]:
    completion = sum(counter.text(orjson.dumps(item).decode()) for item in output[1:])
    return {
        "id": f"resp_fake{number}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "model": payload.get("model"),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": payload.get("previous_response_id"),
        "reasoning": {"effort": "medium", "summary": None},
        "store": payload.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice", "auto"),
        "tools": payload.get("tools") or [],
        "top_p": 1.0,
        "truncation": payload.get("truncation", "disabled"),
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        "user": None,
        "metadata": {},
    }


async def stream_events(response: dict[str, Any]) -> AsyncIterator[bytes]:
    """The typed SSE events of ``response``, in the API's order."""
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        yield event("response.output_item.added", output_index=index, item=_opened(item))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", **where, part=empty)
            for piece in [text[i : i + 16] for i in range(0, len(text), 16)]:
                yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part=item["content"][0])
        elif item["type"] == "function_call":
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done", **where, arguments=item["arguments"]
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


def _opened(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as ``response.output_item.added`` shows it: nothing produced yet."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item


# --------------------------------------------------------------------------- process


class ResponsesUpstreamServer(UpstreamServer):
    """This fake as a child process; the handle of the chat fake, whose routes it keeps."""

    def __init__(self, log_path: Path, context_window: int | None = None, name: str = "responses"):
        extra = [] if context_window is None else ["--context-window", str(context_window)]
        ServerProcess.__init__(
            self,
            name,
            lambda port: python_module_argv(
                "tests.support.responses_upstream",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *extra,
            ),
            log_path,
            ready_path="/_control",
        )
        self._client = None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.responses_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--context-window", type=int, default=None)
    args = parser.parse_args(argv)

    import uvicorn

    uvicorn.run(
        create_app(context_window=args.context_window),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
