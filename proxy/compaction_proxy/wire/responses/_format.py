"""The Responses API (``POST /v1/responses``) as a wire format
(:class:`~compaction_proxy.wire.format.WireFormat`).

A stateless Responses agent (``store: false``, the whole ``input`` re-sent every turn) grows
exactly as a chat agent does, so its items are shown to the core as chat messages
(:func:`lift`) and the result is mapped back (:func:`lower`); only ``input`` is replaced in the
client's bytes. Summary calls get the plain-text transcript, never the view as a prefix: the
view carries ``input_text`` parts and custom tool calls a strict chat-completions server
refuses. A request that continues server-side state (``previous_response_id``,
``conversation``) goes as sent (:meth:`ResponsesFormat.held_by`). This module is the adapter's
one tie to HTTP (its 400s); the adapter itself stays pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction_proxy.http import bad_request

from .._bodies import parse_json_object
from .._openai import OpenAIReplies
from ..format import BEARER, Lowered, RefusalText, SummaryCall, UpstreamAuth
from ..sse import Event
from ._lift import Lifted, input_items, lift
from ._lower import lower
from ._recall import RESPONSES_RECALL, ResponsesRecall
from ._validation import validate_request

SERVER_STATE_FIELDS = ("previous_response_id", "conversation")
STREAM_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})
"""The events that end a stream (named in ``event:`` and in the data's ``type``)."""


def server_state(body: Mapping[str, Any]) -> str | None:
    """The field through which the request continues server-side history, if any.

    The upstream prepends that history to ``input``; the proxy sees only the new items, so it
    can neither count nor compact the conversation, and forwards the request unchanged.
    """
    return next((name for name in SERVER_STATE_FIELDS if body.get(name) is not None), None)


def is_responses_body(body: Mapping[str, Any]) -> bool:
    """A Responses body (``input``) rather than a chat-completions one (``messages``)."""
    return "input" in body and "messages" not in body


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """The request as a dict, or a 400 that says what is wrong with it.

    ``model`` and ``input`` may be absent (a stored prompt supplies them); the upstream judges
    that. A ``model`` that is not a string is refused here, as chat completions does.
    """
    data = parse_json_object(raw)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(
            f"'model' must be a string, not {type(model).__name__}",
            param="model",
            code="invalid_type",
        )
    return data


@dataclass(frozen=True, slots=True)
class ResponsesView:
    """A Responses body as the core sees it, and the way back to its items."""

    lifted: Lifted
    chat: dict[str, Any]

    def lower(self, messages: Sequence[Mapping[str, Any]]) -> Lowered:
        return lower(self.lifted, messages)


class ResponsesFormat(OpenAIReplies):
    name = "responses"
    api = "responses"
    paths = ("/v1/responses",)
    count_path: str | None = None
    items = "input"
    output_limits = ("max_output_tokens",)
    auth: UpstreamAuth = BEARER
    summary: SummaryCall | None = None  # the summarizer's own (chat) form
    prefix_summaries = False  # the transcript form: the view is not chat completions
    refusals: tuple[RefusalText, ...] = ()
    parse = staticmethod(parse_responses_body)
    recall: ResponsesRecall = RESPONSES_RECALL
    """The format's side of the recall loop (``_recall.py``)."""

    def claims(self, body: Mapping[str, Any]) -> bool:
        return is_responses_body(body)

    def held_by(self, body: Mapping[str, Any]) -> str | None:
        return server_state(body)

    def has_items(self, body: Mapping[str, Any]) -> bool:
        return bool(input_items(body))

    def shown(self, body: Mapping[str, Any]) -> str | None:
        return None  # read from the lifted view

    def ends_stream(self, event: Event) -> bool:
        return event.name in STREAM_ENDS or event.kind in STREAM_ENDS  # the name: no parse

    def stream_error(
        self, message: str, *, type: str, code: str | None, param: str | None, sequence: int
    ) -> bytes:
        """The API's own error event (the SDKs' ``ResponseErrorEvent``), numbered after the
        last event relayed."""
        payload = {
            "type": "error",
            "code": code,
            "message": message,
            "param": param,
            "sequence_number": sequence,
        }
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"

    def lift(self, body: dict[str, Any], *, check: bool = True) -> ResponsesView:
        """The chat-shaped view of ``body``, or a 400 naming what is wrong with its input
        (checked whatever ``check`` says: what is wrong cannot be lifted)."""
        issue = validate_request(body)
        if issue is not None:
            raise bad_request(issue.message, param=issue.param, code="invalid_input")
        lifted = lift(body)
        return ResponsesView(lifted, lifted.chat_body(body))


RESPONSES = ResponsesFormat()
