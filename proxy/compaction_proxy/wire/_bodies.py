"""A request body read as what its route expects: a JSON object, a chat-completions request.

Each check says exactly what is wrong in OpenAI's error shape (a 400 naming the parameter), so
a client learns from the proxy what the upstream would have told it.
"""

from __future__ import annotations

from typing import Any

import orjson

from compaction_proxy.compaction import validate_messages
from compaction_proxy.http import bad_request


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says exactly what is wrong with it."""
    data = parse_json_object(raw)
    if "messages" not in data:
        raise bad_request(
            "'messages' is required", param="messages", code="missing_required_parameter"
        )
    if not isinstance(data["messages"], list):
        raise bad_request(
            f"'messages' must be an array, not {type(data['messages']).__name__}",
            param="messages",
            code="invalid_type",
        )
    model = data.get("model")
    if not isinstance(model, str):
        raise bad_request(
            "'model' is required and must be a string"
            if model is None
            else f"'model' must be a string, not {type(model).__name__}",
            param="model",
            code="missing_required_parameter" if model is None else "invalid_type",
        )
    return data


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why it is not one (every route that reads
    its body: chat completions, the Responses API)."""
    if not raw.strip():
        raise bad_request("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise bad_request(
            f"the request body must be a JSON object, not {type(data).__name__}",
            code="invalid_json",
        )
    return data


def validate_chat(data: dict[str, Any], *, start: int = 0) -> None:
    """A 400 for the first bad message; ``start`` leading ones are known to pass
    (:func:`~compaction_proxy.compaction.validate_messages`)."""
    issue = validate_messages(data["messages"], start=start)
    if issue is not None:
        raise bad_request(issue.message, param=issue.param, code="invalid_messages")
